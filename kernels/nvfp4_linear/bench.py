"""Benchmark of the NVFP4 linear layer (in = out = 8192) and the NVFP4 quantizer on a CUDA GPU.

``python -m fp4ref.kernels.bench nvfp4_linear [--m 1 128 ...] [--markdown] [--sweep] [--check] [--json PATH]``

Per M (rows of x = batch * seq; the 16 public SOL-ExecBench nvfp4_linear_layer workloads have M = 128, 256,
512 x2, 1024 x3, 2048 x4, 4096, 8192 x3, 16384; decode sizes 1, 16, 64 are added), in ONE run, each timed by
fp4ref.kernels._bench.time_gpu (CUPTI GPU time per call, the headline figure, and CUDA-event time beside it;
10 warm-up + 50 timed calls, L2 flushed before every call, medians: FlashInfer's bench_gpu_time method):

* ours: ``nvfp4_linear(x, weight_fp4, weight_scales, weight_global_decode_scale)`` (quantize x + GEMM);
* (a) torch dequantize + matmul: the recipe in torch ops (quantize x, decode x and W to bf16 every call), bf16
  torch.matmul, times the global scales;
* (b) bf16 torch.matmul(x, W_bf16.T) on weights decoded ahead of time (cuBLAS; needs 4x the weight memory);
* the floor max(bytes floor, bf16 compute floor): bytes = x + packed W + W scales + y at the device-to-device
  copy bandwidth measured in the same run; compute = 2 M N K at the bf16 matmul rate measured in the same run
  (torch.matmul 8192^3);
* quantize alone (``nvfp4_quantize``) against its bytes floor: read x twice (the recipe needs the global amax
  before the first block scale, and x does not fit in L2 at large M), write codes + scales.

Every table prints CUPTI us and event us for ours and each peer, the ratio peer / ours by CUPTI, % of the floor
(by CUPTI) and the path + config that served the call; ours also its kernel sum, and a warning names the M where
the GPU idled inside our call (span > 1.25 x kernel sum: the host did not keep ahead, so the row measures it).
``--sweep`` times the candidate configs of ``nvfp4_linear`` per M (CUPTI), installs the fastest checked ones and
prints the table with them. ``--check`` only checks the default configs (fp4ref bound, NaN poison, determinism,
quantizer bytes) and exits 0 / 1.
Weights: randn fp32 [8192, 8192] quantized with the same 'sol' recipe (by our quantizer; the tests check it equals
fp4ref's). x: randn bf16. Nothing runs at import.
"""
from __future__ import annotations

import argparse
import json
import math
import os

__all__ = ["main", "torch_dequant_linear", "WORKLOAD_M"]

N = K = 8192
DEVICE = "cuda"  # the CPU smoke test sets "cpu" (and small N, K) to run the check logic under the interpreter
# M -> how many of the 16 public SOL-ExecBench nvfp4_linear_layer workloads have it
WORKLOAD_M = {128: 1, 256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 1, 8192: 3, 16384: 1}
DECODE_M = (1, 16, 64)
_FLT_MAX = 3.4028234663852886e38


def torch_dequant_linear(x, w_u8, w_scales, w_gdec: float):
    """Peer (a): the workload's recipe in plain torch ops, W decoded every call, bf16 matmul."""
    import torch

    # Every division is tensor / tensor: torch computes ``c / t`` as reciprocal(t) * c and, on CUDA, ``t / c`` as
    # t * fp32(1 / c), each two roundings, not the recipe's one IEEE division (tests/test_kernel_nvfp4.py checks
    # this reference against fp4ref on an x where that matters).
    k = x.shape[-1]
    x2 = x.reshape(-1, k).float()
    amax = x2.abs().amax()
    genc = torch.clamp(torch.full_like(amax, 2688.0) / amax, max=_FLT_MAX)
    genc = torch.where(genc == 0, torch.ones_like(genc), genc)
    gdec = torch.ones_like(genc) / genc
    xb = x2.view(x2.shape[0], k // 16, 16)
    bamax = xb.abs().amax(-1)
    s = torch.clamp((bamax / torch.full_like(bamax, 6.0)) * genc, -448.0, 448.0).to(torch.float8_e4m3fn).float()
    enc = torch.clamp(torch.ones_like(s) / (s * gdec), max=_FLT_MAX)
    y = torch.clamp(xb * enc[..., None], -6.0, 6.0)
    a = y.abs()
    v = (0.5 * ((a > 0.25).float() + (a >= 0.75).float() + (a > 1.25).float() + (a >= 1.75).float())
         + (a > 2.5).float() + (a >= 3.5).float() + 2.0 * (a > 5.0).float())
    xd = (torch.where(y < 0, -v, v) * s[..., None]).view(x2.shape[0], k).to(torch.bfloat16)
    if w_u8 is None:  # the sweep's sanity reference only needs x dequantized
        return xd, gdec
    wd = _decode_weight(w_u8, w_scales)
    out = (xd @ wd.T).float() * (gdec * w_gdec)
    return out.to(torch.bfloat16).view(*x.shape[:-1], wd.shape[0])


def _decode_weight(w_u8, w_scales):
    """NVFP4 weight [N, K/2] + scales [N, K/16] -> bf16 [N, K] = e2m1 * e4m3 (exact), torch ops."""
    import torch

    lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], device=w_u8.device)
    n = w_u8.shape[0]
    codes = torch.stack([w_u8 & 0xF, w_u8 >> 4], dim=-1).view(n, -1).long()
    scales = w_scales.view(torch.uint8).bitwise_and(0x7F).view(torch.float8_e4m3fn).float()  # UE4M3: sign ignored
    vals = lut[codes].view(n, -1, 16) * scales[..., None]
    return vals.view(n, -1).to(torch.bfloat16)


