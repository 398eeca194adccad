"""Benchmark (and GPU check) of fp4ref.kernels.sparse_gemm_fp4_fp8 on sparse_gemm_fp4_fp8_n2048_k2048.

    python -m fp4ref.kernels.bench sparse_gemm_fp4_fp8            # table: M in 1 7 16 64 100 256 1024 4096 8192
    python -m fp4ref.kernels.bench sparse_gemm_fp4_fp8 --check    # first: correctness on every M, then the table
    python -m fp4ref.kernels.bench sparse_gemm_fp4_fp8 --sweep    # time candidate configs per M (tuning only)

--sweep picks, per M, the candidate with the least GPU time (CUPTI), except that at M <= 256 an expand pick must
also have the lower event time (host included) than the best one-launch (Gluon or fused) config; then (with
--check) checks and times the picked configs in the same run; paste them into configs.CONFIGS (--paths limits the
candidates to some paths).

Peers, timed in the same run on the same operands:
  (a) cuBLAS fp8 dense: torch._scaled_mm(A_e4m3, b.T, scale 1, out bf16) with A pre-expanded to E4M3FN outside
      the timed region (exact: E2M1 values and their duplicate-index sums are E4M3FN values);
  (b) naive: rebuild dense fp32 A from (vals, meta) with torch ops, then an fp32 matmul, bf16 out (timed whole).
Timing: fp4ref.kernels._bench.time_gpu for every figure: CUPTI GPU time per call (the span from the call's first
kernel start to its last kernel end) and CUDA-event time, L2 flushed before every call (2 x L2 write), 10 warm-up
+ 50 timed, medians.
Operands: a_vals, a_meta = torch.randint(-128, 128) int8 (as the public benchmark feeds them: any byte),
b = randn fp32 cast to E4M3FN (never zeros).
Bytes floor: (2 * M * K/4 + N * K + 2 * M * N) bytes at 4.25 TB/s (the H200's measured device-to-device copy
rate, read + write; docs/benchmarks.md), as % of our CUPTI time.

--check, per M: random-byte and canonical (compress_2to4 style: idx0 < idx1, bits 7:4 zero) metadata; output,
split-K workspace and dense-A workspace poisoned with NaN; fp4ref.gemm.sparse_gemm_fp4_fp8 (exact) checked by
fp4ref.bounds.check under NUMERIC_CONTRACT's model and under the config's own tighter model
(accumulation_model), poison=NaN; two runs bitwise equal; on a few M, NaN bytes in b (selected and pruned) must
give exactly the reference's NaN pattern.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

__all__ = ["main", "make_operands", "naive_sparse_gemm", "expand_a_e4m3", "check_sizes", "bench_sizes",
           "sweep_candidates", "pick_by_kind", "host_launch_diag"]

N_WORKLOAD = 2048
K_WORKLOAD = 2048
WORKLOAD_M = (1, 7, 16, 64, 100, 256, 1024, 4096, 8192)
NAN_CHECK_M = (7, 256, 1024, 4096)  # 1024 and 4096: both expand tiles (NaN fix-up launch)
COPY_BW_BYTES_PER_S = 4.25e12  # H200 device-to-device copy, read + write (measured; docs/benchmarks.md)

# canonical metadata nibbles (idx0 < idx1 in bits 1:0 and 3:2, bits 7:4 zero), as fp4ref.packing.compress_2to4 emits
_CANONICAL_META = (0x4, 0x8, 0x9, 0xC, 0xD, 0xE)
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def bytes_floor_us(M: int, N: int, K: int) -> float:
    return (2 * M * (K // 4) + N * K + 2 * M * N) / COPY_BW_BYTES_PER_S * 1e6


def make_operands(M: int, N: int, K: int, gen, canonical: bool = False, device: str = "cuda"):
    """(a_vals int8 [M, K/4], a_meta int8 [M, K/4], b float8_e4m3fn [N, K]); random, never all zero."""
    import torch

    vals = torch.randint(-128, 128, (M, K // 4), dtype=torch.int8, device=device, generator=gen)
    if canonical:
        pick = torch.randint(0, len(_CANONICAL_META), (M, K // 4), device=device, generator=gen)
        meta = torch.tensor(_CANONICAL_META, dtype=torch.int8, device=device)[pick]
    else:
        meta = torch.randint(-128, 128, (M, K // 4), dtype=torch.int8, device=device, generator=gen)
    b = torch.randn(N, K, device=device, generator=gen).to(torch.float8_e4m3fn)
    return vals, meta, b


def _dense_a_f32(a_vals, a_meta):
    """Dense fp32 A [M, K] from (vals, meta) with torch ops (docs/kernels.md semantics: duplicate indices add)."""
    import torch

    M, G = a_vals.shape
    v = a_vals.view(torch.uint8).long()
    m = a_meta.view(torch.uint8).long()
    lut = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=a_vals.device)
    A = torch.zeros(M, G, 4, dtype=torch.float32, device=a_vals.device)
    A.scatter_add_(2, (m & 3).unsqueeze(2), lut[v & 15].unsqueeze(2))
    A.scatter_add_(2, ((m >> 2) & 3).unsqueeze(2), lut[v >> 4].unsqueeze(2))
    return A.reshape(M, 4 * G)


def naive_sparse_gemm(a_vals, a_meta, b_fp8):
    """Peer (b): rebuild dense A in fp32, fp32 matmul against b upcast, bf16 out."""
    return (_dense_a_f32(a_vals, a_meta) @ b_fp8.float().T).to(__import__("torch").bfloat16)


def expand_a_e4m3(a_vals, a_meta):
    """Dense A as E4M3FN [M, K] (exact: every entry is an E2M1 value or the sum of two, <= 4 significant bits)."""
    import torch

    return _dense_a_f32(a_vals, a_meta).to(torch.float8_e4m3fn)


def _scaled_mm_fn(A8, b_fp8):
    """Peer (a): cuBLAS fp8 dense. torch._scaled_mm wants M % 16 == 0 on some versions: pad rows if refused."""
    import torch

    one = torch.ones((), dtype=torch.float32, device=A8.device)
    fn = lambda: torch._scaled_mm(A8, b_fp8.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
    try:
        fn()
        return fn, ""
    except RuntimeError:
        Mp = -(-A8.shape[0] // 16) * 16
        Ap = torch.zeros(Mp, A8.shape[1], dtype=torch.float8_e4m3fn, device=A8.device)
        Ap[: A8.shape[0]] = A8
        fn = lambda: torch._scaled_mm(Ap, b_fp8.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        fn()
        return fn, f" (M padded to {Mp})"


def _workspace(name, dtype, device):
    """The kernel's workspace ``name`` on the current stream (a 1-element one when none was allocated yet)."""
    from .. import _runtime

    return _runtime.workspace(device, _runtime.current_stream(device), name, 0, dtype)


