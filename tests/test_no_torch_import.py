"""fp4ref (pure numpy + ml_dtypes) never imports torch or triton (README).

Each check runs in a fresh interpreter (this test session may already have imported torch through the kernels
tests). Submodules are enumerated with pkgutil, so a new module is covered without editing this file. Excluded:
``fp4ref.kernels`` (the Triton package mapped from kernels/) - and nothing else; the CLI's kernel-verification path
imports torch only inside the ``verify`` command, so importing ``fp4ref.cli`` and ``fp4ref.verify`` must not.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("torch", "triton")
EXCLUDED_PREFIXES = ("fp4ref.kernels",)

_CHECK = r"""
import importlib, json, pkgutil, sys
forbidden = json.loads(sys.argv[1])
excluded = tuple(json.loads(sys.argv[2]))
run_cli = json.loads(sys.argv[3])

def leaked():
    return sorted(m for m in sys.modules if m.split(".")[0] in forbidden)

culprits = {}
import fp4ref
if leaked():
    culprits["fp4ref"] = leaked()
names = []
errors = {}
for info in pkgutil.walk_packages(fp4ref.__path__, "fp4ref.", onerror=lambda n: errors.setdefault(n, "walk")):
    if info.name.startswith(excluded):
        continue
    names.append(info.name)
for name in names:
    before = set(leaked())
    try:
        importlib.import_module(name)
    except Exception as e:  # an import error is a failure too, reported with the module
        errors[name] = repr(e)
    new = sorted(set(leaked()) - before)
    if new:
        culprits[name] = new
if run_cli:
    import contextlib, io
    from fp4ref import cli
    before = set(leaked())
    with contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(run_cli)
    new = sorted(set(leaked()) - before)
    if new:
        culprits["fp4ref.cli.main(%r)" % (run_cli,)] = new
    if rc not in (0, None):
        errors["cli"] = "exit code %r" % (rc,)
print(json.dumps({"modules": names, "culprits": culprits, "errors": errors, "leaked": leaked()}))
"""


def _run(forbidden=FORBIDDEN, excluded=EXCLUDED_PREFIXES, cli_args=None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK, json.dumps(list(forbidden)), json.dumps(list(excluded)),
         json.dumps(cli_args)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"check script failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fp4ref_and_every_submodule_import_neither_torch_nor_triton():
    res = _run()
    assert "fp4ref.formats" in res["modules"] and "fp4ref.packing" in res["modules"], res["modules"]
    assert not any(m.startswith("fp4ref.kernels") for m in res["modules"])
    assert not res["errors"], f"submodules failed to import: {res['errors']}"
    assert not res["culprits"], (
        "these imports pulled in torch/triton (import them lazily inside the function that needs them): "
        f"{res['culprits']}")
    assert res["leaked"] == []


def test_formats_command_imports_neither_torch_nor_triton():
    res = _run(cli_args=["formats"])
    assert not res["errors"], res["errors"]
    assert not res["culprits"], res["culprits"]


def test_the_check_can_fail():
    """The detector flags a dependency that fp4ref really imports (numpy), so a torch import would be caught."""
    res = _run(forbidden=("numpy",))
    assert "fp4ref" in res["culprits"] and "numpy" in res["culprits"]["fp4ref"]

