"""Benchmark (and GPU check) of fp4ref.kernels.gemm_fp16 against torch.matmul on gemm_n3072_k2048.

    python -m fp4ref.kernels.bench gemm_fp16                 # all 43 workload sizes, table
    python -m fp4ref.kernels.bench gemm_fp16 --check         # first: correctness on every size, then the table
    python -m fp4ref.kernels.bench gemm_fp16 --sweep         # time candidate configs per M (tuning; not a result)

Timing: fp4ref.kernels._bench.time_cuda (CUDA events, 10 warm-up + 50 timed iterations, L2 flushed before each
iteration by writing 2 x L2 bytes, no CUDA graphs, median), kernel and torch.matmul in the same run on the same
operands (randn fp16, never zeros). Bytes floor: (M*K + N*K + M*N) * 2 bytes at 4.25 TB/s (the H200's measured
device-to-device copy rate, /work/shared/facts/h200-anchors.md).

--check, per size: output and split-K workspace poisoned with NaN, fresh randn operands, compared with a float64
matmul on the GPU under the declared bound (accumulation_eps of the picked config + one fp16 RNE); two runs
bitwise equal (determinism); on a few sizes the exact fp4ref reference (fp4ref.gemm.gemm_fp16: certified RNE):
fraction of elements bitwise equal to the correctly rounded result and max error / bound.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

WORKLOAD_M = (1, 2, 4, 7, 8, 15, 16, 24, 32, 35, 40, 48, 56, 64, 70, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144,
              152, 160, 168, 176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256, 972, 2053, 2379, 8192)  # fmt: skip
N_WORKLOAD = 3072
K_WORKLOAD = 2048
COPY_BW_BYTES_PER_S = 4.25e12  # H200 device-to-device copy, read + write (facts/h200-anchors.md)
EXACT_CHECK_M = (1, 7, 136, 256, 972)  # sizes also checked against the exact fp4ref reference


def bytes_floor_us(M: int, N: int, K: int) -> float:
    return (M * K + N * K + M * N) * 2 / COPY_BW_BYTES_PER_S * 1e6


def _poisoned_run(torch, A, B):
    """gemm_fp16 into a NaN-filled C, with the cached split-K workspaces NaN-filled too."""
    from .gemm_fp16 import _WORKSPACES, gemm_fp16

    for ws, _cnt in _WORKSPACES.values():
        ws.fill_(float("nan"))
    C = torch.full((A.shape[0], B.shape[0]), float("nan"), dtype=torch.float16, device=A.device)
    return gemm_fp16(A, B, out=C)


def check_sizes(Ms, N, K, log, device: str = "cuda") -> bool:
    """Correctness on the GPU for every M; returns True when all pass. Prints one line per size."""
    import numpy as np
    import torch

    from .gemm_fp16 import accumulation_eps, gemm_fp16, pick_config

    ok_all = True
    gen = torch.Generator(device=device).manual_seed(1234)
    for M in Ms:
        A = torch.randn(M, K, device=device, dtype=torch.float16, generator=gen)
        B = torch.randn(N, K, device=device, dtype=torch.float16, generator=gen)
        cfg = pick_config(M, N, K)
        gemm_fp16(A, B)  # creates the workspace, so that it is poisoned below
        C1 = _poisoned_run(torch, A, B)
        C2 = _poisoned_run(torch, A, B)
        if device == "cuda":
            torch.cuda.synchronize()
        det = torch.equal(C1.view(torch.int16), C2.view(torch.int16))
        Ad, Bd = A.double(), B.double()
        S = Ad @ Bd.T
        absprod = Ad.abs() @ Bd.abs().T
        e64 = (K + 4) * 2.0**-52 * absprod  # float64 matmul error (Higham §3.1), products exact
        eps = accumulation_eps(K, cfg)
        u, eta = 2.0**-11, 2.0**-25
        bound = u * (S.abs() + e64) + (1 + u) * (eps * absprod) + eta + e64
        err = (C1.double() - S).abs()
        nan = int(torch.isnan(C1).sum())
        viol = int((err > bound).sum())
        ratio = float((err / bound).max())
        ok = det and nan == 0 and viol == 0
        line = (f"check M={M:5d} cfg={cfg.kernel}:{cfg.BLOCK_M}x{cfg.BLOCK_N}x{cfg.BLOCK_K}/S{cfg.SPLIT_K} "
                f"nan={nan} viol={viol} max_err/bound={ratio:.3f} deterministic={det}")  # fmt: skip
        if M in EXACT_CHECK_M:
            from fp4ref.gemm import gemm_fp16 as ref_gemm

            ref = ref_gemm(A.cpu().numpy(), B.cpu().numpy())
            out = C1.cpu().numpy()
            same = float(np.mean(out.view(np.int16) == ref.out.view(np.int16)))
            ex_err = np.abs(out.astype(np.float64) - ref.exact)
            ex_bound = u * np.abs(ref.exact) + (1 + u) * eps * ref.absprod + eta + np.asarray(ref.exact_err)
            ex_ratio = float(np.max(ex_err / ex_bound))
            ok = ok and ex_ratio <= 1.0
            line += f" | fp4ref exact: bitwise_equal_RNE={same:.4f} max_err/bound={ex_ratio:.3f}"
        line += "  OK" if ok else "  FAIL"
        print(line, flush=True)
        log.write(line + "\n")
        ok_all &= ok
    return ok_all


def cfg_name(cfg) -> str:
    s = f"{cfg.kernel}:{cfg.BLOCK_M}x{cfg.BLOCK_N}x{cfg.BLOCK_K}/S{cfg.SPLIT_K}/w{cfg.num_warps}/s{cfg.num_stages}"
    if cfg.GROUP_M != 8:
        s += f"/g{cfg.GROUP_M}"
    if cfg.kernel == "tma" and cfg.PROGRAMS_PER_SM != 1:
        s += f"/p{cfg.PROGRAMS_PER_SM}"
    return s


def host_us_per_call(fn, calls: int = 200) -> float:
    """CPU time per call of ``fn`` in microseconds (launches queued, no synchronisation inside the loop)."""
    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def bench_sizes(Ms, N, K, configs=None, verify: bool = False):
    """Rows [M, config, kernel us, torch us, speedup, % of bytes floor, verified] (kernel and peer same run).

    verify=True (sweep): every candidate's output (NaN-poisoned, two runs) is checked against a float64 GPU
    matmul under its declared bound and for bitwise determinism; "ok"/"FAIL..." in the last column.
    """
    import torch

    from ._bench import time_cuda
    from .gemm_fp16 import accumulation_eps, gemm_fp16, pick_config

    rows = []
    gen = torch.Generator(device="cuda").manual_seed(42)
    B = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
    for M in Ms:
        A = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
        cfgs = configs(M) if configs is not None else [pick_config(M, N, K)]
        t_torch = time_cuda(lambda: torch.matmul(A, B.T))
        if verify:
            Ad, Bd = A.double(), B.double()
            S = Ad @ Bd.T
            absprod = Ad.abs() @ Bd.abs().T
            e64 = (K + 4) * 2.0**-52 * absprod
        for cfg in cfgs:
            status = "-"
            try:
                if verify:
                    outs = []
                    for _ in range(2):
                        C = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")
                        outs.append(gemm_fp16(A, B, cfg, out=C))
                    u = 2.0**-11
                    bound = u * (S.abs() + e64) + (1 + u) * accumulation_eps(K, cfg) * absprod + 2.0**-25 + e64
                    good = bool(((outs[0].double() - S).abs() <= bound).all())
                    det = torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
                    status = "ok" if good and det else f"FAIL(bound={good},det={det})"
                t_k = time_cuda(lambda: gemm_fp16(A, B, cfg))
            except Exception as e:  # sweep: a config may not fit (shared memory); report and go on
                print(f"M={M} {cfg_name(cfg)}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            floor = bytes_floor_us(M, N, K)
            rows.append([M, cfg_name(cfg), t_k, t_torch, t_torch / t_k, 100.0 * floor / t_k, status])
    return rows


def sweep_candidates(M: int):
    """Candidate configs for the tuning sweep (--sweep), by M."""
    from .gemm_fp16 import GemmConfig as G

    out = []
    if M <= 256:
        p2 = max(16, 1 << (M - 1).bit_length())
        out += [  # pointer-load split-K (the best of the first sweep)
            G("splitk", min(p2, 64), 64, 64, SPLIT_K=8, num_warps=4, num_stages=4),
            G("splitk", min(p2, 64), 32, 128, SPLIT_K=4, num_warps=4, num_stages=4),
            G("splitk", min(p2, 64), 64, 128, SPLIT_K=2, num_warps=4, num_stages=4),
        ]
        if M > 64:
            out += [G("splitk", 128, 64, 128, SPLIT_K=2, num_warps=8, num_stages=4),
                    G("splitk", 128, 128, 64, SPLIT_K=1, num_warps=8, num_stages=4)]  # fmt: skip
        bms = (64,) if M <= 64 else (64, 128)
        for bm in bms:
            w = 4 if bm == 64 else 8
            for bn, bk, sk, st, pps in (
                (64, 128, 4, 4, 4), (64, 128, 8, 4, 4), (128, 128, 4, 4, 2), (128, 128, 8, 4, 2),
                (128, 64, 4, 6, 2), (128, 64, 8, 6, 2), (64, 64, 8, 6, 4), (128, 128, 2, 4, 2),
                (256, 64, 4, 4, 1), (64, 256, 4, 3, 2),
            ):  # fmt: skip
                out.append(G("tma", bm, bn, bk, SPLIT_K=sk, num_warps=w, num_stages=st, PROGRAMS_PER_SM=pps))
    if M >= 192:
        out += [
            G("tma", 128, 128, 64, num_warps=8, num_stages=4),
            G("tma", 128, 128, 64, num_warps=4, num_stages=4),
            G("tma", 128, 128, 64, num_warps=4, num_stages=5),
            G("tma", 128, 256, 64, num_warps=8, num_stages=3),
            G("tma", 128, 256, 64, num_warps=8, num_stages=3, GROUP_M=4),
            G("tma", 128, 256, 64, num_warps=8, num_stages=3, GROUP_M=16),
            G("tma", 128, 128, 64, num_warps=4, num_stages=4, GROUP_M=16),
            G("tma", 64, 256, 64, num_warps=4, num_stages=4),
            G("tma", 64, 128, 64, num_warps=4, num_stages=5, PROGRAMS_PER_SM=2),
            G("tma", 128, 128, 64, SPLIT_K=2, num_warps=8, num_stages=4),
            G("tma", 128, 256, 64, SPLIT_K=2, num_warps=8, num_stages=3),
            G("tma", 128, 128, 64, num_warps=8, num_stages=4, PROGRAMS_PER_SM=2),
        ]
    return out


def _compile_worker(cfg_json: str) -> str:
    """Compile one config by running it once (fills triton's on-disk cache for the main process)."""
    import torch

    from fp4ref.kernels.gemm_fp16 import GemmConfig, gemm_fp16

    cfg = GemmConfig(**json.loads(cfg_json))
    A = torch.randn(300, K_WORKLOAD, device="cuda", dtype=torch.float16)
    B = torch.randn(N_WORKLOAD, K_WORKLOAD, device="cuda", dtype=torch.float16)
    try:
        gemm_fp16(A, B, cfg)
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:  # reported by the caller
        return f"{type(e).__name__}: {str(e)[:200]}"


def precompile(cfgs, workers: int) -> None:
    """Compile configs in parallel processes (triton compiles on the CPU; the cache is shared on disk)."""
    import dataclasses
    import multiprocessing as mp

    uniq = sorted({json.dumps(dataclasses.asdict(c), sort_keys=True) for c in cfgs})
    t0 = time.time()
    with mp.get_context("spawn").Pool(min(workers, len(uniq))) as pool:
        res = pool.map(_compile_worker, uniq)
    bad = [(u, r) for u, r in zip(uniq, res) if r != "ok"]
    print(f"precompiled {len(uniq)} configs in {time.time() - t0:.1f} s; failures: {len(bad)}", flush=True)
    for u, r in bad:
        print("  compile failure", u, r, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp4ref.kernels.bench gemm_fp16", description=__doc__.split("\n")[0])
    p.add_argument("--m", type=int, nargs="*", default=None, help="M values (default: the 43 workload sizes)")
    p.add_argument("--n", type=int, default=N_WORKLOAD)
    p.add_argument("--k", type=int, default=K_WORKLOAD)
    p.add_argument("--check", action="store_true", help="check correctness on every size before timing")
    p.add_argument("--sweep", action="store_true", help="time the candidate configs per M (tuning)")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2), help="parallel compiles")
    p.add_argument("--out", default=None, help="directory for logs / json results")
    args = p.parse_args(argv)

    import torch

    from ._bench import geomean, print_table

    if not torch.cuda.is_available():
        print("gemm_fp16 benchmark: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    Ms = tuple(args.m) if args.m else WORKLOAD_M
    N, K = args.n, args.k
    out_dir = args.out
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    log = open(os.path.join(out_dir, "gemm_fp16_log.txt"), "a") if out_dir else open(os.devnull, "w")
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}; torch {torch.__version__}; triton {__import__('triton').__version__}; N={N} K={K}")

    from .gemm_fp16 import pick_config

    if args.check and args.sweep:
        precompile([pick_config(M, N, K) for M in Ms], args.workers)
        ok = check_sizes(Ms, N, K, log)
        print(f"check (current CONFIG_TABLE): {'ALL OK' if ok else 'FAILURES'}", flush=True)
    if args.sweep:
        cands = [c for M in Ms for c in sweep_candidates(M)]
        precompile(cands, args.workers)
        rows = bench_sizes(Ms, N, K, configs=sweep_candidates, verify=True)
        best = {}
        for r in rows:
            if r[6] == "ok" and (r[0] not in best or r[2] < best[r[0]][2]):
                best[r[0]] = r
        if out_dir:
            with open(os.path.join(out_dir, "gemm_fp16_sweep.json"), "w") as f:
                json.dump(rows, f)
        fails = [r for r in rows if r[6] != "ok"]
        print(f"sweep: {len(rows)} (M, config) pairs timed, {len(fails)} failed verification", flush=True)
        for r in fails:
            print("  FAIL", r, flush=True)
        # Host overhead (CPU us per call) of the current table's config and of torch.matmul.
        from .gemm_fp16 import gemm_fp16

        Bh = torch.randn(N, K, device="cuda", dtype=torch.float16)
        for M in (1, 128, 2053):
            Ah = torch.randn(M, K, device="cuda", dtype=torch.float16)
            hk = host_us_per_call(lambda: gemm_fp16(Ah, Bh))
            ht = host_us_per_call(lambda: torch.matmul(Ah, Bh.T))
            print(f"host us/call M={M}: gemm_fp16 {hk:.1f}, torch.matmul {ht:.1f}", flush=True)
        print_table("sweep best per M", ["M", "config", "kernel us", "torch us", "speedup", "% floor", "verified"],
                    [best[m] for m in sorted(best)], markdown=True)  # fmt: skip
        return 0

    precompile([pick_config(M, N, K) for M in Ms], args.workers)
    ok = True
    if args.check:
        ok = check_sizes(Ms, N, K, log)
        print(f"check: {'ALL OK' if ok else 'FAILURES'}", flush=True)
    rows = [r[:6] for r in bench_sizes(Ms, N, K)]
    if out_dir:
        with open(os.path.join(out_dir, "gemm_fp16_bench.json"), "w") as f:
            json.dump(rows, f)
    title = f"gemm_fp16 vs torch.matmul, N={N} K={K}, {dev}, L2 flushed, median of 50 (CUDA events)"
    md = print_table(title, ["M", "config", "kernel us", "torch us", "speedup", "% of bytes floor"], rows,
                     markdown=True)  # fmt: skip
    log.write(md + "\n")
    small = [r[4] for r in rows if r[0] <= 256]
    summary = []
    if small:
        summary.append(f"geomean speedup M<=256: {geomean(small):.3f}x over {len(small)} sizes (goal >= 1.5x)")
    for r in rows:
        if r[0] in (972, 2053, 2379, 8192):
            summary.append(f"M={r[0]}: {r[4]:.3f}x (goal >= 0.95x)")
    for s in summary:
        print(s)
        log.write(s + "\n")
    log.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