def _poisoned_run(a_vals, a_meta, b, cfg=None):
    """The kernel into a NaN-filled output, with the current stream's split-K and dense-A workspaces poisoned."""
    import torch

    from . import WS_DENSE_A, WS_PARTIALS, sparse_gemm_fp4_fp8

    _workspace(WS_PARTIALS, torch.float32, b.device).fill_(float("nan"))
    # the expand path's dense A: the pre-pass must write every element the GEMM reads
    _workspace(WS_DENSE_A, torch.float8_e4m3fn, b.device).view(torch.uint8).fill_(0x7F)  # E4M3FN NaN bytes
    out = torch.full((a_vals.shape[0], b.shape[0]), float("nan"), dtype=torch.bfloat16, device=b.device)
    return sparse_gemm_fp4_fp8(a_vals, a_meta, b, cfg, out=out)


def _path(cfg) -> str:
    from . import ExpandConfig, FusedWSConfig, GemvConfig, GluonConfig

    if isinstance(cfg, GemvConfig):
        return "gemv"
    if isinstance(cfg, FusedWSConfig):
        return "fused-ws"
    return "expand" if isinstance(cfg, ExpandConfig) else "gluon" if isinstance(cfg, GluonConfig) else "fused"


def _cfg_name(cfg) -> str:
    from . import ExpandConfig, FusedWSConfig, GemvConfig, GluonConfig

    if isinstance(cfg, GemvConfig):
        return f"n{cfg.block_n}xg{cfg.block_g}/w{cfg.num_warps}"
    if isinstance(cfg, FusedWSConfig):
        return f"{cfg.block_m}x{cfg.block_n}x128/sb{cfg.b_stages}/sa{cfg.a_stages}" + (
            f"/g{cfg.group_m}" if cfg.group_m != 8 else "")
    if isinstance(cfg, GluonConfig):
        return f"{cfg.BLOCK_M}x{cfg.BLOCK_N}x128/S{cfg.SPLIT_K}/w{cfg.num_warps}/s{cfg.STAGES}" + (
            "/cluster" if cfg.CLUSTER else "")
    if isinstance(cfg, ExpandConfig):
        name = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}/w{cfg.num_warps}/s{cfg.num_stages}"
        if cfg.gemm == "gluon":  # persistent on every SM, NaN tiles recomputed inline: only the tile and ring vary
            name += "/gluon"
        else:
            name += f"/p{cfg.programs_per_sm}/n{cfg.n_split}/{cfg.nan_fixup}"
    else:
        name = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}/S{cfg.split_k}/w{cfg.num_warps}/s{cfg.num_stages}/{cfg.mma}"
    if cfg.group_m != 8:
        name += f"/g{cfg.group_m}"
    return name


