"""NVFP4 quantization benchmark: fp4ref.blockscale.nvfp4_quantize against ml_dtypes' ``astype(float4_e2m1fn)``.

Run ``python -m fp4ref.bench.quantize`` (default an 8192 x 8192 float32 ``randn`` array, best of 3). Not a test: it
prints a Markdown table (ours vs peer, same run, ratio) for docs/benchmarks.md. Target (issue 3): nvfp4_quantize
within 2x of the time of ml_dtypes' plain E2M1 cast of the same array (which computes no scales at all: it is the
floor of what a numpy-speed quantizer can cost).

Peak memory is measured in a separate, untimed call with ``tracemalloc`` (numpy reports its allocations to it): the
peak of Python-visible allocations during the call, output included, input excluded.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import tracemalloc

import ml_dtypes
import numpy as np

from .codecs import machine_line
from ..blockscale import NVFP4Recipe, nvfp4_quantize


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
        del out
    return best


def _peak_mb(fn) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        out = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del out
    return peak / 2**20


def run(rows: int, cols: int, recipes, repeat: int, seed: int):
    """Per recipe: (recipe, best fp4ref time, fp4ref peak MiB, best peer time, peer peak MiB). The peer is timed
    interleaved with each recipe (peer, ours, peer, ours, ...) so that a change in machine load hits both."""
    x = np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)
    peer = lambda: x.astype(ml_dtypes.float4_e2m1fn)  # noqa: E731
    m_peer = _peak_mb(peer)
    out = []
    for r in recipes:
        fn = lambda r=r: nvfp4_quantize(x, recipe=r)  # noqa: E731
        t_ours = t_peer = float("inf")
        for _ in range(repeat):
            t_peer = min(t_peer, _best(peer, 1))
            t_ours = min(t_ours, _best(fn, 1))
        out.append((r, t_ours, _peak_mb(fn), t_peer, m_peer))
    return out, x.nbytes / 2**20


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def format_table(results, n: int) -> str:
    lines = [
        "| recipe | fp4ref nvfp4_quantize (s) | ml_dtypes astype(float4_e2m1fn) (s) | ratio | fp4ref (M values/s) "
        "| fp4ref peak (MiB) | ml_dtypes peak (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r, t, m, tp, mp in results:
        lines.append(f"| {r} | {t:.3f} | {tp:.3f} | {t / tp:.2f} | {n / t / 1e6:.0f} | {m:.0f} | {mp:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Print the NVFP4 quantization benchmark table. Returns 0."""
    p = argparse.ArgumentParser(prog="python -m fp4ref.bench.quantize", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--cols", type=int, default=8192, help="K, a multiple of 16")
    p.add_argument("--recipes", default=",".join(r.value for r in NVFP4Recipe),
                   help="comma-separated recipes (default all)")
    p.add_argument("--repeat", type=int, default=3, help="timed repetitions; the best is reported (default 3)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.seed < 0:
        p.error(f"--seed {args.seed}: expected >= 0")
    if args.rows < 1 or args.cols < 16 or args.cols % 16:
        p.error(f"need --rows >= 1 and --cols a positive multiple of 16, got {args.rows} x {args.cols}")
    if args.repeat < 1:
        p.error(f"--repeat must be positive, got {args.repeat}")
    recipes = [s.strip() for s in args.recipes.split(",") if s.strip()]
    for r in recipes:
        if r not in [v.value for v in NVFP4Recipe]:
            p.error(f"unknown recipe {r!r}; expected some of {[v.value for v in NVFP4Recipe]}")
    results, input_mb = run(args.rows, args.cols, recipes, args.repeat, args.seed)
    cmd = "python -m fp4ref.bench.quantize" + ("" if argv is None and len(sys.argv) <= 1 else
                                               " " + " ".join(sys.argv[1:] if argv is None else argv))
    print(f"Command: `{cmd}`")
    print(f"Machine: {machine_line()}; {_cpu_model()}; load average {os.getloadavg()[0]:.1f} at start")
    print(f"float32 randn [{args.rows}, {args.cols}] ({input_mb:.0f} MiB input), best of {args.repeat}; "
          "ratio = fp4ref / ml_dtypes (target <= 2).\n")
    print(format_table(results, args.rows * args.cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
