"""Test session set-up.

* Kernels run in the Triton CPU interpreter unless a CUDA GPU is present. TRITON_INTERPRET must be set before any
  @triton.jit module is imported, so it is set here, first.
* From a source checkout that was not installed, ``fp4ref.kernels`` (which lives in the top-level ``kernels/``
  directory and is mapped there by pyproject's package-dir) is registered by hand so plain ``pytest`` works
  (not where torch or triton is missing: it needs both).
* Once fp4ref is imported, the checkout's root moves to the end of sys.path: at the front, ``kernels/`` would
  shadow the top-level ``kernels`` distribution (Hugging Face's, which transformers imports;
  tests/test_compressed_tensors_conformance.py imports it at collection); at the end, ``tests`` (the package of
  helper modules such as tests._verify_kernels) stays importable.
* Hypothesis profiles: ``ci`` (default, modest example counts) and ``thorough`` (HYPOTHESIS_PROFILE=thorough).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

if "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "0" if shutil.which("nvidia-smi") else "1"

_ROOT = Path(__file__).resolve().parent.parent


def _register_kernels_package() -> None:
    import fp4ref

    if "fp4ref.kernels" in sys.modules or importlib.util.find_spec("fp4ref.kernels") is not None:
        return
    init = _ROOT / "kernels" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "fp4ref.kernels", init, submodule_search_locations=[str(init.parent)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["fp4ref.kernels"] = module
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError:  # no torch / triton here: the kernel tests skip, the library's still run
        del sys.modules["fp4ref.kernels"]
        return
    fp4ref.kernels = module


_register_kernels_package()
# (pyproject's pythonpath and `python -m pytest` put the root first; fp4ref's own imports go through fp4ref.__path__)
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _ROOT] + [str(_ROOT)]

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
