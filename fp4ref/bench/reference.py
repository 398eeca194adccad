"""Reference-GEMM speed: fp4ref.gemm against a plain numpy float64 matmul of the same shape, same run.

Run ``python -m fp4ref.bench.reference`` (the seed shapes: sparse M=64, N=K=2048; NVFP4 M=128, N=K=8192; fp16
M=256, N=3072, K=2048). Not a test: it prints a Markdown table for docs/benchmarks.md. Target (issue 4): the
reference within 3x of the float64 matmul.

Timing: ``repeat`` rounds; in each round the peer (``A64 @ B64.T`` on float64 arrays prepared beforehand, i.e.
the matmul alone) and ours (from the workload's native operands: fp16 arrays, packed bytes, bf16 activations,
including every decode, the certification and the correctly rounded output; ``|A||B|`` is lazy and timed
separately) run back to back; the table gives the median of each and the ratio of the medians. Inputs: randn-based
data as in the public benchmarks (sparse: random int8 vals/meta bytes as FlashInfer-Bench feeds them, B randn
E4M3FN; NVFP4: x randn bf16, W randn fp32 quantized with the "sol" recipe; fp16: randn).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import ml_dtypes
import numpy as np

from .. import gemm

SHAPES = {
    "sparse_gemm_fp4_fp8": (64, 2048, 2048),
    "nvfp4_linear": (128, 8192, 8192),
    "gemm_fp16": (256, 3072, 2048),
}


def _operands(name, M, N, K, rng):
    if name == "sparse_gemm_fp4_fp8":
        vals = rng.integers(-128, 128, (M, K // 4), dtype=np.int8)
        meta = rng.integers(-128, 128, (M, K // 4), dtype=np.int8)
        b = rng.standard_normal((N, K), dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)
        return (lambda: gemm.sparse_gemm_fp4_fp8(vals, meta, b)), (M, N, K)
    if name == "gemm_fp16":
        A = rng.standard_normal((M, K), dtype=np.float32).astype(np.float16)
        B = rng.standard_normal((N, K), dtype=np.float32).astype(np.float16)
        return (lambda: gemm.gemm_fp16(A, B)), (M, N, K)
    from ..blockscale import nvfp4_quantize

    wq = nvfp4_quantize(rng.standard_normal((N, K), dtype=np.float32), recipe="sol")
    x = rng.standard_normal((1, M, K), dtype=np.float32).astype(ml_dtypes.bfloat16)
    scales = wq.scales.view(ml_dtypes.float8_e4m3fn)
    gd = float(wq.global_decode_scale)
    return (lambda: gemm.nvfp4_linear(x, wq.codes, scales, gd)), (M, N, K)


def run(names=None, repeat: int = 5, seed: int = 0):
    """Time each workload; returns a list of dict rows."""
    rows = []
    for name in names or list(SHAPES):
        M, N, K = SHAPES[name]
        rng = np.random.default_rng(seed)
        ours, _ = _operands(name, M, N, K, rng)
        A64 = rng.standard_normal((M, K))
        B64 = rng.standard_normal((N, K))
        t_peer, t_ours, t_abs = [], [], []
        ref = ours()  # warm-up (tables, page faults)
        _ = A64 @ B64.T
        for _ in range(repeat):
            t0 = time.perf_counter()
            c = A64 @ B64.T
            t_peer.append(time.perf_counter() - t0)
            del c
            t0 = time.perf_counter()
            ref = ours()
            t_ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            _ = ref.absprod
            t_abs.append(time.perf_counter() - t0)
        rows.append({
            "workload": name, "M": M, "N": N, "K": K,
            "peer_ms": 1e3 * statistics.median(t_peer), "ours_ms": 1e3 * statistics.median(t_ours),
            "absprod_ms": 1e3 * statistics.median(t_abs),
            "exact_path": ref.description.get("elements_recomputed_exactly", 0),
        })
    return rows


def format_table(rows) -> str:
    lines = [
        "| workload | M | N | K | numpy float64 matmul (ms) | fp4ref reference (ms) | ratio "
        "| + lazy abs-product (ms) | elements via exact integer path |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['M']} | {r['N']} | {r['K']} | {r['peer_ms']:.1f} | {r['ours_ms']:.1f} | "
            f"{r['ours_ms'] / r['peer_ms']:.2f}x | {r['absprod_ms']:.1f} | {r['exact_path']} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp4ref.bench.reference", description=__doc__.splitlines()[0])
    p.add_argument("--workload", action="append", choices=list(SHAPES), help="default: all three")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.seed < 0:
        p.error(f"--seed {args.seed}: expected >= 0")
    if args.repeat < 1:
        p.error(f"--repeat {args.repeat}: expected >= 1")
    rows = run(args.workload, repeat=args.repeat, seed=args.seed)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
          f"numpy {np.__version__}, python {platform.python_version()}; median of {args.repeat} interleaved rounds")
    print(format_table(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