def host_time_us(fn, calls: int = 200) -> float:
    """Host (CPU) time per call of ``fn`` in MICROSECONDS (DIAGNOSTIC): ``calls`` back-to-back calls without
    synchronising; the GPU work queues, so the wall time is the host's."""
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return t


def check_sizes(Ms, N, K, log, configs=None) -> bool:
    """Correctness on the GPU for every M (see the module docstring); one line per case; True when all pass."""
    import numpy as np
    import torch

    from fp4ref.bounds import check
    from fp4ref.gemm import sparse_gemm_fp4_fp8 as reference

    from . import NUMERIC_CONTRACT, WS_DENSE_A, ExpandConfig, accumulation_model, pick_config, sparse_gemm_fp4_fp8

    contract = NUMERIC_CONTRACT.model
    ok_all = True
    gen = torch.Generator(device="cuda").manual_seed(2024)
    for M in Ms:
        cfg = (configs or {}).get(M) or pick_config(M, N, K)
        cases = [("random", False, False), ("canonical", True, False)]
        if M in NAN_CHECK_M:
            cases.append(("nan-in-b", False, True))
        for label, canonical, with_nan in cases:
            try:
                vals, meta, b = make_operands(M, N, K, gen, canonical=canonical)
                if with_nan:
                    bu = b.view(torch.uint8)
                    hit = torch.rand(bu.shape, device="cuda", generator=gen) < 2e-4  # ~0.4 NaN per row of b
                    bu[hit] = torch.where(torch.rand(bu.shape, device="cuda", generator=gen) < 0.5, 0x7F, 0xFF).to(
                        torch.uint8)[hit]
                sparse_gemm_fp4_fp8(vals, meta, b, cfg)  # creates the workspace, poisoned below
                c1 = _poisoned_run(vals, meta, b, cfg)
                c2 = _poisoned_run(vals, meta, b, cfg)
                torch.cuda.synchronize()
                det = torch.equal(c1.view(torch.int16), c2.view(torch.int16))
                prep = ""
                if isinstance(cfg, ExpandConfig):  # the pre-pass output byte for byte (a NaN tile's fix-up would
                    # hide errors)
                    a8 = _workspace(WS_DENSE_A, torch.float8_e4m3fn, b.device)[: M * K].view(M, K)
                    prep_ok = torch.equal(a8.float(), expand_a_e4m3(vals, meta).float())  # values (-0 == +0)
                    prep = f" prepass_exact={prep_ok}"
                    det = det and prep_ok
                t0 = time.time()
                ref = reference(vals.cpu().numpy(), meta.cpu().numpy(), b.view(torch.uint8).cpu().numpy())
                out = c1.cpu().view(torch.int16).numpy().view(ref.out.dtype)
                rep = check(out, ref, contract, output_rounding="rne", poison=float("nan"))
                own = accumulation_model(cfg, K)
                rep_own = check(out, ref, own, output_rounding="rne", poison=float("nan"))
                n_nan = int(np.isnan(ref.exact).sum())
                ok = rep.ok and rep_own.ok and det
                line = (f"check M={M:5d} {label:9s} {_path(cfg)} cfg={_cfg_name(cfg)} det={det}{prep} | "
                        f"{contract}: {rep.summary()} | "
                        f"own {own}: max err/bound {rep_own.max_err_over_bound:.3g}, ok={rep_own.ok} | "
                        f"ref NaNs={n_nan} ({time.time() - t0:.1f}s)  {'OK' if ok else 'FAIL'}")
                print(line, flush=True)
                log.write(line + "\n")
                if not ok:
                    msg = rep.message() + "\n" + rep_own.message()
                    print(msg, flush=True)
                    log.write(msg + "\n")
                ok_all &= ok
            except Exception as e:  # a crash of one case is a failing row, not the end of the run
                line = f"check M={M:5d} {label:9s} cfg={_cfg_name(cfg)} FAIL: {type(e).__name__}: {str(e)[:300]}"
                print(line, flush=True)
                log.write(line + "\n")
                ok_all = False

    return ok_all