# The largest M the GEMV candidates are swept at: the GEMV costs one decode plus M FMAs per weight element on CUDA
# cores, so it loses to the tensor-core kernel beyond a few rows (the sweep finds where).
GEMV_MAX_M = 8


def _gemm_candidates():
    from fp4ref.kernels.gemm_fp16 import TmaConfig as G

    return [G(128, 256, 64, SPLIT_K=1, GROUP_M=8, num_warps=8, num_stages=3),
            G(128, 256, 64, SPLIT_K=1, GROUP_M=4, num_warps=8, num_stages=3),
            G(128, 128, 64, SPLIT_K=1, GROUP_M=8, num_warps=8, num_stages=4),
            G(256, 128, 64, SPLIT_K=1, GROUP_M=8, num_warps=8, num_stages=3),
            G(128, 128, 64, SPLIT_K=2, GROUP_M=8, num_warps=8, num_stages=4, PROGRAMS_PER_SM=2)]


def _candidates_in_kernel(m: int):
    from fp4ref.kernels.nvfp4_linear import TensorCoreConfig as C

    if m <= 16:
        # BLOCK_K = 256 builds use 178 registers (2 CTAs of 4 warps per SM); BLOCK_K = 128 ~100 (5 per SM)
        return [C(64, 16, 256, 4, 4, 4), C(64, 16, 256, 2, 4, 4), C(64, 16, 256, 8, 4, 4), C(64, 16, 512, 4, 4, 3),
                C(128, 16, 256, 4, 4, 4), C(64, 16, 128, 8, 4, 6), C(64, 16, 128, 16, 4, 4), C(64, 16, 128, 4, 4, 4),
                C(64, 16, 128, 8, 4, 4)]
    if m <= 64:
        return [C(64, 64, 128, 2, 4, 4), C(64, 64, 128, 4, 4, 4), C(64, 32, 256, 4, 4, 4), C(64, 64, 256, 2, 4, 3),
                C(64, 64, 128, 8, 4, 4), C(64, 64, 64, 8, 4, 4), C(64, 32, 128, 8, 4, 4)]
    if m <= 256:
        return [C(64, 128, 128, 2, 4, 3), C(128, 128, 128, 1, 8, 3), C(128, 128, 128, 2, 8, 3),
                C(64, 128, 128, 1, 4, 3), C(128, 64, 128, 2, 8, 4), C(64, 64, 128, 4, 4, 4)]
    return [C(128, 256, 64, 1, 8, 3), C(128, 128, 64, 1, 8, 4)]


def _gluon_candidates(m: int):
    """GluonConfig candidates per M bucket (BN, BM, SPLIT_K, STAGES, num_warps, X_STAGES): swap-AB, W decoded in
    registers; split-K at small M (the grid would underfill the SMs), 256-row x tiles with an x chunk ring above."""
    from fp4ref.kernels.nvfp4_linear import GluonConfig as G

    if m <= 8:
        tiles = [(64, 8, s, t, 4, 0) for s in (2, 4, 8) for t in (3, 4, 6)]
    elif m <= 16:
        tiles = [(64, 16, s, t, 4, 0) for s in (1, 2, 4) for t in (3, 4, 6)]
    elif m <= 32:
        tiles = [(64, 32, s, 4, 4, 0) for s in (1, 2, 4)]
    elif m <= 64:
        tiles = [(64, 64, s, t, 4, 0) for s in (1, 2) for t in (3, 4)]
    elif m <= 128:  # and two-part x tiles (64 + 16, 64 + 32 rows) for M that fits them
        tiles = [(64, 128, 1, 3, 4, 0), (64, 128, 2, 3, 4, 0), (128, 128, 2, 3, 8, 8), (64, 80, 1, 4, 4, 0),
                 (64, 96, 1, 3, 4, 0)]
    elif m <= 256:  # and two-part x tiles (128 + 32, 128 + 64 rows)
        tiles = [(64, 256, 1, t, 4, x) for t in (2, 3) for x in (4, 6)] + [(128, 128, 1, 3, 8, 8)] + [
            (64, bm, 1, t, 4, 6) for bm in (160, 192) for t in (2, 3)]
    else:
        tiles = [(128, 256, 1, 2, 8, 4), (128, 256, 1, 2, 8, 5), (128, 256, 1, 3, 8, 4), (64, 256, 1, 3, 4, 6),
                 (128, 160, 1, 3, 8, 6), (64, 192, 1, 3, 4, 6)]  # two-part x tiles
    out = [G(bn, bm, sk, st, num_warps=nw, X_STAGES=xs) for bn, bm, sk, st, nw, xs in tiles]
    if 8 < m <= 16:  # the GEMM started after the quantizer's stores measured faster here (docs/benchmarks.md)
        out += [G(bn, bm, sk, st, num_warps=nw, X_STAGES=xs, EARLY_START=False)
                for bn, bm, sk, st, nw, xs in tiles if sk == 2]
    # the K slices of a tile in one thread-block cluster, summed through distributed shared memory
    cluster = {8: [(2, 4), (2, 6), (4, 4), (4, 6), (8, 3)], 16: [(2, 4), (2, 6), (4, 4)], 32: [(2, 4), (4, 4)]}
    bm = next((b for b in cluster if m <= b), None)
    if bm:
        out += [G(64, bm, sk, st, CLUSTER=True) for sk, st in cluster[bm]]
        if bm == 16:
            out.append(G(64, 16, 2, 4, EARLY_START=False, CLUSTER=True))
    return out


