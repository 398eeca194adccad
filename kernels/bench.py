"""Benchmark dispatcher: ``python -m fp4ref.kernels.bench NAME [options]``.

NAME selects a benchmark module (a kernel package's ``bench``), which exposes ``main(argv: list[str]) -> int``;
the remaining arguments are passed to it. Each benchmark times the kernel and its peer in the same run with
``fp4ref.kernels._bench.time_gpu`` (CUPTI GPU time and CUDA-event time; L2 flushed before every call, 10 warm-up +
50 timed calls, median) and prints a table. ``python -m fp4ref.kernels.bench --list`` lists the names.
"""
from __future__ import annotations

import importlib
import sys

__all__ = ["BENCHMARKS", "main"]

# name -> module (relative to this package). Owners: gemm_fp16 (dense fp16 GEMM), sparse_gemm_fp4_fp8
# (2:4 sparse FP4 x FP8 GEMM), nvfp4_linear (NVFP4 linear layer), floor (what reading an operand costs after
# the L2 flush), host (host time per call of each launch path).
BENCHMARKS = {
    "gemm_fp16": ".gemm_fp16.bench",
    "sparse_gemm_fp4_fp8": ".sparse_gemm_fp4_fp8.bench",
    "nvfp4_linear": ".nvfp4_linear.bench",
    "floor": ".bench_floor",
    "host": ".bench_host",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(__doc__.strip())
        print("\nbenchmarks: " + ", ".join(BENCHMARKS))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"unknown benchmark NAME={name!r}; expected one of {sorted(BENCHMARKS)}", file=sys.stderr)
        return 2
    package = __package__ or "fp4ref.kernels"
    module = importlib.import_module(BENCHMARKS[name], package=package)
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
