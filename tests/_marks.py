"""pytest marks shared by the kernel test files."""
import pytest

from fp4ref.kernels import _runtime

# Tests written for the CPU interpreter (CPU tensors, which a GPU machine refuses first, or its `tl` paths).
INTERPRETER_ONLY = pytest.mark.skipif(not _runtime.interpreting(),
                                      reason="written for the CPU interpreter's tensors and paths")
