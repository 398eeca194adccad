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
where the whole GEMM no longer only streams B: the Gluon kernel itself (the table's ``GluonConfig`` for M: the same
grid, TMA boxes, ring depth and epilogue store) built with its FLOOR switch, which removes its wgmmas (``read``:
every CTA still moves its B tile and its M tile of A through the ring, so A is read once per N tile, mostly from
L2) or its refills (``mma``: the ring is filled once and the wgmmas run over it, every byte from shared memory);
``read + mma`` is the kernel as gemm_fp16 launches it, and must give gemm_fp16's bits. Beside them gemm_fp16
itself and cuBLAS (torch.matmul), all CUPTI (write flush), and the bytes the tiling moves from L2 into shared
memory per call, in all and per CTA (one CTA per SM): whether the read is bound by the L2 as a whole or by what one SM
takes in.
"""
from __future__ import annotations

import argparse
import json

import triton
import triton.language as tl

__all__ = ["FLOORS", "main", "swapab_floor_launch"]


@triton.jit
def _read_kernel(src, partial, n_words, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK * STEPS + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for s in range(STEPS):
        o = offs + s * BLOCK
        acc ^= tl.load(src + o, mask=o < n_words, other=0)
    tl.store(partial + pid, tl.sum(acc, axis=0))


#: ``--tiles`` variants: name -> gemm_swapab_kernel's FLOOR (0: the GEMM itself)
FLOORS = {"read": 1, "mma": 2, "read + mma": 0}


def swapab_floor_launch(config, M: int, N: int, K: int, floor: int):
    """The ``_runtime.Launch`` of gemm_fp16's swap-AB Gluon kernel for ``config`` (a GluonConfig of SPLIT_K 1,
    without WARP_SPEC or CLUSTER) at M x N x K (contiguous A [M, K], B [N, K]) with FLOOR = ``floor`` (``FLOORS``);
    call ``launch(stream, B, A, A, C, *unused_scratch, M, N, ceil(K / BLOCK_K), N)``.

    Raises:
        ValueError: a config the floor runs do not take, or a ``floor`` not in ``FLOORS``."""
    from ._runtime import Desc, Launch
    from .gemm_fp16 import GluonConfig
    from .gemm_fp16.gluon import gemm_swapab_kernel, gluon_constexprs, operand_layouts

    if not isinstance(config, GluonConfig) or config.SPLIT_K != 1 or config.WARP_SPEC or config.CLUSTER:
        raise ValueError(f"config={config}: the floor runs take a GluonConfig of SPLIT_K 1 without WARP_SPEC or "
                         "CLUSTER")
    if floor not in FLOORS.values():
        raise ValueError(f"floor={floor!r}: expected one of {sorted(FLOORS.values())} ({FLOORS})")
    BN, BM, BK = config.BLOCK_N, config.BLOCK_M, config.BLOCK_K
    b_layout, a_layout, a2_layout = operand_layouts(config)
    descs = (Desc((N, K), (K, 1), (BN, BK), b_layout), *Desc.parts((M, K), (K, 1), (BM, BK), 0, (a_layout, a2_layout)))
    return Launch(gemm_swapab_kernel, (-(-N // BN), 1, -(-M // BM)), {**gluon_constexprs(config, K), "FLOOR": floor},
                  descs=descs)


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
        ws, cnt = _runtime.unused_scratch(A.device)
        for name, floor in FLOORS.items():
            launch = swapab_floor_launch(config, M, N, K, floor)
            C = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")

            def call(launch=launch, C=C):
                launch.launch(stream, B, A, A, C, ws, cnt, M, N, k_tiles, N)

            call()
            torch.cuda.synchronize()
            if floor == 0 and not torch.equal(C.view(torch.int16), ours.view(torch.int16)):
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
        print(f"--tiles: the read + mma launch gave other bits than gemm_fp16 at M = {bad}: it is not gemm_fp16's "
              "launch there")
        return 1
    print("--tiles: the read + mma launch gave gemm_fp16's bits at every M")
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
