"""A recording stand-in for a compiled Triton kernel and its C launcher, for testing kernels/_runtime.py.

``fake_compiled_kernel(monkeypatch, sig)`` builds, on Triton's REAL launcher wrapper
(``triton.backends.nvidia.driver.wrap_handle_tensordesc``), a CompiledKernel-shaped object whose C launch function
records its arguments (``calls``) and whose tensor-map encoder records the pointers it encodes (``encoded``), so a
test can compare what the cached-descriptor launch (RawLauncher) passes with what Triton's own path (``ck.run``)
passes. Skips the test where this Triton's launcher has another shape (the fast paths then turn themselves off).
"""
from __future__ import annotations

import functools
import types

import pytest


def fake_compiled_kernel(monkeypatch, sig: dict):
    """(ck, calls, encoded) for a kernel of signature ``sig`` (name -> Triton type string, in parameter order;
    'tensordesc<...>' entries are host descriptors)."""
    drv = pytest.importorskip("triton.backends.nvidia.driver")
    if not hasattr(drv, "wrap_handle_tensordesc") or not hasattr(drv, "make_tensordesc_arg"):
        pytest.skip("this Triton's launcher has another shape (the fast path then turns itself off)")
    encoded: list = []

    def fake_encode(arg, meta):  # stands in for fill_tma_descriptor: a value that names pointer and block
        encoded.append(arg.base.data_ptr())
        return [("map", arg.base.data_ptr(), tuple(arg.block_shape)), *arg.shape, *arg.strides]

    monkeypatch.setattr(drv, "make_tensordesc_arg", fake_encode)
    calls: list = []

    def record(*a):  # the C launcher: pointers as the C code reads them (an int as is, else data_ptr())
        calls.append(tuple(x.data_ptr() if hasattr(x, "data_ptr") else x for x in a))

    n_desc = sum(str(t).startswith("tensordesc") for t in sig.values())
    tmeta = [{} for _ in range(n_desc)]
    # no descriptor: Triton's launch IS the C function (a builtin, no __code__); a partial has none either
    inner = drv.wrap_handle_tensordesc(functools.partial(record), sig, tmeta)

    class Run:  # the shape of triton's CudaLauncher that RawLauncher relies on
        global_scratch_size = profile_scratch_size = 0
        num_ctas = 1
        launch_cooperative_grid = launch_pdl = False

        def __init__(self):
            self.launch = inner

        def __call__(self, gx, gy, gz, stream, function, *args):
            self.launch(gx, gy, gz, stream, function, False, False, None, None, *args)

    ck = types.SimpleNamespace(run=Run(), metadata=types.SimpleNamespace(tensordesc_meta=tmeta), function=7,
                               packed_metadata=(1,), launch_metadata=lambda *a: None)  # fmt: skip
    return ck, calls, encoded
