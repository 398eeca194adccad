"""Codec throughput benchmark: fp4ref.formats.encode / decode against ml_dtypes' ``astype`` on the same data.

Run ``python -m fp4ref.bench.codecs`` (default 64M float32 values per format, median of 5 interleaved rounds).
Not a test: it prints a Markdown table (ours vs peer, same run, ratio) for docs/benchmarks.md. The target
(issue 2) is encode within 2x of ml_dtypes' time for E2M1 and E4M3FN.

Data: ``randn * scale`` in float32 with the scale drawn per 4096-element block from a format-dependent set of powers
of two around the format's range (subnormals, normals and overflow all occur; never all zeros); UE8M0 gets
``|randn| * 2^k`` over a wide exponent range. Both libraries encode the same array with RNE. Policies are each
library's defaults, so the "same bytes" column is below 100% where they differ by design (E4M3FN/E5M2 overflow:
fp4ref saturates, ml_dtypes gives NaN/inf; UE8M0: ml_dtypes maps 0 to NaN).
"""
from __future__ import annotations

import argparse
import platform
import sys
import time

import ml_dtypes
import numpy as np

from ..formats import FORMATS, decode, encode, get_format

# ml_dtypes' type for each format (the peer)
_PEER = {
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e4m3fn": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "ue8m0": ml_dtypes.float8_e8m0fnu,
}
_BLOCK = 4096


def make_data(fmt, n: int, seed: int = 0) -> np.ndarray:
    """float32 test data for ``fmt``: randn * 2^k * max/4, k per 4096-element block (UE8M0: |randn| * 2^k)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n, dtype=np.float32)
    nblocks = -(-n // _BLOCK)
    if fmt.signed:
        lo = int(np.floor(np.log2(fmt.min_subnormal / fmt.max))) - 2  # down to below the smallest subnormal
        k = rng.integers(lo, 3, size=nblocks)
        scale = (np.ldexp(np.float32(fmt.max / 4), k)).astype(np.float32)
    else:
        np.abs(x, out=x)
        k = rng.integers(-100, 100, size=nblocks)
        scale = np.ldexp(np.float32(1.0), k).astype(np.float32)
    x *= np.repeat(scale, _BLOCK)[:n]
    return x


def _interleaved(ours, peer, repeat: int):
    """Median wall time of ``ours`` and ``peer`` over ``repeat`` rounds, the two alternating within each round (so
    both see the same machine load); also returns the last outputs."""
    t_o, t_p = [], []
    out_o = out_p = None
    for _ in range(repeat):
        out_o = None
        t0 = time.perf_counter()
        out_o = ours()
        t_o.append(time.perf_counter() - t0)
        out_p = None
        t0 = time.perf_counter()
        out_p = peer()
        t_p.append(time.perf_counter() - t0)
    return float(np.median(t_o)), float(np.median(t_p)), out_o, out_p


def run(names, n: int, repeat: int, seed: int):
    """Rows (format, op, fp4ref seconds, ml_dtypes seconds, fraction of equal outputs)."""
    rows = []
    for name in names:
        fmt = get_format(name)
        peer = _PEER[fmt.name]
        x = make_data(fmt, n, seed)
        t_ours, t_peer, codes, peer_codes = _interleaved(lambda: encode(x, fmt), lambda: x.astype(peer), repeat)
        same = float(np.count_nonzero(codes == peer_codes.view(np.uint8))) / n
        rows.append((fmt.name, "encode", t_ours, t_peer, same))
        del peer_codes
        pc = codes.view(peer)
        t_ours, t_peer, vals, peer_vals = _interleaved(lambda: decode(codes, fmt), lambda: pc.astype(np.float32),
                                                       repeat)
        same = float(np.count_nonzero((vals == peer_vals) | (np.isnan(vals) & np.isnan(peer_vals)))) / n
        rows.append((fmt.name, "decode", t_ours, t_peer, same))
        del x, codes, pc, vals, peer_vals
    return rows


def format_table(rows, n: int) -> str:
    lines = [
        "| format | op | fp4ref (s) | ml_dtypes (s) | ratio fp4ref/ml_dtypes | fp4ref (M values/s) "
        "| ml_dtypes (M values/s) | same bytes/values |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, op, t_ours, t_peer, same in rows:
        lines.append(
            f"| {name} | {op} | {t_ours:.3f} | {t_peer:.3f} | {t_ours / t_peer:.2f} | {n / t_ours / 1e6:.0f} "
            f"| {n / t_peer / 1e6:.0f} | {100 * same:.2f}% |"
        )
    return "\n".join(lines)


def machine_line() -> str:
    import os

    return (f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}, numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}")


def main(argv=None) -> int:
    """Print the encode/decode throughput table. Returns 0."""
    p = argparse.ArgumentParser(prog="python -m fp4ref.bench.codecs", description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 26, help="float32 values per format (default 64M = 2^26)")
    p.add_argument("--formats", default=",".join(FORMATS),
                   help=f"comma-separated format names (default all: {','.join(FORMATS)})")
    p.add_argument("--repeat", type=int, default=5,
                   help="timed rounds (fp4ref and ml_dtypes alternate); medians are reported (default 5)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.seed < 0:
        p.error(f"--seed {args.seed}: expected >= 0")
    if args.n < 1:
        p.error(f"--n must be positive, got {args.n}")
    if args.repeat < 1:
        p.error(f"--repeat must be positive, got {args.repeat}")
    names = [s.strip() for s in args.formats.split(",") if s.strip()]
    for s in names:
        try:
            get_format(s)
        except ValueError as e:
            p.error(str(e))
    rows = run(names, args.n, args.repeat, args.seed)
    cmd = "python -m fp4ref.bench.codecs" + ("" if argv is None and len(sys.argv) <= 1 else
                                             " " + " ".join(sys.argv[1:] if argv is None else argv))
    print(f"Command: `{cmd}`")
    print(f"Machine: {machine_line()}")
    print(f"{args.n} float32 values per format, RNE, median of {args.repeat} interleaved rounds; "
          "ratio < 1 means fp4ref is faster.\n")
    print(format_table(rows, args.n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