def bench_sizes(Ms, N, K, configs=None, nan_check_bytes=None):
    """Rows of COLUMNS (ours and both peers by CUPTI and by events, ratios peer/ours by CUPTI, % of the bytes
    floor, path and config) and, per row, the (M, config, nan_check_bytes, Timing) it timed. ``configs(M)`` gives
    (config, nan_check_bytes) candidates (default: pick_config(M, N, K))."""
    import torch

    from .._bench import time_gpu
    from . import pick_config, sparse_gemm_fp4_fp8

    rows, timed = [], []
    gen = torch.Generator(device="cuda").manual_seed(42)
    for M in Ms:
        vals, meta, b = make_operands(M, N, K, gen)
        A8 = expand_a_e4m3(vals, meta)
        mm, note = _scaled_mm_fn(A8, b)
        t_fp8 = time_gpu(mm)
        t_naive = time_gpu(lambda: naive_sparse_gemm(vals, meta, b))
        cands = configs(M) if configs is not None else [(pick_config(M, N, K), nan_check_bytes)]
        for cfg, ncb in cands:
            try:
                t_k = time_gpu(lambda: sparse_gemm_fp4_fp8(vals, meta, b, cfg, nan_check_bytes=ncb))
            except Exception as e:  # sweep: a config may not fit (shared memory); report and go on
                print(f"M={M} {cfg}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            name = _cfg_name(cfg) + ("/nanbytes" if ncb else "") + note
            rows.append([M, _path(cfg), name, t_k.cupti_us, t_k.event_us, t_fp8.cupti_us, t_fp8.event_us,
                         t_naive.cupti_us, t_naive.event_us, t_fp8.cupti_us / t_k.cupti_us,
                         t_naive.cupti_us / t_k.cupti_us, 100.0 * bytes_floor_us(M, N, K) / t_k.cupti_us])
            timed.append((M, cfg, ncb, t_k))
    return rows, timed


def sweep_candidates(M: int):
    """(config, nan_check_bytes) candidates for the tuning sweep, by M: the CONFIGS row for M (at the workload's
    N = K = 2048) and these. FMA configs keep
    block_m * block_n * block_k / (32 * num_warps) <= 64 (the per-thread accumulator). M >= 100: the expand path
    (decode pre-pass + persistent TMA fp8 GEMM) against the fused kernel's best large-M tiles."""
    from . import ExpandConfig, FusedWSConfig, GemvConfig, GluonConfig
    from . import FusedConfig as C

    def X(bm, bn, w, s, g=8, p=1, ns=1, fix="launch"):
        return ExpandConfig(bm, bn, 128, group_m=g, num_warps=w, num_stages=s, programs_per_sm=p, n_split=ns,
                            nan_fixup=fix)

    def XG(bm, bn, s, g=8):  # the expand path with the Gluon GEMM
        return ExpandConfig(bm, bn, 128, group_m=g, num_warps=bm // 16, num_stages=s, nan_fixup="inline",
                            gemm="gluon")

    out = []
    if M > 16:
        out += [XG(64, 64, 8), XG(64, 128, 6)]
    if M >= 64:
        out += [XG(128, 64, 6), XG(128, 128, 5), XG(128, 128, 6)]
    if M >= 1024:
        out += [XG(128, 128, 5, g=16), XG(128, 128, 6, g=4)]
        # one launch, no dense-A workspace: A decoded in shared memory by a decoder partition
        out += [FusedWSConfig(), FusedWSConfig(b_stages=4, a_stages=4), FusedWSConfig(b_stages=5, a_stages=3)]
    if M <= 4:  # the GEMV path: many small programs read b as words, no split-K
        out += [c for c in (GemvConfig(4, 128, 4), GemvConfig(4, 256, 2), GemvConfig(8, 128, 4),
                            GemvConfig(2, 256, 2), GemvConfig(8, 64, 4)) if M <= c.max_m]
    if M <= 2:
        out += [C(1, 64, 128, 8, mma="fma"), C(1, 64, 128, 16, mma="fma"), C(1, 128, 128, 8, num_warps=8, mma="fma"),
                C(1, 32, 128, 16, num_warps=2, mma="fma"), C(2, 32, 128, 8, mma="fma"),
                C(1, 32, 128, 8, num_warps=2, mma="fma")]
    if M <= 8:
        out += [C(8, 16, 128, 8, num_warps=8, mma="fma"), C(4, 32, 128, 8, num_warps=8, mma="fma"),
                C(4, 16, 128, 16, mma="fma")]
    if M <= 16:
        out += [C(16, 64, 128, 4, mma="fp16"), C(16, 64, 128, 8, mma="fp16"), C(16, 32, 128, 8, mma="fp16"),
                C(16, 32, 128, 16, mma="fp16"), C(16, 64, 128, 16, mma="fp16")]
    if 16 <= M <= 256:
        out += [C(32, 64, 128, 8, mma="fp16"), C(64, 64, 128, 4), C(64, 64, 128, 8), C(64, 128, 128, 4),
                C(64, 128, 128, 2), C(64, 64, 128, 16), C(64, 128, 128, 8)]
    if 64 <= M <= 256:  # small grids: the expand path's three launches against the fused kernel's decode
        out += [X(64, 64, 4, 4), X(64, 64, 4, 4, fix="inline"), X(64, 128, 4, 4), X(64, 128, 4, 4, fix="inline")]
    if 100 <= M <= 256:
        out += [X(128, 128, 8, 4)]
    if M >= 1024:
        # the leaders of earlier sweeps (64 x 128 expand, 128 x 128 fused, programs_per_sm=2, 256 x 128 and 4
        # stages at 128 x 256 were slower at every M >= 1024; the 128 x 256 / 256 x 128 tiles spill without
        # n_split=2; inline NaN fix-up: 255 registers)
        out += [C(64, 128, 128, 1, num_warps=4, num_stages=4),
                X(128, 128, 8, 4), X(128, 128, 8, 4, g=16), X(128, 256, 8, 3, ns=2), X(128, 256, 8, 3, g=16, ns=2),
                X(128, 256, 8, 3, ns=2, fix="inline")]
    if M <= 256:  # the Gluon swap-AB kernel: b streamed by TMA over ~128 CTAs (N tiles x K slices x M tiles)
        G = GluonConfig
        bm = min(64, max(8, 1 << (M - 1).bit_length()))
        if bm > 16:  # 16-row M tiles with the arithmetic decode against one wider tile through the table
            out += [G(64, 16, 5, 4), G(64, 32, 5, 4)]
        w = 4 if bm <= 32 else 8
        out += [G(128, bm, 4, 8, w), G(64, bm, 4, 4), G(128, bm, 4, 4, w), G(64, bm, 6, 2), G(64, bm, 4, 8)]
        # STAGES = K steps per slice + 1: every b tile of the slice is in flight from the start
        out += [G(64, bm, 5, 4), G(64, bm, 3, 8), G(128, bm, 3, 8, w), G(128, bm, 5, 4, w), G(64, bm, 9, 2)]
        if bm <= 16:  # the K slices of a tile in one cluster, summed in its first CTA's shared memory
            from .._gluon import STATIC_SHARED_MAX, exchange_bytes

            out += [G(bn, bm, st, sk, w if bn == 128 else 4, CLUSTER=True)
                    for bn, st, sk in ((64, 5, 4), (64, 3, 8), (128, 3, 8), (128, 5, 4), (64, 9, 2))
                    if exchange_bytes(bn * bm, sk) <= STATIC_SHARED_MAX]
        else:  # two 16-row M tiles (the table's row at M = 17-32)
            out += [G(128, 16, 5, 4)]
        if M > 64:
            out += [G(128, 64, 4, 2, 8), G(64, 64, 3, 2), G(128, 64, 3, 4, 8)]
    from . import pick_config

    table = pick_config(M, 2048, 2048, interpreter=False)  # the shipped row always competes: a sweep never loses it
    if table not in out:
        out.insert(0, table)
    cands = [(c, None) for c in out]
    if M in (1, 8192):  # the cost of detecting NaN bytes by bits instead of from the accumulator
        cands.append((out[0], True))
    return cands


SMALL_M_HOST_BOUND = 256  # at M <= this, the expand path (3 launches) must also win on event time (host included)


def pick_by_kind(M: int, kinds: dict, log=None):
    """The sweep's pick for M from {path: (GPU us, event us, config)} ("gemv", "gluon", "fused", "fused-ws",
    "expand"), the fastest config of each path by GPU (CUPTI) time: the least GPU time, except at M <=
    SMALL_M_HOST_BOUND where an expand pick must also have the lower event time than the best one-launch config
    (its three launches' host time shows there); prints each."""
    one = [kinds[p] for p in ("gemv", "gluon", "fused", "fused-ws") if p in kinds]
    g_f, e_f, c_f = min(one, key=lambda r: r[0]) if one else (float("inf"), float("inf"), None)
    g_x, e_x, c_x = kinds.get("expand", (float("inf"), float("inf"), None))
    pick = c_x if g_x < g_f else c_f
    if pick is c_x and c_f is not None and M <= SMALL_M_HOST_BOUND and e_x >= e_f:
        pick = c_f
    line = (f"M={M}: best one-launch {_cfg_name(c_f) if c_f else '-'} GPU {g_f:.2f} us / event {e_f:.2f} us; "
            f"best expand {_cfg_name(c_x) if c_x else '-'} GPU {g_x:.2f} us / event {e_x:.2f} us -> {_path(pick)}")
    print(line, flush=True)
    if log is not None:
        log.write(line + "\n")
    return pick


def _compile_worker(job: str) -> str:
    """Compile one config by running it once (fills triton's on-disk cache for the main process; the GEMV path at
    M = 1, the others at M = 300: one build serves every M of a config but the GEMV path's, whose BLOCK_M is M's)."""
    import torch

    from fp4ref.kernels.sparse_gemm_fp4_fp8 import (ExpandConfig, FusedConfig, FusedWSConfig, GemvConfig,
                                                    GluonConfig, sparse_gemm_fp4_fp8)

    d = json.loads(job)
    ncb = d.pop("nan_check_bytes")
    cfg = {"expand": ExpandConfig, "gluon": GluonConfig, "fused": FusedConfig, "fused-ws": FusedWSConfig,
           "gemv": GemvConfig}[d.pop("path")](**d)
    m = 1 if isinstance(cfg, GemvConfig) else 300
    vals, meta, b = make_operands(m, N_WORKLOAD, K_WORKLOAD, torch.Generator(device="cuda").manual_seed(0))
    try:
        sparse_gemm_fp4_fp8(vals, meta, b, cfg, nan_check_bytes=ncb)
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:  # reported by the caller
        return f"{type(e).__name__}: {str(e)[:200]}"


def precompile(cands, workers: int) -> None:
    """Compile (config, nan_check_bytes) pairs in parallel processes (triton's cache is shared on disk)."""
    from .._bench import compile_in_pool

    uniq = sorted({json.dumps({**dataclasses.asdict(c), "path": _path(c), "nan_check_bytes": n}, sort_keys=True)
                   for c, n in cands})
    compile_in_pool(_compile_worker, uniq, workers, "configs")


COLUMNS = ["M", "path", "config", "ours CUPTI us", "ours event us", "cuBLAS fp8 CUPTI us", "cuBLAS fp8 event us",
           "naive CUPTI us", "naive event us", "cuBLAS/ours (CUPTI)", "naive/ours (CUPTI)", "% bytes floor (CUPTI)"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp4ref.kernels.bench sparse_gemm_fp4_fp8",
                                description=__doc__.split("\n")[0])
    p.add_argument("--m", type=int, nargs="*", default=None,
                   help="M values (default: 1 7 16 64 100 256 1024 4096 8192)")
    p.add_argument("--n", type=int, default=N_WORKLOAD)
    p.add_argument("--k", type=int, default=K_WORKLOAD)
    p.add_argument("--check", action="store_true", help="check correctness on every M before timing")
    p.add_argument("--sweep", action="store_true", help="time the candidate configs per M (tuning)")
    p.add_argument("--paths", nargs="*", choices=("gemv", "gluon", "fused", "fused-ws", "expand"), default=None,
                   help="--sweep: only the candidates of these paths (default: all)")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2), help="parallel compiles")
    p.add_argument("--out", default=None, help="directory for the results: sparse_gemm_log.txt, sparse_gemm.json")
    args = p.parse_args(argv)

    import torch

    from .._bench import print_table
    from . import pick_config

    if not torch.cuda.is_available():
        print("sparse_gemm_fp4_fp8 benchmark: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    Ms = tuple(args.m) if args.m else WORKLOAD_M
    N, K = args.n, args.k
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "sparse_gemm_log.txt"), "a") if args.out else open(os.devnull, "w")
    dev = torch.cuda.get_device_name()
    head = f"device: {dev}; torch {torch.__version__}; triton {__import__('triton').__version__}; N={N} K={K}"
    print(head, flush=True)
    log.write(head + "\n")

    ok = True
    results: dict = {"device": head}
    if args.sweep:
        # tuning: time every candidate, pick the fastest per M by CUPTI time (the bits-based NaN check is not a GPU
        # default), then check and time the picked configs in this same run; configs.CONFIGS is set from them.
        def cands(M):
            return [(c, n) for c, n in sweep_candidates(M) if args.paths is None or _path(c) in args.paths]

        precompile([c for M in Ms for c in cands(M)], args.workers)
        rows, timed = bench_sizes(Ms, N, K, configs=cands)
        best: dict = {}
        for M, cfg, ncb, t in timed:
            if ncb:
                continue  # not a GPU default: never picked
            kind = best.setdefault(M, {})
            path = _path(cfg)
            if path not in kind or t.cupti_us < kind[path][0]:
                kind[path] = (t.cupti_us, t.event_us, cfg)  # fastest by GPU time per path
        results["sweep"] = rows
        md = print_table("sweep (all candidates; picked by CUPTI GPU time)", COLUMNS, rows, markdown=True)
        log.write(md + "\n")
        picked = {M: pick_by_kind(M, best[M], log) for M in best}
        table = ",\n".join(f"    ({M}, {picked[M]!r})" for M in sorted(picked))
        print(f"picked per M (CONFIGS bounds = these M):\n{table}", flush=True)
        log.write(f"picked per M:\n{table}\n")
        results["picked"] = {M: repr(picked[M]) for M in sorted(picked)}
        if args.check:
            ok = check_sizes(Ms, N, K, log, configs=picked)
            print(f"check (picked configs): {'ALL OK' if ok else 'FAILURES'}", flush=True)
            log.write(f"check (picked configs): {'ALL OK' if ok else 'FAILURES'}\n")
            results["check_ok"] = ok
        rows, _ = bench_sizes(Ms, N, K, configs=lambda M: [(picked[M], None)])
        results["final"] = rows
        _final_table(rows, N, K, dev, log)
        results["host"] = host_launch_diag([M for M in Ms if _path(picked[M]) == "expand"][:2], N, K, picked, log)
        _write_json(args.out, results)
        return 0 if ok else 1

    precompile([(pick_config(M, N, K), None) for M in Ms], args.workers)
    if args.check:
        ok = check_sizes(Ms, N, K, log)
        print(f"check: {'ALL OK' if ok else 'FAILURES'}", flush=True)
        log.write(f"check: {'ALL OK' if ok else 'FAILURES'}\n")
        results["check_ok"] = ok
    rows, _ = bench_sizes(Ms, N, K)
    results["final"] = rows
    _final_table(rows, N, K, dev, log)
    results["host"] = host_launch_diag([M for M in Ms if _path(pick_config(M, N, K)) == "expand"][:2], N, K, None,
                                       log)
    _write_json(args.out, results)
    return 0 if ok else 1