def _dp4a_candidates(m: int):
    """Dp4aConfig candidates for m <= 8 (BN, SPLIT_K, STAGES, num_warps; BM = the next power of two >= m): 8192 /
    BN x SPLIT_K programs, 1-2 per SM (more programs, of fewer warps, measured slower on the H200)."""
    from fp4ref.kernels.nvfp4_linear import Dp4aConfig as D

    if m > 8:
        return []
    bm = 1 << (m - 1).bit_length()
    tiles = [(128, 2, 4, 8), (128, 2, 6, 8), (128, 2, 3, 8), (64, 2, 4, 8), (64, 4, 4, 8), (256, 2, 4, 8),
             (256, 1, 4, 8), (128, 1, 4, 8), (128, 4, 4, 8), (64, 2, 6, 4), (128, 2, 4, 4)]
    # (a thread's accumulator is 2 BM BN / (4 num_warps) fp32: 128 weight rows on 4 warps spill at BM >= 4)
    return [D(BN=bn, BM=bm, SPLIT_K=sk, STAGES=st, num_warps=nw) for bn, sk, st, nw in tiles
            if bm * bn // (4 * nw) <= 16]


def _gemv_candidates(m: int):
    """GemvConfig candidates for m <= GEMV_MAX_M: BLOCK_M = min(next pow2 of m, 4) x rows per program,
    (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages). N = 8192: 8192 / BLOCK_N * SPLIT_K programs (256 to 2048, i.e.
    2-16 per SM). Each thread holds rows of 2 consecutive blocks (16-byte loads; gemv.GEMV_VEC)."""
    from fp4ref.kernels.nvfp4_linear import GemvConfig as C

    if m > GEMV_MAX_M:
        return []
    bm = 1 if m == 1 else 2 if m == 2 else 4
    if bm == 1:  # sm_90 build: 72 registers, 6.1 SASS instructions per weight element (BLOCK_N 64, BLOCK_K 256)
        tiles = [(64, 256, 4, 4, 1), (64, 256, 2, 4, 1), (32, 256, 4, 4, 1), (64, 512, 4, 4, 1), (128, 256, 2, 8, 1),
                 (64, 256, 8, 4, 1), (32, 512, 8, 4, 1), (128, 128, 4, 4, 1), (16, 512, 4, 4, 1), (64, 256, 4, 8, 1)]
    else:  # small tiles: BLOCK_N 64 x BLOCK_K 256 with 4 warps needs 250 registers at BLOCK_M 4 (2 CTAs per SM)
        tiles = [(32, 256, 4, 4, 1), (32, 256, 8, 4, 1), (32, 512, 4, 4, 1), (16, 512, 4, 4, 1), (16, 256, 8, 4, 1),
                 (32, 128, 8, 4, 1), (64, 256, 4, 8, 1), (32, 256, 2, 4, 1)]
    return [C(bn, bm, bk, sk, nw, ns) for bn, bk, sk, nw, ns in tiles]


def linear_candidates(m: int):
    """nvfp4_linear candidates at M = m: the CONFIGS row for m, the Gluon configs, the DP4A configs (m <= 8), the
    GEMV configs (m <= GEMV_MAX_M), the tensor-core
    configs (cvt decode and DECODE_BITS twins) and, for m >= 128, the pre-pass path with each TMA GEMM tile
    candidate (the "fp32" pre-pass), for m >= 512 also the word ("cvt") pre-pass tiles with the first GEMM tile."""
    import dataclasses

    from fp4ref.kernels.nvfp4_linear import PrepassConfig, pick_config

    base = _candidates_in_kernel(m)
    out = _dp4a_candidates(m) + _gluon_candidates(m) + _gemv_candidates(m) + base
    table = pick_config(m, N, K, interpreter=False)  # the shipped row always competes: a sweep never loses it
    if table not in out:
        out.insert(0, table)
    out += [dataclasses.replace(c, DECODE_BITS=True) for c in base]
    if m >= 128:
        out += [PrepassConfig(gemm=g) for g in _gemm_candidates()]
    if m >= 512:
        out += [PrepassConfig(_gemm_candidates()[0], *t) for t in PREPASS_TILES]
    return out


def all_linear_candidates():
    """Every candidate any sweep M may time (the sm_90 compile test builds them all)."""
    seen = []
    for m in SWEEP_M:
        for c in linear_candidates(m):
            if c not in seen:
                seen.append(c)
    return seen


# weight pre-pass tiles (BLOCK_R, BLOCK_C, num_warps, mode) swept at M >= 512 (PrepassConfig): "cvt" word decode,
# ~5.1 SASS instructions per element on sm_90 against ~14.6 for "fp32" (all 16-byte stores)
PREPASS_TILES = [(16, 512, 4, "cvt"), (8, 1024, 4, "cvt"), (32, 512, 4, "cvt"), (16, 1024, 4, "cvt"),
                 (32, 512, 8, "cvt"), (64, 256, 8, "cvt")]
# quantize tiles (BLOCK_R, BLOCK_C, num_warps) swept for QUANTIZE_CONFIGS
QUANT_TILES = [(4, 1024, 4), (8, 1024, 4), (8, 1024, 8), (16, 1024, 4), (16, 1024, 8), (32, 1024, 8), (16, 512, 8)]
SWEEP_M = (1, 2, 4, 8, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _cfg_label(cfg) -> str:
    """The path and its config, short: gemv / tc / prepass / gluon."""
    t = type(cfg).__name__
    if t == "PrepassConfig":
        g = cfg.gemm
        return (f"prepass[{cfg.BLOCK_R},{cfg.BLOCK_C},w{cfg.num_warps},{cfg.mode}]+tma {g.BLOCK_M}x{g.BLOCK_N}x"
                f"{g.BLOCK_K}/S{g.SPLIT_K}/G{g.GROUP_M}/w{g.num_warps}/s{g.num_stages}/P{g.PROGRAMS_PER_SM}")
    if t == "GemvConfig":
        return f"gemv {cfg.BLOCK_N},{cfg.BLOCK_M},{cfg.BLOCK_K},{cfg.SPLIT_K},{cfg.num_warps},{cfg.num_stages}"
    if t == "Dp4aConfig":
        return (f"dp4a {cfg.BN},{cfg.BM},{cfg.SPLIT_K},st{cfg.STAGES},w{cfg.num_warps}"
                + ("" if cfg.EARLY_START else ",late"))
    if t == "GluonConfig":
        return (f"gluon {cfg.BN},{cfg.BM},{cfg.SPLIT_K},st{cfg.STAGES},w{cfg.num_warps}"
                + (f",xs{cfg.X_STAGES}" if cfg.X_STAGES else "") + ("" if cfg.W_SWIZZLE else ",noswz")
                + ("" if cfg.EARLY_START else ",late") + (",cluster" if cfg.CLUSTER else ""))
    return (f"tc {cfg.BLOCK_N},{cfg.BLOCK_M},{cfg.BLOCK_K},{cfg.SPLIT_K},{cfg.num_warps},{cfg.num_stages}"
            + (",bits" if cfg.DECODE_BITS else "") + (",words" if cfg.SCALE_WORDS else ""))


def _cfg_json(cfg) -> dict:
    import dataclasses

    return {"type": type(cfg).__name__, **dataclasses.asdict(cfg)}


def _cfg_from_json(d):
    from fp4ref.kernels import nvfp4_linear as nvl
    from fp4ref.kernels.gemm_fp16 import TmaConfig

    d = dict(d)
    cls = {"GemvConfig": nvl.GemvConfig, "TensorCoreConfig": nvl.TensorCoreConfig,
           "PrepassConfig": nvl.PrepassConfig, "GluonConfig": nvl.GluonConfig, "Dp4aConfig": nvl.Dp4aConfig}[
        d.pop("type")]
    if "gemm" in d:
        g = dict(d["gemm"])
        g.pop("kernel", None)
        d["gemm"] = TmaConfig(**g)
    return cls(**d)


def _compile_worker(job: str) -> str:
    """Run one (config, M) once so triton's on-disk cache holds its build for the main process."""
    import torch

    from fp4ref.kernels import nvfp4_linear as nvl

    d = json.loads(job)
    m = d["m"]
    try:
        x = torch.randn((m, K), device="cuda", dtype=torch.float32).to(torch.bfloat16)
        if "tile" in d:
            nvl.nvfp4_quantize(x, config=nvl.QuantizeConfig(*d["tile"]))
        else:
            w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda")
            s = torch.randint(0, 0x70, (N, K // 16), dtype=torch.uint8, device="cuda")
            nvl.nvfp4_linear(x, w, s, 1.0, config=_cfg_from_json(d["cfg"]))
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:  # noqa: BLE001 - reported by the caller
        return f"{type(e).__name__}: {str(e)[:300]}"


def precompile(jobs, workers: int) -> None:
    """Compile jobs (dicts: {"m", "cfg"} or {"m", "tile"}) in parallel spawned processes (shared on-disk cache)."""
    from .._bench import compile_in_pool

    compile_in_pool(_compile_worker, sorted({json.dumps(j, sort_keys=True) for j in jobs}), workers, "jobs")


def _spec_m(m: int) -> int:
    """A small M compiling the same kernels as m for the sweep's M values (M = 1 is a constant to Triton; the
    quantize tile's rows are capped by M up to 32)."""
    return m if m in (1, 2, 4, 8, 16) else 64


def _precompile_jobs(ms):
    jobs = [{"m": _spec_m(m), "cfg": _cfg_json(c)} for m in ms for c in linear_candidates(m)]
    jobs += [{"m": _spec_m(m), "tile": list(t)} for m in ms for t in QUANT_TILES]
    return jobs


def _profile(ms, w_u8, w_scales, w_gdec):
    """GPU time per kernel of one nvfp4_linear call (torch.profiler, mean of 10 calls), without host overhead."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from fp4ref.kernels.nvfp4_linear import nvfp4_linear

    for m in ms:
        x = _x(m)
        for _ in range(3):
            nvfp4_linear(x, w_u8, w_scales, w_gdec)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                nvfp4_linear(x, w_u8, w_scales, w_gdec)
            torch.cuda.synchronize()
        parts = []
        total = 0.0
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None)
            if t is None:
                t = getattr(e, "cuda_time_total", 0.0)
            if t and e.count:
                parts.append(f"{e.key[:28]} {t / 10:.1f}")
                total += t / 10
        print(f"profile M={m}: GPU {total:.1f} us per call: " + "; ".join(parts))


def _setup(device=None):
    import torch

    device = DEVICE if device is None else device
    from fp4ref.kernels.nvfp4_linear import nvfp4_quantize

    g = torch.Generator(device=device).manual_seed(1234)
    w = torch.randn((N, K), generator=g, device=device, dtype=torch.float32)
    w_u8, w_scales, w_gdec = nvfp4_quantize(w)
    del w
    return w_u8, w_scales, float(w_gdec.item())


def _x(m: int, device=None):
    import torch

    device = DEVICE if device is None else device
    g = torch.Generator(device=device).manual_seed(m)
    return torch.randn((1, m, K), generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)


def _ceilings():
    """(copy bandwidth bytes/s counting read + write, bf16 matmul FLOP/s), measured now by CUPTI (L2 flushed)."""
    import torch

    from .._bench import time_gpu

    a = torch.empty(2**28, dtype=torch.float32, device="cuda").normal_()
    b = torch.empty_like(a)
    t_copy = time_gpu(lambda: b.copy_(a), warmup=5, iters=20).cupti_us
    bw = 2 * a.numel() * 4 / (t_copy * 1e-6)
    del a, b
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_mm = time_gpu(lambda: x @ y.T, warmup=5, iters=20).cupti_us
    return bw, 2 * 8192**3 / (t_mm * 1e-6)


def _sweep(ms, w_u8, w_scales, w_gdec, iters):
    """Time every candidate per M by CUPTI (time_gpu, L2 flushed); returns (rows, best linear config per M, best
    quantize tile per M). A candidate is timed only after its output passed a sanity reference (fp32 matmul)."""
    import torch

    from fp4ref.kernels import nvfp4_linear as nvl
    from fp4ref.kernels.nvfp4_linear import prepass

    from .._bench import time_gpu

    rows, best, best_q = [], {}, {}
    w_f32 = _decode_weight(w_u8, w_scales).float()  # exact
    # the large-M path's weight pre-pass alone (M-independent; shown as M = 0): exact? GPU us, and the bandwidth
    # of its bytes (read N K / 2 + N K / 16, write 2 N K)
    wdq = torch.empty((N, K), dtype=torch.float16, device=w_u8.device)
    ws_u8 = w_scales.view(torch.uint8)
    pre_bytes = N * K // 2 + N * K // 16 + 2 * N * K
    for tile in [(16, 512, 4, "fp32")] + PREPASS_TILES:
        kw = dict(zip(("BLOCK_R", "BLOCK_C", "num_warps", "mode"), tile))
        try:
            wdq.fill_(float("nan"))
            prepass.decode_weight(w_u8, ws_u8, wdq, **kw)
            if not torch.equal(wdq.float(), w_f32):
                rows.append([0, f"W pre-pass {tile}", "WRONG: not the exact decode", "", ""])
                continue
            t = time_gpu(lambda: prepass.decode_weight(w_u8, ws_u8, wdq, **kw), iters=iters)
        except Exception as exc:  # noqa: BLE001 - report, keep going
            rows.append([0, f"W pre-pass {tile}", f"failed: {type(exc).__name__}: {str(exc)[:80]}", "", ""])
            continue
        rows.append([0, f"W pre-pass {tile} ({pre_bytes / (t.cupti_us * 1e-6) / 1e12:.2f} TB/s)", t.cupti_us,
                     t.event_us, t.kernels])
    del wdq
    for m in ms:
        x = _x(m)
        # sanity reference (fp32 matmul of the exactly dequantized operands, no TF32): a candidate whose output
        # is off by more than 2^-7 of the largest |y| is broken (a wrong decode gives garbage) and cannot be picked
        xd, gdec = torch_dequant_linear(x, None, None, w_gdec)
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        ref = (xd.float() @ w_f32.T) * (gdec * w_gdec)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        tol = float(ref.abs().max()) * 2.0**-7
        del xd
        for cfg in linear_candidates(m):
            try:
                y = nvl.nvfp4_linear(x, w_u8, w_scales, w_gdec, config=cfg).reshape(m, N).float()
                err = float((y - ref).abs().max())
                if not err <= tol:
                    rows.append([m, _cfg_label(cfg), f"WRONG: max |y - ref| {err:.3g} > {tol:.3g}", "", ""])
                    continue
                del y
                t = time_gpu(lambda: nvl.nvfp4_linear(x, w_u8, w_scales, w_gdec, config=cfg), iters=iters)
            except Exception as exc:  # noqa: BLE001 - a config the GPU rejects: report, keep going
                rows.append([m, _cfg_label(cfg), f"failed: {type(exc).__name__}: {str(exc)[:80]}", "", ""])
                continue
            rows.append([m, _cfg_label(cfg), t.cupti_us, t.event_us, t.kernels])
            if m not in best or t.cupti_us < best[m][1]:
                best[m] = (cfg, t.cupti_us)
        x2 = x.reshape(m, K)
        for tile in QUANT_TILES:  # packed output (nvfp4_quantize)
            qc = nvl.QuantizeConfig(*tile)
            try:
                t = time_gpu(lambda: nvl.nvfp4_quantize(x2, config=qc), iters=iters)
            except Exception as exc:  # noqa: BLE001
                rows.append([m, f"quantize tile {tile}", f"failed: {type(exc).__name__}: {str(exc)[:80]}", "", ""])
                continue
            rows.append([m, f"quantize tile {tile}", t.cupti_us, t.event_us, t.kernels])
            if m not in best_q or t.cupti_us < best_q[m][1]:
                best_q[m] = (tile, t.cupti_us)
        del x, x2, ref
    del w_f32
    return rows, best, best_q


def _install_picks(best, best_q, ms=()):
    """Make the picks the defaults of this process: CONFIGS / QUANTIZE_CONFIGS rows at the sweep's M values (each
    row covers the M values above the previous one; the last M's pick serves every larger M). An M of ``ms``
    without a pick (every candidate failed its check) keeps what the in-file defaults give it. Forgets the
    launch plans made with the old tables."""
    from fp4ref.kernels import _runtime
    from fp4ref.kernels import nvfp4_linear as nvl
    from fp4ref.kernels.nvfp4_linear import configs

    ms = sorted(set(best) | set(best_q) | set(ms))
    if not ms:
        return
    lin = {m: best[m][0] if m in best else nvl.pick_config(m, N, K) for m in ms}
    qt = {m: nvl.QuantizeConfig(*best_q[m][0]) if m in best_q else configs.QUANTIZE_CONFIGS.pick(m) for m in ms}
    table = _runtime.ConfigTable(rows=tuple((m, lin[m]) for m in ms[:-1]), larger=lin[ms[-1]])
    qtable = _runtime.ConfigTable(rows=tuple((m, qt[m]) for m in ms[:-1]), larger=qt[ms[-1]])
    # pick_config reads configs.CONFIGS on a GPU and configs.INTERPRETER_CONFIGS in the interpreter
    configs.CONFIGS = nvl.CONFIGS = configs.INTERPRETER_CONFIGS = nvl.INTERPRETER_CONFIGS = table
    configs.QUANTIZE_CONFIGS = nvl.QUANTIZE_CONFIGS = qtable
    _runtime.clear_plans()


def _check_picks(ms, w_u8, w_scales, w_gdec, quant_ms=(1, 128, 1024)):
    """Correctness of the installed defaults: NaN-poisoned output, fp4ref's exact reference and the config's
    bound on a row subset, two calls bitwise equal; the quantizer's bytes equal fp4ref's (whole x) at quant_ms."""
    import dataclasses

    import ml_dtypes
    import numpy as np
    import torch

    from fp4ref import bounds, gemm
    from fp4ref.blockscale import nvfp4_quantize as ref_quantize
    from fp4ref.kernels import nvfp4_linear as nvl

    rng = np.random.default_rng(0)
    cols = np.unique(np.concatenate([np.arange(32), np.arange(N - 32, N), rng.choice(N, min(N, 192), replace=False)]))
    wq = dataclasses.replace(ref_quantize(np.zeros((len(cols), K), np.float32), recipe="sol"),
                             codes=w_u8.cpu().numpy()[cols], scales=w_scales.view(torch.uint8).cpu().numpy()[cols],
                             global_decode_scale=np.float32(w_gdec), shape=(len(cols), K))
    interp = os.environ.get("TRITON_INTERPRET") == "1"  # the CPU smoke test
    contract = nvl.NUMERIC_CONTRACT
    ok_all = True
    for m in ms:
        x = _x(m)
        x_np = x.reshape(m, K).cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        out = torch.full((1, m, N), float("nan"), dtype=torch.bfloat16, device=x.device)
        y = nvl.nvfp4_linear(x, w_u8, w_scales, w_gdec, out=out)
        y2 = nvl.nvfp4_linear(x, w_u8, w_scales, w_gdec)
        det = bool(torch.equal(y.view(torch.int16), y2.view(torch.int16)))
        nan = int(torch.isnan(y).sum().item())
        rows = np.unique(np.array([0, 1, m // 2, m - 2, m - 1]).clip(0, m - 1))
        amax = float(np.abs(x_np.astype(np.float32)).max())
        xs = ref_quantize(x_np[rows], recipe="sol", global_amax=amax)  # x's global scale, these rows
        ref = gemm.nvfp4_gemm(xs, wq)
        got = y.reshape(m, N)[torch.from_numpy(rows).to(y.device)][:, torch.from_numpy(cols).to(y.device)]
        got = got.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        cfg = contract.config_for(m, N, K, interp)
        model = contract.model_for(cfg, K, interp, M=m, N=N)  # per config (the GEMV's is tighter)
        rep = bounds.check(got, ref, model, output_rounding=contract.rounding_for(interp), poison=float("nan"))
        qok = None
        if m in quant_ms:
            xq = ref_quantize(x_np, recipe="sol")
            q, sc, g = nvl.nvfp4_quantize(x)
            qok = bool(np.array_equal(q.cpu().numpy(), xq.codes.reshape(m, K // 2))
                       and np.array_equal(sc.view(torch.uint8).cpu().numpy(), xq.scales.reshape(m, K // 16))
                       and np.float32(g.item()).view(np.uint32) == np.float32(xq.global_decode_scale).view(np.uint32))
        ok = rep.ok and det and nan == 0 and qok is not False
        ok_all &= ok
        print(f"check M={m} ({_cfg_label(cfg)}): {'OK' if ok else 'FAIL'}; bound "
              f"{'ok' if rep.ok else 'VIOLATED'} (max err/bound {rep.max_err_over_bound:.3g}, bitwise-equal "
              f"{100 * rep.bitwise_equal_fraction:.1f}%), NaN left {nan}, deterministic {det}, quantizer bytes "
              f"{'-' if qok is None else qok}", flush=True)
    return ok_all


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp4ref.kernels.bench nvfp4_linear", description=__doc__.split("\n")[0])
    p.add_argument("--m", type=int, nargs="*", help="rows of x (default: 1 16 64 and the public sizes)")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown (for docs/benchmarks.md)")
    p.add_argument("--sweep", action="store_true",
                   help="tune: precompile and time every candidate per M (CUPTI), install the picks, check them "
                        "(fp4ref, NaN-poisoned), then print the table with the picks")
    p.add_argument("--check", action="store_true",
                   help="only check the default configs at each M (fp4ref bound, NaN poison, determinism, quantizer "
                        "bytes); exit status 0 when all pass")
    p.add_argument("--sweep-iters", type=int, default=20, help="timed calls per candidate in the sweep (default 20)")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2), help="parallel compiles")
    p.add_argument("--iters", type=int, default=50, help="timed calls (default 50, as the public benchmarks)")
    p.add_argument("--json", help="also write the numbers to this JSON file")
    p.add_argument("--profile", action="store_true", help="print GPU time per kernel (torch.profiler) instead")
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("nvfp4_linear benchmark: needs a CUDA GPU (torch.cuda.is_available() is False)")
        return 2

    from fp4ref.kernels import nvfp4_linear as nvl

    from .._bench import idle_inside, print_table, time_gpu

    ms = args.m or list(SWEEP_M)
    result = {}
    if args.sweep:
        precompile(_precompile_jobs(ms), args.workers)
    w_u8, w_scales, w_gdec = _setup()
    if args.check:
        return 0 if _check_picks(ms, w_u8, w_scales, w_gdec) else 1
    if args.profile:
        _profile(ms, w_u8, w_scales, w_gdec)
        return 0
    if args.sweep:
        import time

        t0 = time.time()
        rows, best, best_q = _sweep(ms, w_u8, w_scales, w_gdec, args.sweep_iters)
        print_table("nvfp4_linear sweep (us per call, L2 flushed; path BLOCK_N,BLOCK_M,BLOCK_K,SPLIT_K,warps,stages"
                    "[,bits] or prepass tile + TMA GEMM tile)", ["M", "path config", "CUPTI us", "event us",
                                                                 "kernels"], rows, markdown=args.markdown)
        print(f"sweep took {time.time() - t0:.1f} s", flush=True)
        for m in ms:
            lin = (f"{_cfg_label(best[m][0])} {best[m][1]:.1f} us" if m in best else "NONE valid (every candidate "
                   f"failed; keeps the in-file default {_cfg_label(nvl.pick_config(m, N, K))})")
            qt = f"{best_q[m][0]} {best_q[m][1]:.1f} us" if m in best_q else "NONE valid (keeps the in-file default)"
            print(f"pick M={m}: {lin}; quantize tile {qt}", flush=True)
        _install_picks(best, best_q, ms)
        print(f"CONFIGS = {nvl.CONFIGS!r}")
        print(f"QUANTIZE_CONFIGS = {nvl.QUANTIZE_CONFIGS!r}", flush=True)
        result["sweep"] = rows
        result["picks"] = {m: [_cfg_json(best[m][0]) if m in best else None, best[m][1] if m in best else None,
                               list(best_q[m][0]) if m in best_q else None, best_q[m][1] if m in best_q else None]
                           for m in ms}
        t0 = time.time()
        try:
            result["checks_ok"] = _check_picks(ms, w_u8, w_scales, w_gdec)
        except Exception as exc:  # noqa: BLE001 - report it; the table below must still run
            print(f"checks crashed: {type(exc).__name__}: {exc}", flush=True)
            result["checks_ok"] = False
        print(f"checks {'PASSED' if result['checks_ok'] else 'FAILED'} in {time.time() - t0:.1f} s", flush=True)
        if args.json:  # written now too, in case the table does not finish in time
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1, default=str)

    bw, flops = _ceilings()
    w_bf16 = _decode_weight(w_u8, w_scales)
    rows, qrows, records = [], [], []
    for m in ms:
        x = _x(m)
        t_ours = time_gpu(lambda: nvl.nvfp4_linear(x, w_u8, w_scales, w_gdec), iters=args.iters)
        t_a = time_gpu(lambda: torch_dequant_linear(x, w_u8, w_scales, w_gdec), iters=args.iters)
        t_b = time_gpu(lambda: torch.matmul(x, w_bf16.T), iters=args.iters)
        t_q = time_gpu(lambda: nvl.nvfp4_quantize(x), iters=args.iters)
        t_qa = time_gpu(lambda: torch_dequant_linear(x, None, None, w_gdec), iters=args.iters)
        bytes_lin = m * K * 2 + N * K // 2 + N * K // 16 + m * N * 2
        floor = max(bytes_lin / bw, 2.0 * m * N * K / flops) * 1e6
        q_floor = (2 * m * K * 2 + m * K // 2 + m * K // 16) / bw * 1e6  # x read twice: amax, then quantize
        label = _cfg_label(nvl.pick_config(m, N, K))
        rec = dict(m=m, config=label, ours=t_ours, torch_dequant=t_a, bf16_predequant=t_b, floor_us=floor,
                   quantize=t_q, quantize_torch=t_qa, quantize_floor_us=q_floor)
        records.append(rec)
        rows.append([m, label, t_ours.cupti_us, t_ours.kernel_sum_us, t_ours.event_us, t_a.cupti_us, t_a.event_us,
                     t_a.cupti_us / t_ours.cupti_us, t_b.cupti_us, t_b.event_us, t_b.cupti_us / t_ours.cupti_us,
                     floor, 100.0 * floor / t_ours.cupti_us])
        qrows.append([m, t_q.cupti_us, t_q.event_us, t_qa.cupti_us, t_qa.event_us, t_qa.cupti_us / t_q.cupti_us,
                      q_floor, 100.0 * q_floor / t_q.cupti_us])
    dev = torch.cuda.get_device_name()
    title = (f"NVFP4 linear N = K = 8192 on {dev} (us per call, medians of {args.iters}, L2 flushed; CUPTI = GPU "
             f"span of the call, kernel sum = its kernels' CUPTI durations added, event = CUDA events; copy "
             f"{bw / 1e12:.2f} TB/s, bf16 matmul {flops / 1e12:.0f} TFLOP/s measured in this run)")
    cols = ["M", "path config", "ours CUPTI", "ours kernel sum", "ours event", "(a) torch dequant+mm CUPTI",
            "(a) event", "(a)/ours", "(b) bf16 mm, W pre-dequant CUPTI", "(b) event", "(b)/ours", "floor",
            "ours % of floor"]
    print_table(title, cols, rows, markdown=args.markdown)
    print_table(f"NVFP4 quantize of x [M, 8192] on {dev} (us per call; peer: the recipe in torch ops, x dequantized)",
                ["M", "ours CUPTI", "ours event", "torch recipe CUPTI", "torch event", "torch/ours", "floor",
                 "ours % of floor"], qrows, markdown=args.markdown)
    pub = [r for r in records if r["m"] in WORKLOAD_M]
    if pub:
        weights = [WORKLOAD_M[r["m"]] for r in pub]
        gm = lambda key: math.exp(sum(w * math.log(r[key].cupti_us / r["ours"].cupti_us)  # noqa: E731
                                      for w, r in zip(weights, pub)) / sum(weights))
        print(f"16 public workloads, geometric mean speed-up of ours (CUPTI): vs (a) {gm('torch_dequant'):.2f}x, "
              f"vs (b) {gm('bf16_predequant'):.2f}x")
    idle = [r["m"] for r in records if idle_inside(r["ours"])]
    if idle:  # the span then measures the host: say so beside the table
        print(f"warning: at M = {', '.join(map(str, idle))} the GPU idled inside our call (CUPTI span > 1.25 x the "
              "kernel sum): the host did not keep ahead of the GPU; rerun on an idle host machine")
    if args.sweep:  # where the GPU time of the picks goes, per kernel
        try:
            _profile([m for m in (1, 256, 1024, 8192) if m in ms], w_u8, w_scales, w_gdec)
        except Exception as exc:  # noqa: BLE001 - a diagnostic
            print(f"profile failed: {type(exc).__name__}: {exc}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "copy_bytes_per_s": bw, "bf16_flops": flops,
                       "rows": [{k: (v.__dict__ if hasattr(v, "cupti_us") else v) for k, v in r.items()}
                                for r in records], **result}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
