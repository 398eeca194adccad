"""Memory floor under the public benchmarks' L2 flush: ``python -m fp4ref.kernels.bench floor``.

The public benchmarks (FlashInfer-Bench, SOL-ExecBench) flush L2 before every timed call by WRITING a buffer of twice
the L2 size.
That leaves L2 full of dirty lines, so a kernel that then reads its operands may also pay for writing those lines
back to HBM. This benchmark measures what reading an operand costs after such a flush, i.e. the floor any kernel
(ours or cuBLAS) meets at small M, where the GEMMs only stream their weight operand:

* ``read``: a Triton kernel (the fastest of several launch shapes) that reads the bytes once (16-byte vector
  loads, one int32 partial per program, so nothing is optimised away) — after the write flush
  (``_bench.flush_l2_cache``, which leaves dirty lines as the public method does) and after a read-only flush (a
  max-reduction over the buffer, which leaves clean lines);
* the peers the small-M rows are compared with (cuBLAS at M = 1, or 16 where _scaled_mm needs it), under both
  flushes.

Columns: CUPTI GPU time (``_bench.time_gpu``: write flush, the reported method), GPU time from CUDA-graph replays
under the read-only flush (``_bench.gpu_time_graph``: graph of reps x (flush, call) minus graph of reps x flush),
and the CUDA-event time (write flush).

``--tiles``: the floors of gemm_fp16's swap-AB Gluon tiling at mid M (``--m``; the workload's N = 3072, K = 2048),
where the whole GEMM no longer only streams B: ``swapab_floor_kernel`` is the Gluon kernel's pipeline (the same
grid, TMA boxes, ring depth and epilogue store of the table's ``GluonConfig`` for M) with its wgmma removed (``read``:
every CTA still moves its B tile and its M tile of A through the ring, so A is read once per N tile, mostly from
L2) or with its refills removed (``mma``: the ring is filled once and the wgmmas run over it, every byte from shared
memory); ``read + mma`` is both, the Gluon kernel's own work, and must give gemm_fp16's bits. Beside them gemm_fp16
itself and cuBLAS (torch.matmul), all CUPTI (write flush), and the bytes the tiling moves from L2 into shared
memory per call, in all and per CTA (one CTA per SM): whether the read is bound by the L2 as a whole or by what one SM
takes in.
"""
from __future__ import annotations

import argparse
import json

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ._gluon import store_layout, store_or_reduce
from .gemm_fp16.gluon import issue_stage_loads

__all__ = ["main", "swapab_floor_kernel", "swapab_floor_launch"]