def host_launch_diag(Ms, N, K, configs, log) -> list:
    """DIAGNOSTIC: host (CPU) us per call with the kept kernels launched directly (``_runtime.FAST_LAUNCH``, the
    default) and through Triton's launcher (``ck.run``: per-call descriptor encoding), per M; lines printed and
    returned."""
    import torch

    from .. import _runtime
    from . import PLANS, pick_config, sparse_gemm_fp4_fp8

    lines = []
    for M in Ms:
        cfg = (configs or {}).get(M) or pick_config(M, N, K)
        vals, meta, b = make_operands(M, N, K, torch.Generator(device="cuda").manual_seed(3))
        t = {}
        for fast in (True, False):
            _runtime.FAST_LAUNCH = fast
            PLANS.clear()
            try:
                t[fast] = host_time_us(lambda: sparse_gemm_fp4_fp8(vals, meta, b, cfg))
            except Exception as e:  # diagnostic only
                t[fast] = float("nan")
                print(f"host diag M={M} failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
        _runtime.FAST_LAUNCH = True
        PLANS.clear()
        lines.append(f"host (CPU) us per call, M={M} {_path(cfg)} {_cfg_name(cfg)}: direct launches {t[True]:.1f}, "
                     f"Triton's launcher {t[False]:.1f}")
    for s in lines:
        print(s, flush=True)
        log.write(s + "\n")
    return lines


def _write_json(out_dir, results) -> None:
    """All results of one run in ONE file (sparse_gemm.json): columns, sweep rows, picks, check, final rows."""
    if out_dir:
        with open(os.path.join(out_dir, "sparse_gemm.json"), "w") as f:
            json.dump({"columns": COLUMNS, **results}, f)


def _final_table(rows, N, K, dev, log) -> None:
    from .._bench import geomean, print_table

    title = (f"sparse_gemm_fp4_fp8 vs cuBLAS fp8 dense (torch._scaled_mm, A pre-expanded) and naive rebuild + fp32 "
             f"matmul, N={N} K={K}, {dev}, L2 flushed, medians of 50 (CUPTI GPU time and CUDA events)")
    md = print_table(title, COLUMNS, rows, markdown=True)
    log.write(md + "\n")
    summary = []
    small = [r for r in rows if r[0] <= 256]
    if small:
        summary.append(f"M<=256: min {min(r[9] for r in small):.2f}x, geomean {geomean([r[9] for r in small]):.2f}x "
                       f"vs cuBLAS fp8 by CUPTI (goal >= 1.2x)")
    for r in rows:
        if r[0] == 8192:
            summary.append(f"M=8192: {r[9]:.3f}x vs cuBLAS fp8 by CUPTI (goal >= 1.0x)")
    for s in summary:
        print(s)
        log.write(s + "\n")


if __name__ == "__main__":
    sys.exit(main())
