"""fp4ref (pure numpy + ml_dtypes) never imports torch or triton (README).

Each check runs in a fresh interpreter (this test session may already have imported torch through the kernels
tests). Submodules are enumerated with pkgutil, so a new module is covered without editing this file. Excluded:
``fp4ref.kernels`` (the Triton package mapped from kernels/) - and nothing else; the CLI's kernel-verification path
imports torch only inside the ``verify`` command, so importing ``fp4ref.cli`` and ``fp4ref.verify`` must not.

Without torch, triton or hypothesis (an install without the ``kernels`` extra), ``fp4ref verify`` says which is
missing and how to install it, in one line with exit status 2 (a usage error, not a failed verification); the tests
hide a module by setting it to None in ``sys.modules``, which the import system treats as not installed.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fp4ref import verify as V
from fp4ref.cli import main

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



# --------------------------------------------------------------------------------- verify without the kernels extra

INSTALL = "Install with: pip install 'fp4ref[kernels]'"
KERNELS = "verify runs the kernels, which need torch and triton"
GEMM = ["verify", "--workload", "gemm_n3072_k2048", "--sizes", "1", "--no-integrity"]


def _need(*modules):
    """Skip unless these modules are installed (the case hides another one and must get past these)."""
    for m in modules:
        if importlib.util.find_spec(m) is None:
            pytest.skip(f"needs {m}")


@pytest.mark.parametrize("hidden, argv, message", [
    (["torch", "triton"], [*GEMM, "--device", "cpu"], f"{KERNELS}; not installed: torch, triton. {INSTALL}"),
    (["torch", "triton"], GEMM, f"{KERNELS}; not installed: torch, triton. {INSTALL}"),  # no --device: cuda or cpu?
    (["torch", "triton", "hypothesis"], [*GEMM, "--families", "public", "exact_acc"],
     f"{KERNELS}, and builds the exact_acc inputs with hypothesis; not installed: torch, triton, hypothesis. "
     f"{INSTALL}"),
    (["torch"], [*GEMM, "--kernel", "tests._verify_kernels:right", "--families", "public"],  # triton not needed
     f"verify passes the operands to the kernel as torch tensors, so it needs torch; not installed: torch. "
     f"{INSTALL}"),
])
def test_verify_without_torch_says_what_to_install(monkeypatch, capsys, hidden, argv, message):
    for m in hidden:
        monkeypatch.setitem(sys.modules, m, None)
    assert main(argv) == 2
    assert capsys.readouterr().err == f"fp4ref verify: error: {message}\n"


def test_verify_without_triton_says_what_to_install(monkeypatch, capsys):
    _need("torch")
    monkeypatch.setitem(sys.modules, "triton", None)
    assert main([*GEMM, "--device", "cpu"]) == 2
    assert capsys.readouterr().err == f"fp4ref verify: error: {KERNELS}; not installed: triton. {INSTALL}\n"


def test_verify_without_hypothesis_says_what_to_install(monkeypatch, capsys):
    _need("torch", "triton")
    monkeypatch.setitem(sys.modules, "hypothesis", None)
    assert main([*GEMM, "--device", "cpu", "--families", "exact_acc"]) == 2
    assert capsys.readouterr().err == (
        "fp4ref verify: error: verify builds the exact_acc inputs with hypothesis; not installed: hypothesis. "
        f"{INSTALL} (or leave exact_acc out of --families)\n")
    V.check_dependencies(["gemm_n3072_k2048"], families=["public", "extreme"])  # no exact family: no hypothesis
    V.check_dependencies(["nvfp4_linear_n8192_k8192"])  # its families are plain numpy (exact_acc included)
    V.check_dependencies(["sparse_gemm_fp4_fp8_n2048_k2048"], families=["subnormal_b", "nan_b"])


def test_the_families_said_to_need_no_hypothesis_build_without_it():
    """Every family outside Workload.hypothesis_families builds with hypothesis hidden (a fresh interpreter, so no
    earlier import of fp4ref.strategies hides the need); each one inside it needs it."""
    code = ("import sys, json; sys.modules['hypothesis'] = None\n"
            "import numpy as np\n"
            "from fp4ref.workloads import WORKLOADS\n"
            "res = {}\n"
            "for w in WORKLOADS.values():\n"
            "    for f, make in w.families.items():\n"
            "        try:\n"
            "            make(np.random.default_rng(0), 2, 16, 64)\n"
            "            res[w.name + ':' + f] = 'built'\n"
            "        except ImportError:\n"
            "            res[w.name + ':' + f] = 'needs hypothesis'\n"
            "print(json.dumps(res))\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    from fp4ref.workloads import WORKLOADS

    want = {f"{w.name}:{f}": "needs hypothesis" if f in w.hypothesis_families else "built"
            for w in WORKLOADS.values() for f in w.families}
    assert got == want


def test_a_user_kernel_that_imports_triton_is_an_install_error_too(tmp_path, monkeypatch, capsys):
    """--kernel needs no triton from fp4ref, but a kernel that imports it gets the same one line, exit 2."""
    _need("torch")
    (tmp_path / "triton_user_kernel.py").write_text("import triton\n\n\ndef gemm(A, B):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "triton_user_kernel", raising=False)
    monkeypatch.setitem(sys.modules, "triton", None)
    assert main([*GEMM, "--device", "cpu", "--families", "public", "--kernel", "triton_user_kernel:gemm"]) == 2
    assert capsys.readouterr().err == ("fp4ref verify: error: the kernel triton_user_kernel:gemm imports triton; not "
                                       f"installed: triton. {INSTALL}\n")
    with pytest.raises(V.MissingDependency) as info:  # the library call raises it, a ModuleNotFoundError
        V.verify(["gemm_n3072_k2048"], kernel="triton_user_kernel:gemm", device="cpu", sizes=[1])
    assert isinstance(info.value, ModuleNotFoundError) and info.value.name == "triton"


def test_verify_without_torch_exits_2_without_a_traceback():
    """The command as a user runs it: one line on stderr, nothing on stdout, exit status 2."""
    hide = "import sys; sys.modules['torch'] = sys.modules['triton'] = None; import runpy; " \
           "sys.argv = ['fp4ref', 'verify', '--device', 'cpu']; runpy.run_module('fp4ref', run_name='__main__')"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-c", hide], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr == f"fp4ref verify: error: {KERNELS}; not installed: torch, triton. {INSTALL}\n"
