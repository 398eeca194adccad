"""Host time per call of the three kernels' launch paths, beside cuBLAS: ``python -m fp4ref.kernels.bench host``.

What the runtime's direct launches (kernels/_runtime.py) are for: at small M a call's GPU work is a few
microseconds, so the host time of a call decides its event time. For each kernel at a small M this measures, in
one run, four ways of launching the same compiled kernels (bitwise the same outputs):

* ``jit``: every call through Triton's JIT (argument binding and specialisation in Python);
* ``triton``: the kept CompiledKernel through Triton's ``ck.run`` (re-encodes TMA descriptors every call);
* ``direct``: the kept kernel through Triton's C launch function (the runtime's default, FAST_LAUNCH);
* ``graph``: a CUDA graph of one call, replayed;

and the peer (torch.matmul / torch._scaled_mm) the same way (plain call and graph). Columns: host us per call
(wall clock of 200 back-to-back calls without synchronising, divided by 200: the CPU's cost of a call while
the GPU keeps up), event us per call without an L2 flush (back-to-back calls; the larger of host and GPU time),
and CUPTI GPU us (L2 flushed, ``_bench.time_gpu``).
"""
from __future__ import annotations

import argparse

__all__ = ["main"]


def _graph_of(fn):
    import torch

    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def _cases(m: int):
    import numpy as np
    import torch

    from fp4ref import packing

    from .gemm_fp16 import gemm_fp16
    from .nvfp4_linear import nvfp4_linear
    from .sparse_gemm_fp4_fp8 import sparse_gemm_fp4_fp8

    g = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(m, 2048, device="cuda", generator=g).half()
    B = torch.randn(3072, 2048, device="cuda", generator=g).half()
    vals = torch.randint(-128, 128, (m, 512), device="cuda", dtype=torch.int8, generator=g)
    meta = torch.randint(-128, 128, (m, 512), device="cuda", dtype=torch.int8, generator=g)
    b8 = torch.randn(2048, 2048, device="cuda", generator=g).to(torch.float8_e4m3fn)
    a8 = torch.randn(m, 2048, device="cuda", generator=g).to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    x = torch.randn(m, 8192, device="cuda", generator=g).bfloat16()
    rng = np.random.default_rng(0)
    w = torch.from_numpy(packing.pack_fp4(rng.integers(0, 16, (8192, 8192), dtype=np.uint8))).cuda()
    ws = torch.from_numpy(rng.integers(0x20, 0x40, (8192, 512), dtype=np.uint8)).cuda()
    wd = torch.randn(8192, 8192, device="cuda", generator=g).bfloat16()
    return [
        ("gemm_fp16", lambda: gemm_fp16(A, B), "torch.matmul", lambda: A @ B.T),
        ("sparse_gemm_fp4_fp8", lambda: sparse_gemm_fp4_fp8(vals, meta, b8), "torch._scaled_mm",
         lambda: torch._scaled_mm(a8, b8.T, one, one, out_dtype=torch.bfloat16)),
        ("nvfp4_linear", lambda: nvfp4_linear(x, w, ws, 0.01), "torch.matmul bf16", lambda: x @ wd.T),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp4ref.kernels.bench host", description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, default=16, help="rows of the activation operand (default 16)")
    p.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = p.parse_args(argv)
    if args.m < 1:
        p.error(f"--m={args.m}: expected >= 1")
    import torch

    from . import _bench
    from . import _runtime as rt

    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    rows = []
    for name, fn, peer_name, peer in _cases(args.m):
        want = fn().clone()
        for mode in ("jit", "triton", "direct", "graph"):
            rt.clear_plans()
            rt._KEEP_COMPILED = mode != "jit"
            rt.FAST_LAUNCH = mode in ("direct", "graph")
            try:
                call = _graph_of(fn) if mode == "graph" else fn
                host = _bench.host_us_per_call(call)
                ev = _bench.time_cuda(call, flush_l2=False)
                t = _bench.time_gpu(call)
                same = "yes" if mode == "graph" or torch.equal(fn().view(torch.int16), want.view(torch.int16)) else "NO"
            finally:
                rt._KEEP_COMPILED, rt.FAST_LAUNCH = True, True
            rows.append((name, args.m, mode, host, ev, t.cupti_us, same))
        for mode in ("call", "graph"):
            call = _graph_of(peer) if mode == "graph" else peer
            rows.append((peer_name, args.m, mode, _bench.host_us_per_call(call), _bench.time_cuda(call, flush_l2=False),
                         _bench.time_gpu(call).cupti_us, ""))
    _bench.print_table(f"Host time per call ({torch.cuda.get_device_name()})",
                       ["kernel", "M", "launch", "host us", "event us (no flush)", "CUPTI us", "same bytes"], rows,
                       markdown=args.markdown)
    return 0