@triton.jit
def _read_kernel(src, partial, n_words, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK * STEPS + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for s in range(STEPS):
        o = offs + s * BLOCK
        acc ^= tl.load(src + o, mask=o < n_words, other=0)
    tl.store(partial + pid, tl.sum(acc, axis=0))


@gluon.jit(do_not_specialize=["M"])
def swapab_floor_kernel(
    b_desc, a_desc, a2_desc, c_ptr, M, N, k_tiles,  # as gemm_swapab_kernel's (one K slice: no workspace)
    BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_M_LO: gl.constexpr, BLOCK_K: gl.constexpr,
    STAGES: gl.constexpr, READ: gl.constexpr, MMA: gl.constexpr, num_warps: gl.constexpr,
):
    """gemm_fp16's swap-AB Gluon kernel (SPLIT_K 1, no WARP_SPEC / CLUSTER) with READ: every K tile moved
    through the TMA ring, MMA: the wgmmas (without READ over the ring as its first fill left it), and the same
    epilogue store (zeros without MMA). Its wgmma loop and A box placement are the Gluon kernel's."""
    BM_HI: gl.constexpr = BLOCK_M - BLOCK_M_LO
    pid_n = gl.program_id(0)
    pid_m = gl.program_id(2)
    off_n = pid_n * BLOCK_N
    m_own = pid_m * BLOCK_M
    off_m = gl.minimum(m_own, gl.maximum(M - BLOCK_M, 0))
    nk = k_tiles
    gl.assume(nk >= 1)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM_HI, BLOCK_K], a_desc.layout)
    if BLOCK_M_LO > 0:
        a2_bufs = gl.allocate_shared_memory(a2_desc.dtype, [STAGES, BLOCK_M_LO, BLOCK_K], a2_desc.layout)
    else:
        a2_desc = None
        a2_bufs = None
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    # READ: the Gluon kernel's prologue (STAGES - 1 slots); MMA alone: every slot once, all landed before the loop
    FILL: gl.constexpr = STAGES - 1 if READ else STAGES
    for i in gl.static_range(FILL):
        if i < nk:
            issue_stage_loads(b_desc, a_desc, b_bufs, a_bufs, bars, i, off_n, off_m, i * BLOCK_K, a2_desc, a2_bufs)
    if not READ:
        for i in gl.static_range(STAGES):
            if i < nk:
                mbarrier.wait(bars.index(i), 0)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BM_HI, 16])
    acc = gl.zeros([BLOCK_N, BM_HI], gl.float32, layout=acc_layout)
    if BLOCK_M_LO > 0:
        lo_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                            instr_shape=[16, BLOCK_M_LO, 16])
        acc_lo = gl.zeros([BLOCK_N, BLOCK_M_LO], gl.float32, layout=lo_layout)
    for i in range(nk):
        slot = i % STAGES
        if READ:
            mbarrier.wait(bars.index(slot), (i // STAGES) & 1)
        if MMA:
            acc = warpgroup_mma(b_bufs.index(slot), a_bufs.index(slot).permute((1, 0)), acc, is_async=True)
            if BLOCK_M_LO > 0:
                acc_lo = warpgroup_mma(b_bufs.index(slot), a2_bufs.index(slot).permute((1, 0)), acc_lo,
                                       is_async=True)
                acc, acc_lo = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_lo))
            else:
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            if num_warps > 4:
                gl.thread_barrier()
        if READ:
            j = i + STAGES - 1
            if j < nk:
                issue_stage_loads(b_desc, a_desc, b_bufs, a_bufs, bars, j % STAGES, off_n, off_m, j * BLOCK_K, a2_desc,
                                  a2_bufs)
    if MMA:
        if BLOCK_M_LO > 0:
            acc, acc_lo = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_lo))
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    part = gl.convert_layout(acc, store_layout(BLOCK_N, BM_HI, num_warps))
    store_or_reduce(part, c_ptr, c_ptr, c_ptr, M, N, N, off_n, off_m, m_own, 0, 0, 1.0, BLOCK_N, BM_HI, 1, False,
                    num_warps)
    if BLOCK_M_LO > 0:
        part = gl.convert_layout(acc_lo, store_layout(BLOCK_N, BLOCK_M_LO, num_warps))
        store_or_reduce(part, c_ptr, c_ptr, c_ptr, M, N, N, off_n, off_m + BM_HI, m_own, 0, 0, 1.0, BLOCK_N,
                        BLOCK_M_LO, 1, False, num_warps)


