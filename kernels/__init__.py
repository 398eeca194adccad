"""Triton kernels for the three fp4ref workloads (imports torch and triton).

Installed as ``fp4ref.kernels``. Importing it imports torch and triton (ModuleNotFoundError naming the missing one
and the ``fp4ref[kernels]`` extra); nothing else runs at import time beyond defining kernels.
"""

try:  # the kernels' dependencies are an extra: say which one is missing and how to install it
    import torch  # noqa: F401
    import triton  # noqa: F401
except ModuleNotFoundError as e:
    if (e.name or "").split(".")[0] not in ("torch", "triton"):  # a broken install, not a missing extra
        raise
    raise ModuleNotFoundError(f"fp4ref.kernels needs torch and triton ({e.name} is not installed): pip install "
                              "'fp4ref[kernels]'", name=e.name) from e