def swapab_floor_launch(config, M: int, N: int, K: int, read: bool, mma: bool):
    """The ``_runtime.Launch`` of ``swapab_floor_kernel`` for gemm_fp16's ``config`` (a GluonConfig of SPLIT_K 1,
    without WARP_SPEC or CLUSTER) at M x N x K (contiguous A [M, K], B [N, K]); call ``launch(stream, B, A, A, C,
    M, N, ceil(K / BLOCK_K))``.

    Raises:
        ValueError: a config the floor kernel does not model, or neither ``read`` nor ``mma``."""
    from ._runtime import Desc, Launch
    from .gemm_fp16 import GluonConfig
    from .gemm_fp16.gluon import m_parts, operand_layouts

    if not isinstance(config, GluonConfig) or config.SPLIT_K != 1 or config.WARP_SPEC or config.CLUSTER:
        raise ValueError(f"config={config}: the floor kernel models a GluonConfig of SPLIT_K 1 without WARP_SPEC or "
                         "CLUSTER")
    if not (read or mma):
        raise ValueError("read and mma are both False: nothing to time")
    BN, BM, BK = config.BLOCK_N, config.BLOCK_M, config.BLOCK_K
    b_layout, a_layout, a2_layout = operand_layouts(config)
    descs = (Desc((N, K), (K, 1), (BN, BK), b_layout), *Desc.parts((M, K), (K, 1), (BM, BK), 0, (a_layout, a2_layout)))
    constexprs = dict(BLOCK_N=BN, BLOCK_M=BM, BLOCK_M_LO=m_parts(BM)[1], BLOCK_K=BK, STAGES=config.STAGES,
                      READ=read, MMA=mma, num_warps=config.num_warps)
    return Launch(swapab_floor_kernel, (-(-N // BN), 1, -(-M // BM)), constexprs, descs=descs)


def _tile_floors(ms, json_path: str | None) -> int:
    """``--tiles``: the table of the swap-AB tiling's floors at each M of ``ms`` (module docstring)."""
    import torch

    from . import _runtime
    from ._bench import print_table, time_gpu
    from .gemm_fp16 import GluonConfig, gemm_fp16, pick_config

    N, K = 3072, 2048
    rows, rec, bad = [], [], []
    for M in ms:
        config = pick_config(M, N, K)
        if not isinstance(config, GluonConfig) or config.SPLIT_K != 1 or config.WARP_SPEC or config.CLUSTER:
            print(f"--tiles: M={M}: the table's config {config} is not a one-slice swap-AB GluonConfig; skipped")
            continue
        A = torch.randn(M, K, dtype=torch.float16, device="cuda")
        B = torch.randn(N, K, dtype=torch.float16, device="cuda")
        ours = gemm_fp16(A, B)
        stream = _runtime.current_stream(A.device)
        k_tiles = -(-K // config.BLOCK_K)
        times = {}
        for name, read, mma in (("read", True, False), ("mma", False, True), ("read + mma", True, True)):
            launch = swapab_floor_launch(config, M, N, K, read, mma)
            C = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")

            def call(launch=launch, C=C):
                launch.launch(stream, B, A, A, C, M, N, k_tiles)

            call()
            torch.cuda.synchronize()
            if read and mma and not torch.equal(C.view(torch.int16), ours.view(torch.int16)):
                bad.append(M)
            times[name] = time_gpu(call).cupti_us
        t_ours = time_gpu(lambda: gemm_fp16(A, B)).cupti_us
        t_cublas = time_gpu(lambda: torch.matmul(A, B.T)).cupti_us
        ctas = -(-N // config.BLOCK_N) * -(-M // config.BLOCK_M)
        l2_mb = ctas * k_tiles * (config.BLOCK_N + config.BLOCK_M) * config.BLOCK_K * 2 / 1e6
        rows.append([M, str(config), t_ours, times["read"], times["mma"], times["read + mma"], t_cublas, ctas, l2_mb,
                     l2_mb / times["read"], 1e3 * l2_mb / ctas / times["read"]])
        rec.append(dict(M=M, config=str(config), gemm_fp16_us=t_ours, read_us=times["read"], mma_us=times["mma"],
                        read_mma_us=times["read + mma"], cublas_us=t_cublas, ctas=ctas, l2_to_sm_mb=l2_mb))
    print_table(f"gemm_fp16 swap-AB tiling floors, N = {N}, K = {K}, on {torch.cuda.get_device_name()} (CUPTI us, "
                "L2 write-flushed before every call; L2->SM MB: the boxes the CTAs load per call)",
                ["M", "config", "gemm_fp16", "read", "mma", "read + mma", "cuBLAS", "CTAs", "L2->SM MB",
                 "read TB/s", "read GB/s per CTA"], rows, markdown=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rec, f, indent=1)
    if bad:
        print(f"--tiles: read + mma gave other bits than gemm_fp16 at M = {bad}: the floor kernel is not the Gluon "
              "kernel's pipeline there")
        return 1
    print("--tiles: read + mma gave gemm_fp16's bits at every M")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp4ref.kernels.bench floor", description=__doc__.split("\n")[0])
    p.add_argument("--json", help="also write the numbers to this JSON file")
    p.add_argument("--tiles", action="store_true", help="only the floors of gemm_fp16's swap-AB tiling at --m")
    p.add_argument("--m", type=int, nargs="+", default=[64, 128, 160, 192, 256],
                   help="M values of --tiles (each served by a one-slice swap-AB GluonConfig; default: one per "
                        "table row from 64 to 256)")
    args = p.parse_args(argv)
    if args.tiles and not all(3 <= m <= 256 for m in args.m):
        p.error(f"--m {args.m}: --tiles takes M in 3 .. 256 (the swap-AB Gluon path's sizes)")

    import torch

    from fp4ref.kernels._bench import gpu_time_graph, l2_flush_buffer, print_table, time_gpu

    if not torch.cuda.is_available():
        print("floor benchmark: needs a CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    if args.tiles:
        return _tile_floors(args.m, args.json)
    flush = l2_flush_buffer()
    flush_words = flush.view(torch.int32)

    def read_flush():
        flush_words.max()  # reads every byte, writes one word: L2 is left full of clean lines

    operands = {  # name -> bytes read at small M
        "gemm_fp16 B (3072x2048 fp16)": 3072 * 2048 * 2,
        "sparse b (2048x2048 e4m3)": 2048 * 2048,
        "nvfp4 W codes + scales (8192x8192)": 8192 * 4096 + 8192 * 512,
    }
    rows, rec = [], []
    # (words per program per step, steps, warps): from many small programs to few long ones; the best is reported
    shapes = [(1024, 1, 4), (2048, 1, 4), (2048, 1, 8), (4096, 1, 8), (1024, 4, 4), (2048, 4, 8), (1024, 16, 4)]
    for name, nbytes in operands.items():
        src = torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), dtype=torch.int32, device="cuda")
        best = None
        for block, steps, warps in shapes:
            grid = (triton.cdiv(src.numel(), block * steps),)
            partial = torch.empty(grid[0], dtype=torch.int32, device="cuda")

            def call(grid=grid, partial=partial, block=block, steps=steps, warps=warps):
                _read_kernel[grid](src, partial, src.numel(), BLOCK=block, STEPS=steps, num_warps=warps)

            tw = time_gpu(call).cupti_us
            if best is None or tw < best[0]:
                best = (tw, call, f"{block}x{steps}/w{warps}")
        tw, call, shape = best
        tr = gpu_time_graph(call, flush=read_flush)
        te = time_gpu(call).event_us
        rows.append([f"{name} [read {shape}]", nbytes / 1e6, tw, tr, te, nbytes / tw / 1e3, nbytes / tr / 1e3])
        rec.append(dict(operand=name, bytes=nbytes, read_kernel=shape, gpu_us_write_flush=tw,
                        gpu_us_read_flush=tr, event_us=te))
    # the peers the small-M rows are compared with, M = 1, same flushes
    a16 = torch.randn(1, 2048, dtype=torch.float16, device="cuda")
    b16 = torch.randn(3072, 2048, dtype=torch.float16, device="cuda")
    a8 = torch.randn(16, 2048, device="cuda").to(torch.float8_e4m3fn)  # _scaled_mm wants M % 16 == 0
    b8 = torch.randn(2048, 2048, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32, device="cuda")
    xbf = torch.randn(1, 8192, dtype=torch.bfloat16, device="cuda")
    wbf = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    peers = [
        ("torch.matmul fp16 M=1 N=3072 K=2048 (gemm_fp16 peer)", 3072 * 2048 * 2, lambda: torch.matmul(a16, b16.T)),
        ("torch._scaled_mm fp8 M=16 N=K=2048 (sparse peer)", 2048 * 2048,
         lambda: torch._scaled_mm(a8, b8.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)),
        ("torch.matmul bf16 M=1 N=K=8192 (nvfp4 peer b)", 8192 * 8192 * 2, lambda: torch.matmul(xbf, wbf.T)),
    ]
    for name, nbytes, call in peers:
        t = time_gpu(call)
        tw, tr, te = t.cupti_us, gpu_time_graph(call, flush=read_flush), t.event_us
        rows.append([name, nbytes / 1e6, tw, tr, te, nbytes / tw / 1e3, nbytes / tr / 1e3])
        rec.append(dict(operand=name, bytes=nbytes, gpu_us_write_flush=tw, gpu_us_read_flush=tr, event_us=te))
    print_table(f"read floor after the L2 flush on {torch.cuda.get_device_name()} (us; GB/s = bytes / GPU time; "
                "the read kernel's best launch shape of several)",
                ["what", "MB read", "CUPTI us, write flush", "graph GPU us, read flush", "event us, write flush",
                 "GB/s write flush", "GB/s read flush"], rows, markdown=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rec, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
