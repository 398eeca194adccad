"""NVFP4 quantize and NVFP4 linear layer (in = out = 8192 workload) for Hopper (sm_90), in Triton.

Workload: SOL-ExecBench "nvfp4_linear_layer" (/work/shared/facts/seeds.md §2): y = x @ W^T with x quantized per call
to NVFP4 by the recipe fp4ref names "sol", W given as NVFP4 (E2M1 codes, E4M3FN block scales, fp32 global decode).

Pipeline (no host synchronisation):

1. ``_amax_kernel``: per program, max |x| over a grid-stride slice as fp32 bit patterns (int32 max of the
   sign-cleared bits: exact), one partial per program (no atomics; max is order-free: deterministic).
2. ``nvfp4_quantize_kernel``: every program reduces the partials to the global amax, derives the global
   encode/decode scales and quantizes its [BLOCK_R, BLOCK_C] tile, 16-element blocks along K, with the "sol" recipe
   bit for bit (RECIPE): IEEE divisions (div.rn, no FTZ), the E4M3 rounding in integer arithmetic, the E2M1
   rounding by an exact magic add. Writes packed E2M1 codes + E4M3FN block-scale bytes (``nvfp4_quantize``) or,
   for the linear layer, the dequantized values code * block scale as fp16 (exact) and the epilogue scale.
3. The GEMM, one of two paths (``LinearConfig.GEMM``):
   * ``nvfp4_linear_kernel`` (small M): C^T tile = W_tile @ X_tile^T ("swap AB": weight rows are the MMA M
     dimension, so M = 1..64 wastes no tensor-core work beyond BLOCK_M = 16). W is decoded in registers from
     32-bit words of packed codes, either by E2M1 code c -> E4M3FN byte (c & 7) << 2 | (c & 8) << 4 (exactly
     E2M1(c) * 2^-6) and cvt.rn.f16x2.e4m3x2, or (DECODE_BITS) by placing c's bits as the fp16 E2M1(c) * 2^-14
     (no conversion instruction); then times fp16(block scale) * 2^6. Every E2M1 x E4M3 product has <= 6
     significant bits and lies in [2^-10, 2688] (or is 0): exact in fp16 (DECODE_BITS: times 2^-8, still exact;
     the accumulator is multiplied back by 2^8, exactly), so the tensor-core products are exact. fp32
     accumulation (Hopper wgmma). Split-K (small M): each program stores an fp32 partial; the last program to
     arrive at an output tile (atomic counter) sums the SPLIT_K partials in the fixed order s = 0, 1, ... .
   * pre-pass (large M): ``nvfp4_decode_weight_kernel`` decodes W to a cached fp16 workspace [N, K] (2 N K
     bytes, exact), then gemm_fp16.gemm_tma (persistent TMA GEMM) on the fp16 x and W with the device-side
     epilogue scale.
   * GEMV (``LinearConfig.GEMV``, batch-1 decode, M <= a few rows): ``nvfp4_gemv_kernel`` on CUDA cores, one
     integer decode per weight element (E2M1 code -> fp32 bits E2M1(c) * 2^-126) and one fp32 FMA per row of x;
     each 16-element block's dot product is exact in fp32, only the K/16 block terms are added with rounding
     (model ``accumulation_model(config, K)``; the derivation is above the kernel).
   Epilogue: acc * fp32(x_global_decode * weight_global_decode) (two fp32 RNE multiplies), one RNE rounding to
   bf16.

Bitwise deterministic: no floating-point atomics (the amax atomic is an integer max), fixed reduction orders.
Limits: any M >= 1; N and K multiples of 16; x contiguous; finite x (NaN / inf are outside the contract: the recipe
has no NaN policy and the op does not synchronise to check). The amax partials, split-K counters and weight
workspaces (and, after two identical calls, a cached launch plan with its scratch buffers) are kept per (device,
stream): calls on one stream are ordered; concurrent calls from several host threads are not supported.
Nothing runs at import.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fp4ref import bounds as _bounds

from ._launch import hooks_installed, launch_compiled, raw_launcher
from .gemm_fp16 import GemmConfig, gemm_tma

__all__ = [
    "NUMERIC_CONTRACT",
    "RECIPE",
    "LinearConfig",
    "LINEAR_CONFIGS",
    "GEMV_MAX_M",
    "accumulation_model",
    "QUANT_CONFIGS",
    "clear_workspaces",
    "pick_linear_config",
    "nvfp4_quantize",
    "nvfp4_linear",
]

# ---------------------------------------------------------------------------------------------------------------
# Numeric contract
# ---------------------------------------------------------------------------------------------------------------
RECIPE = "sol"  # fp4ref.blockscale.nvfp4_quantize(x, recipe="sol") bytes, for every input (NaN excepted, see below)

NUMERIC_CONTRACT = {
    # fp4ref.bounds model of the GEMM on the GPU: exact fp16 products (E2M1 x E4M3 values), Hopper wgmma fp32
    # accumulation (k = 16 products per step, F = 25 alignment bits, RZ). Split-K configs accumulate chunks of
    # K/SPLIT_K with the same model and add the SPLIT_K fp32 partials in fixed order (RN); that error,
    # eps(K/S) + gamma_{S-1}(2^-24), stays below eps(K) of the unsplit model for every K >= 16, so this one model
    # bounds every config.
    "accumulation_model": "hopper_fp16_wgmma",
    # In the CPU interpreter tl.dot is a numpy fp32 matmul: recursive fp32 RN summation, any order.
    "accumulation_model_interpreter": "fp32_rn",
    # epilogue: acc * fp32(x_global_decode * weight_global_decode): two fp32 RNE multiplies (fp4ref.gemm's
    # Reference.epilogue_multiplies = 2), then ONE rounding to bf16.
    "epilogue_multiplies": 2,
    "output_rounding": "rne",
    "output_rounding_interpreter": "faithful",  # the interpreter truncates fp32 -> bf16 stores
    # the quantizer: fp4ref.blockscale.nvfp4_quantize(x, recipe="sol") bit for bit (codes, scale bytes, global
    # decode scale) for every finite x; NaN/inf in x are outside the contract (the recipe has no NaN policy and
    # the op does not synchronise to check).
    "quantize_recipe": RECIPE,
    # GEMV configs (LinearConfig.GEMV, nvfp4_gemv_kernel) accumulate differently and more tightly: each
    # 16-element block's dot product is EXACT in fp32 and only the K/16 block terms are added in fp32 (RN), per
    # K split, then the fixed-order split-K sum: splitk(fp32_rn_block16, C) with C the split's length in
    # products (accumulation_model(config, K) gives the name; GPU and interpreter alike). fp32_rn_block16 is
    # the fp32 recursive sum of K/16 terms: gamma_{K/16}(2^-24) = gamma_K(2^-28), registered below.
    "accumulation_model_gemv": "splitk(fp32_rn_block16, C)",
    # weight_global_decode_scale is rounded to fp32 (RNE) once; the workload passes fp32 values (exact).
}

_FP32_MAX = 3.4028234663852886e38
_E4M3_MAX = 448.0
_E2M1_MAX = 6.0


# ---------------------------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LinearConfig:
    """Tile configuration of ``nvfp4_linear_kernel`` (MMA rows = weight rows N, MMA columns = x rows M)."""

    BLOCK_N: int  # weight rows per program (wgmma M dimension; multiple of 64 for wgmma)
    BLOCK_M: int  # x rows per program (wgmma N dimension; >= 16)
    BLOCK_K: int  # K per step (multiple of 32: two E2M1 per byte, 16-element blocks)
    SPLIT_K: int  # programs along K; > 1: fp32 partials, summed by the tile's last program (fixed order)
    num_warps: int
    num_stages: int
    SCALE_WORDS: bool = False  # block scales as int32 words: bitwise equal on the H200, but 0.77-1.02x (docs/kernels.md)
    DECODE_BITS: bool = False  # decode by bit placement + f16x2 multiply instead of cvt e4m3x2 (_DECODE_BITS_PTX)
    # Large-M path when set (a gemm_fp16.GemmConfig, "tma" kernel): W decoded to a cached fp16 workspace
    # (2 N K bytes), x dequantized to fp16, the TMA GEMM (gemm_tma) with the fp32 epilogue scale, bf16 out. The
    # fields above are then unused.
    GEMM: object = None
    # Large-M path only: the weight pre-pass tile (BLOCK_R, BLOCK_C, num_warps, mode); None = _DECODE_TILE. mode
    # "fp32": nvfp4_decode_weight_kernel (byte loads, fp32 value x fp32 scale, converted); "cvt":
    # nvfp4_decode_weight_words_kernel (32-bit code words, the in-kernel path's cvt.rn.f16x2.e4m3x2 decode, 8
    # consecutive fp16 per word: 16-byte stores).
    PREPASS: tuple = None
    # CUDA-core GEMV path (nvfp4_gemv_kernel) when set: BLOCK_N weight rows x BLOCK_K columns per step, BLOCK_M x
    # rows per program (the rows of x share each decoded weight element: one decode + BLOCK_M FMAs), SPLIT_K
    # programs along K (fixed-order last-arrival sum), num_warps, num_stages (1: no software pipelining). For
    # M <= GEMV_MAX_M only where the sweep measures it faster. DECODE_BITS / SCALE_WORDS / GEMM / PREPASS unused.
    GEMV: bool = False


# Chosen by M (rows of x). Small M is bound by the weight bytes (36 MiB): many programs, split-K for parallelism.
# Large M is bound by tensor-core throughput and the in-register decode of W (once per M tile): big M tiles.
LINEAR_CONFIGS = {
    # the fastest valid candidate per M of the H200 sweep (python -m fp4ref.kernels.bench nvfp4_linear --sweep,
    # 2026-11-30, docs/benchmarks.md), checked there against fp4ref with these configs
    # M = 1: the CUDA-core GEMV (exact 16-element block sums, fp32 adds across blocks): 30.5 us GPU vs 39-42 for the
    # tensor-core kernel; from M = 4 the tensor-core kernel wins (39.0 vs the GEMV's best)
    1: LinearConfig(BLOCK_N=64, BLOCK_M=1, BLOCK_K=512, SPLIT_K=4, num_warps=4, num_stages=1, GEMV=True),
    16: LinearConfig(BLOCK_N=64, BLOCK_M=16, BLOCK_K=128, SPLIT_K=4, num_warps=4, num_stages=4),
    64: LinearConfig(BLOCK_N=64, BLOCK_M=64, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=4),
    256: LinearConfig(BLOCK_N=64, BLOCK_M=128, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=3),
    # large M (the pre-pass path wins from M = 512): W decoded once per call to an fp16 workspace by the word
    # pre-pass (16 x 512 words per program, 4 warps: 47.5 us alone, ~3.6 TB/s), then the TMA GEMM 128x256x64,
    # GROUP_M 8, 8 warps, 3 stages (see LinearConfig.GEMM / PREPASS)
    1 << 62: LinearConfig(BLOCK_N=128, BLOCK_M=256, BLOCK_K=64, SPLIT_K=1, num_warps=8, num_stages=3,
                          GEMM=GemmConfig("tma", 128, 256, 64, SPLIT_K=1, GROUP_M=8, num_warps=8, num_stages=3),
                          PREPASS=(16, 512, 4, "cvt")),
}


def _block_k_for(K: int, block_k: int) -> int:
    """The largest power of two <= block_k that divides K (>= 16 since K % 16 == 0): no K masks in the loop."""
    b = block_k
    while K % b:
        b //= 2
    return b


# The largest M the GEMV candidates are swept at: the GEMV costs one decode plus M FMAs per weight element on CUDA
# cores, so it loses to the tensor-core kernel beyond a few rows (the sweep finds where).
GEMV_MAX_M = 8


def accumulation_model(config: LinearConfig, K: int, interpreter: bool = False) -> str:
    """The fp4ref.bounds model name of ``config`` at reduction length ``K`` (NUMERIC_CONTRACT).

    GEMV configs: ``splitk(fp32_rn_block16, C)``, C = the products one program accumulates (whole BLOCK_K steps,
    split evenly as the kernel does). Other configs: the contract's ``accumulation_model`` (or its interpreter
    twin). Raises TypeError if config is not a LinearConfig, ValueError if K is not a positive multiple of 16.
    """
    if not isinstance(config, LinearConfig):
        raise TypeError(f"config: expected a LinearConfig, got {type(config).__name__}")
    if isinstance(K, bool) or not isinstance(K, int) or K <= 0 or K % 16:
        raise ValueError(f"K={K!r}: expected a positive multiple of 16")
    if config.GEMV:
        bk = _block_k_for(K, config.BLOCK_K)
        steps = K // bk
        chunk = -(-steps // config.SPLIT_K) * bk
        return f"splitk(fp32_rn_block16, {chunk})"
    return NUMERIC_CONTRACT["accumulation_model_interpreter" if interpreter else "accumulation_model"]


def pick_linear_config(M: int) -> LinearConfig:
    """The config for ``M`` rows of x: the first entry of LINEAR_CONFIGS whose key is >= M."""
    for limit in sorted(LINEAR_CONFIGS):
        if M <= limit:
            return LINEAR_CONFIGS[limit]
    raise AssertionError("unreachable")


_AMAX_BLOCK = 8192  # elements per program per amax step (32 per thread: 4 x 16-byte loads in flight)
_AMAX_MAX_PROGRAMS = 512  # partials (power of two; the quantize kernel reduces them all)


# ---------------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------------
@triton.jit
def _widen_to_fp32(x):
    """Exact fp32 value of x (fp32 / bf16 / fp16). bf16 by its bits (<< 16): exact for every input, also where
    the CPU interpreter's bf16 -> fp32 conversion is wrong (it maps bf16 subnormals to 2^-127)."""
    if x.dtype == tl.bfloat16:
        # zero-extended (uint16 -> uint32), not sign-extended: one instruction on sm_90 instead of three
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def _amax_kernel(
    x_ptr,  # *fp32|bf16|fp16, numel contiguous elements
    part_ptr,  # *i32 [>= num_programs]: this program's max |x| as fp32 bits, at part_ptr[program id]
    numel,
    ITERS,  # grid-stride steps per program
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    best = tl.zeros([BLOCK], dtype=tl.int32)
    for it in range(0, ITERS):
        idx = (it * nprog + pid).to(tl.int64) * BLOCK + offs
        x = _widen_to_fp32(tl.load(x_ptr + idx, mask=idx < numel, other=0.0))
        # |x| as bits: clearing the sign bit orders non-negative floats like integers (NaN bits exceed +inf)
        best = tl.maximum(best, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
    # one partial per program, no atomics and nothing to reset: the quantize kernel takes the max of all partials
    # (max is order-free: deterministic)
    tl.store(part_ptr + pid, tl.max(best, axis=0))


@triton.jit
def _e4m3_rne_byte(s):
    """E4M3FN byte (RNE) of s, fp32 in [0, 448]; integer arithmetic on the fp32 bits (exact, FTZ-free)."""
    sb = s.to(tl.int32, bitcast=True)
    e = sb >> 23  # biased fp32 exponent (s >= 0)
    mant = (sb & 0x7FFFFF) | tl.where(e > 0, 0x800000, 0)  # 24-bit significand; s = mant * 2^(max(e,1) - 150)
    e = tl.maximum(e, 1)
    # E4M3 grid step: 2^(max(E, -6) - 3) for s in [2^E, 2^(E+1)); in units of the fp32 significand LSB that is
    # 2^shift with shift = 20 (normal E4M3, e >= 121) or 141 - e (E4M3 subnormals, step 2^-9). Capped at 30:
    # mant < 2^24 < 2^29 = half-step, so the result is 0 either way.
    shift = tl.minimum(tl.where(e >= 121, 20, 141 - e), 30)
    q = mant >> shift
    rem = mant & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)  # ties to even
    # normal: ((e - 120) << 3) + (q - 8); a carry q = 16 bumps the exponent naturally. Subnormal: q (q = 8 -> 2^-6).
    return tl.where(e >= 121, ((e - 120) << 3) + q - 8, q)


@triton.jit
def _e4m3_byte_to_fp32(b):
    """Exact fp32 value of an E4M3FN byte (sign bit clear, not 0x7F)."""
    be = b >> 3
    m = b & 7
    normal = (((be + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    return tl.where(be == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal: m * 2^-9 (exact)


@triton.jit
def nvfp4_quantize_kernel(
    x_ptr,  # *fp32|bf16|fp16 [M, K] row-major (contiguous)
    amax_ptr,  # *i32 [n_amax] per-program max |x| (fp32 bits) from _amax_kernel
    q_ptr,  # *u8 [M, K/2] packed E2M1 codes (element 2i in bits 3:0)         (WRITE_PACKED)
    s_ptr,  # *u8 [M, K/16] E4M3FN block-scale bytes                          (WRITE_PACKED)
    deq_ptr,  # *fp16|bf16 [M, K] code value * block scale (exact in both)     (WRITE_DEQUANT)
    gdec_ptr,  # *fp32 [2]: [0] global decode scale, [1] fp32(global decode * w_gdec) (the GEMM epilogue scale)
    w_gdec,  # fp32 weight global decode scale (for gdec_ptr[1]; 1.0 for nvfp4_quantize)
    M,
    K,
    stride_xm,
    n_amax,  # number of amax partials (<= AMAX_PARTS)
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,  # multiple of 16
    WRITE_PACKED: tl.constexpr,
    WRITE_DEQUANT: tl.constexpr,
    AMAX_PARTS: tl.constexpr = 512,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)

    # --- global scales (the recipe, fp32, IEEE division) -------------------------------------------------------
    parts = tl.load(amax_ptr + tl.arange(0, AMAX_PARTS), mask=tl.arange(0, AMAX_PARTS) < n_amax, other=0)
    amax = tl.max(parts, axis=0).to(tl.float32, bitcast=True)  # integer max of the sign-cleared bits: exact
    genc = tl.math.div_rn(tl.full([], 2688.0, tl.float32), amax)  # (448 * 6) / amax; amax = 0 -> +inf
    genc = tl.minimum(genc, 3.4028234663852886e38)  # clamp to the fp32 max
    genc = tl.where(genc == 0.0, 1.0, genc)  # amax = +inf -> 0 -> 1 (TransformerEngine's rule)
    gdec = tl.math.div_rn(tl.full([], 1.0, tl.float32), genc)
    if (pid_r == 0) & (pid_c == 0):
        tl.store(gdec_ptr, gdec)
        tl.store(gdec_ptr + 1, gdec * w_gdec)  # fp32 RNE (no FMA contraction: enable_fp_fusion=False)

    # --- the tile ----------------------------------------------------------------------------------------------
    NB: tl.constexpr = BLOCK_C // 16
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < M) & (cols[None, :] < K)  # K % 16 == 0: a block is all in or all out
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=mask, other=0.0)
    x = _widen_to_fp32(x).reshape(BLOCK_R, NB, 16)

    # block amax (exact, via bits), block scale = (block_amax / 6) * global_encode, clamp 448, E4M3 RNE
    bamax = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2).to(tl.float32, bitcast=True)
    s = tl.math.div_rn(bamax, tl.full([BLOCK_R, NB], 6.0, tl.float32)) * genc
    s = tl.minimum(s, 448.0)  # s >= 0; the -448 side of the clamp never applies
    sbyte = _e4m3_rne_byte(s)
    sval = _e4m3_byte_to_fp32(sbyte)

    # element encode = min(1 / (float(block_scale) * global_decode), fp32 max); element = x * encode
    enc = tl.minimum(tl.math.div_rn(tl.full([BLOCK_R, NB], 1.0, tl.float32), sval * gdec), 3.4028234663852886e38)
    y = x * enc[:, :, None]

    # E2M1 RNE of clamp(y, -6, 6), on a = |y| clamped (8 instructions per element on sm_90):
    #   the E2M1 grid step in a's binade is 2^(e-1), e = max(exponent of a, 0) (0.5 below 2, 1 in [2, 4), 2 in
    #   [4, 6]); C = 2^(e+22) has that ulp, so r = (a + C) - C is a rounded to the grid, ties to even (an even
    #   multiple of the step is an even code: 2.5 -> 2, 3.5 -> 4, 5 -> 4, 0.25 -> 0, 0.75 -> 1, 1.25 -> 1), and
    #   the subtraction is exact. r in {0, 0.5, 1, 1.5, 2, 3, 4, 6}; r * 2^-126 is exactly the fp32 whose bits
    #   >> 22 are the E2M1 magnitude code (0.5 -> the subnormal 2^-127 = 0x00400000 -> 1; 1 -> 2^-126 -> 2; ...;
    #   6 -> 1.5 * 2^-124 -> 7). Needs IEEE adds (no reassociation: no fast-math in Triton) and no FTZ on the
    #   multiply (the kernel is built with enable_reflect_ftz=False; the sm_90 compile test checks the PTX).
    # Sign bit iff y < 0: [-0.25, 0) -> code 8, -0.0 -> 0 (the recipe's comparison cast). NaN: outside the contract.
    a = tl.minimum(tl.abs(y), 6.0)
    cb = (tl.maximum(a, 1.0).to(tl.int32, bitcast=True) & 0x7F800000) + (22 << 23)
    c = cb.to(tl.float32, bitcast=True)
    r = (a + c) - c
    mag = (r * 1.1754943508222875e-38).to(tl.int32, bitcast=True) >> 22  # r * 2^-126
    neg = y < 0.0
    code = mag | tl.where(neg, 8, 0)

    if WRITE_PACKED:
        code2 = code.reshape(BLOCK_R, BLOCK_C // 2, 2)
        lo, hi = tl.split(code2)
        packed = (lo | (hi << 4)).to(tl.uint8)
        pcols = pid_c * (BLOCK_C // 2) + tl.arange(0, BLOCK_C // 2)
        pmask = (rows[:, None] < M) & (pcols[None, :] < K // 2)
        tl.store(q_ptr + rows[:, None].to(tl.int64) * (K // 2) + pcols[None, :], packed, mask=pmask)
        bcols = pid_c * NB + tl.arange(0, NB)
        bmask = (rows[:, None] < M) & (bcols[None, :] < K // 16)
        tl.store(s_ptr + rows[:, None].to(tl.int64) * (K // 16) + bcols[None, :], sbyte.to(tl.uint8), mask=bmask)
    if WRITE_DEQUANT:
        # E2M1 value of the code (the rounded |y|), sign, times the block scale: exact in fp32 and in fp16
        v = tl.where(neg, -r, r) * sval[:, :, None]
        tl.store(deq_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
                 v.reshape(BLOCK_R, BLOCK_C).to(deq_ptr.dtype.element_ty), mask=mask)


# PTX for one 32-bit word of packed weights (8 E2M1 codes, element 8j+i in bits 4i+3:4i) and its block scale
# (fp16, already times 2^6): 8 fp16 outputs, element order. E2M1 code c -> E4M3FN byte (c & 7) << 2 | (c & 8) << 4,
# done on four bytes at once; cvt.rn.f16x2.e4m3x2 converts two bytes (low byte -> low half); then times the scale.
# Every step is exact (see the module docstring). The CPU interpreter cannot run PTX: it takes _decode_word_portable,
# the same arithmetic in Triton ops (the GPU tests check this path bit for bit against fp4ref).
_DECODE_WORD_PTX = tl.constexpr("""
{
.reg .b32 w, lo, hi, t, p0, p1, s2, f0, f1, f2, f3;
.reg .b16 q0, q1, q2, q3;
mov.b32 w, $8;
and.b32 lo, w, 0x07070707;
shl.b32 lo, lo, 2;
and.b32 t, w, 0x08080808;
shl.b32 t, t, 4;
or.b32 lo, lo, t;
shr.u32 hi, w, 2;
and.b32 hi, hi, 0x1C1C1C1C;
and.b32 t, w, 0x80808080;
or.b32 hi, hi, t;
prmt.b32 p0, lo, hi, 0x5140;
prmt.b32 p1, lo, hi, 0x7362;
mov.b32 {q0, q1}, p0;
mov.b32 {q2, q3}, p1;
cvt.rn.f16x2.e4m3x2 f0, q0;
cvt.rn.f16x2.e4m3x2 f1, q1;
cvt.rn.f16x2.e4m3x2 f2, q2;
cvt.rn.f16x2.e4m3x2 f3, q3;
mov.b32 s2, {$9, $9};
mul.rn.f16x2 f0, f0, s2;
mul.rn.f16x2 f1, f1, s2;
mul.rn.f16x2 f2, f2, s2;
mul.rn.f16x2 f3, f3, s2;
mov.b32 {$0, $1}, f0;
mov.b32 {$2, $3}, f1;
mov.b32 {$4, $5}, f2;
mov.b32 {$6, $7}, f3;
}
""")


# The cheaper decode (DECODE_BITS): no conversion instruction. E2M1 code c = s e1 e0 m placed as the fp16 bits
# s << 15 | (e1 e0 m) << 9 is exactly E2M1(c) * 2^-14 (e1 e0 = 0: the fp16 subnormal m * 2^-15 = 0.5 m * 2^-14).
# Elements 2i, 2i+1 (byte i of the word) go to one f16x2 register, in element order (the order the tile is
# joined in, so no repacking follows): prmt puts byte i of (w << 4) (its high nibble = element 2i) in byte 1 and
# byte i of w (high nibble = element 2i+1) in byte 3, so both codes sit at bits 12..15 of their half; then
# ((t >> 3) & 0x0E000E00) | (t & 0x80008000). Times fp16(block scale) * 2^6 (mul.rn.f16x2, subnormals kept):
# E2M1(c) * scale * 2^-8, a multiple of 2^-18 with <= 6 significant bits and magnitude <= 10.5: exact in fp16.
# The kernel multiplies the fp32 accumulator by 2^8 before the epilogue scale: exact, because every product is
# scaled by the same power of two and stays >= 2^-28 in magnitude (far above fp32's subnormals), so the
# accumulator (hardware or interpreter) is exactly 2^-8 times the unscaled one, and 2^8 times it is the unscaled
# accumulator itself (finite whenever that is).
_DECODE_BITS_PTX = tl.constexpr(
    "\n{\n.reg .b32 w, u, t, f0, f1, f2, f3, s2;\nmov.b32 w, $8;\nmov.b32 s2, {$9, $9};\nshl.b32 u, w, 4;\n"
    # f{i}: byte i of (w << 4) -> byte 1 and byte i of w -> byte 3 of t, then the code bits placed as above
    + "".join(f"prmt.b32 t, w, u, 0x{i}{i}{i + 4}{i + 4};\nshr.u32 f{i}, t, 3;\nand.b32 f{i}, f{i}, 0x0E000E00;\n"
              f"and.b32 t, t, 0x80008000;\nor.b32 f{i}, f{i}, t;\n" for i in range(4))
    + "".join(f"mul.rn.f16x2 f{i}, f{i}, s2;\n" for i in range(4))
    + "".join(f"mov.b32 {{${2 * i}, ${2 * i + 1}}}, f{i};\n" for i in range(4))
    + "}\n")


@triton.jit
def _bits_to_fp16(w, j: tl.constexpr):
    """Code j (bits 4j..4j+3 of each uint32 of w) as the fp16 E2M1(c) * 2^-14 (see _DECODE_BITS_PTX)."""
    c = (w >> (4 * j)) & 0xF
    return (((c & 7) << 9) | ((c & 8) << 12)).to(tl.uint16).to(tl.float16, bitcast=True)


@triton.jit
def _decode_bits_portable(w, s16):
    w = w.to(tl.uint32, bitcast=True)
    return (_bits_to_fp16(w, 0) * s16, _bits_to_fp16(w, 1) * s16, _bits_to_fp16(w, 2) * s16,
            _bits_to_fp16(w, 3) * s16, _bits_to_fp16(w, 4) * s16, _bits_to_fp16(w, 5) * s16,
            _bits_to_fp16(w, 6) * s16, _bits_to_fp16(w, 7) * s16)


@triton.jit
def _byte_to_fp16(bits, t: tl.constexpr):
    """Byte t of each int32 of ``bits`` read as an E4M3FN value, widened to fp16 (exact)."""
    return ((bits >> (8 * t)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def _decode_word_portable(w, s16):
    w = w.to(tl.uint32, bitcast=True)
    lo = ((w & 0x07070707) << 2) | ((w & 0x08080808) << 4)  # E4M3 bytes of the even elements 0, 2, 4, 6
    hi = ((w >> 2) & 0x1C1C1C1C) | (w & 0x80808080)  # odd elements 1, 3, 5, 7
    return (_byte_to_fp16(lo, 0) * s16, _byte_to_fp16(hi, 0) * s16, _byte_to_fp16(lo, 1) * s16,
            _byte_to_fp16(hi, 1) * s16, _byte_to_fp16(lo, 2) * s16, _byte_to_fp16(hi, 2) * s16,
            _byte_to_fp16(lo, 3) * s16, _byte_to_fp16(hi, 3) * s16)


@triton.jit
def _splitk_last_arrival(count_ptr, tile, part_ptr, out_ptr, out_offs, out_mask, MN, pre, g, SPLIT_K: tl.constexpr):
    """Split-K without a second launch: after storing its partial (and a CTA barrier), each program bumps the
    tile's counter (atomic, acq_rel, gpu scope); the LAST to arrive sums the SPLIT_K partials in the fixed order
    s = 0, 1, ... in fp32 (bitwise deterministic whoever arrives last), stores bf16((tot * pre) * g) (one RNE;
    ``pre`` a power of two, exact) and resets the counter for the next call on this stream."""
    if tl.atomic_add(count_ptr + tile, 1) == SPLIT_K - 1:
        tot = tl.load(part_ptr + out_offs, mask=out_mask, other=0.0, cache_modifier=".cg")
        for sk in tl.static_range(1, SPLIT_K):
            tot += tl.load(part_ptr + sk * MN + out_offs, mask=out_mask, other=0.0, cache_modifier=".cg")
        tl.store(out_ptr + out_offs, ((tot * pre) * g).to(tl.bfloat16), mask=out_mask)
        tl.store(count_ptr + tile, 0)


@triton.jit
def nvfp4_linear_kernel(
    w_ptr,  # *i32 [N, K/8] packed E2M1 weight codes, 8 per word (element 2i in bits 3:0 of byte i)
    ws_ptr,  # *u8 [N, K/16] E4M3FN block-scale bytes (sign ignored: UE4M3); *i32 [N, K/64] with SCALE_WORDS
    a_ptr,  # *fp16 [M, K] dequantized x (code * block scale, exact)
    xgdec_ptr,  # *fp32 [1] x global decode scale (written by the quantize kernel)
    out_ptr,  # *bf16 [M, N]
    part_ptr,  # *fp32 [SPLIT_K, M, N] partial sums (SPLIT_K > 1)
    count_ptr,  # *i32 [tiles] arrivals per output tile (SPLIT_K > 1; 0 on entry, reset by the last arrival)
    w_gdec,  # fp32 weight global decode scale
    M,
    N,
    K,  # multiple of BLOCK_K (the host picks BLOCK_K so)
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DECODE_PTX: tl.constexpr,  # True on the GPU; False in the CPU interpreter (no inline PTX there)
    DECODE_BITS: tl.constexpr = False,  # decode by bit placement + one f16x2 multiply (_DECODE_BITS_PTX)
    SCALE_WORDS: tl.constexpr = False,  # load block scales as int32 words (4 per word; cp.async-eligible).
    # Needs K % 64 == 0 and BLOCK_K % 64 == 0. Byte loads (False) are not pipelined by Triton (cp.async needs
    # >= 4 bytes), so each K step waits for them. PREPARED, NOT YET GPU-VERIFIED: no default config uses it.
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)

    # Rows past N or M are clamped (not masked) on load, so loads stay unmasked and vectorised; stores are masked.
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_n = tl.minimum(offs_n, N - 1)
    rows_m = tl.minimum(offs_m, M - 1)
    offs_kw = tl.arange(0, BLOCK_K // 8)  # weight words
    if SCALE_WORDS:
        offs_ks = tl.arange(0, BLOCK_K // 64)  # block-scale words (4 bytes each)
    else:
        offs_ks = tl.arange(0, BLOCK_K // 16)  # block-scale bytes
    offs_k = tl.arange(0, BLOCK_K)

    # this program's K range: whole BLOCK_K steps, split evenly (the last split may be shorter or empty)
    k_steps = K // BLOCK_K
    steps_per_split = tl.cdiv(k_steps, SPLIT_K)
    step_lo = pid_k * steps_per_split
    step_hi = tl.minimum(step_lo + steps_per_split, k_steps)

    w_rows = w_ptr + rows_n[:, None].to(tl.int64) * (K // 8)
    if SCALE_WORDS:
        s_rows = ws_ptr + rows_n[:, None].to(tl.int64) * (K // 64)
    else:
        s_rows = ws_ptr + rows_n[:, None].to(tl.int64) * (K // 16)
    a_rows = a_ptr + rows_m[:, None].to(tl.int64) * K

    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for step in range(step_lo, step_hi):
        w = tl.load(w_rows + (step * (BLOCK_K // 8) + offs_kw)[None, :])  # [BLOCK_N, BLOCK_K/8] int32
        if SCALE_WORDS:
            sw = tl.load(s_rows + (step * (BLOCK_K // 64) + offs_ks)[None, :]).to(tl.uint32, bitcast=True)
            # byte t of word i is block 4i + t: [i, a, c] holds byte 2a + c
            sb = tl.join(tl.join(sw & 0xFF, (sw >> 16) & 0xFF), tl.join((sw >> 8) & 0xFF, sw >> 24))
            sb = sb.reshape(BLOCK_N, BLOCK_K // 16).to(tl.uint8)  # [BLOCK_N, BLOCK_K/16] scale bytes
        else:
            sb = tl.load(s_rows + (step * (BLOCK_K // 16) + offs_ks)[None, :])  # [BLOCK_N, BLOCK_K/16] uint8
        a = tl.load(a_rows + (step * BLOCK_K + offs_k)[None, :])  # [BLOCK_M, BLOCK_K] fp16
        s16 = (sb & 0x7F).to(tl.float8e4nv, bitcast=True).to(tl.float16) * 64.0  # block scale * 2^6, exact
        s16 = tl.join(s16, s16).reshape(BLOCK_N, BLOCK_K // 8)  # one scale per word (2 words per block)
        if DECODE_BITS:
            if DECODE_PTX:
                v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
                    _DECODE_BITS_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, s16],
                    dtype=(tl.float16,) * 8, is_pure=True, pack=1)
            else:
                v0, v1, v2, v3, v4, v5, v6, v7 = _decode_bits_portable(w, s16)
        elif DECODE_PTX:
            v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
                _DECODE_WORD_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, s16],
                dtype=(tl.float16,) * 8, is_pure=True, pack=1)
        else:
            v0, v1, v2, v3, v4, v5, v6, v7 = _decode_word_portable(w, s16)
        # element 8j + 4a + 2b + c at [j, a, b, c]
        even = tl.join(tl.join(v0, v4), tl.join(v2, v6))
        odd = tl.join(tl.join(v1, v5), tl.join(v3, v7))
        wv = tl.join(even, odd).reshape(BLOCK_N, BLOCK_K)  # E2M1 value * block scale, fp16, exact
        acc = tl.dot(wv, tl.trans(a), acc)  # exact products, fp32 accumulation

    out_mask = (offs_n[:, None] < N) & (offs_m[None, :] < M)
    out_offs = offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
    g = tl.load(xgdec_ptr) * w_gdec  # fp32 RNE
    if DECODE_BITS:
        acc = acc * 256.0  # undo the decode's 2^-8: exact (see _DECODE_BITS_PTX)
    if SPLIT_K == 1:
        tl.store(out_ptr + out_offs, (acc * g).to(tl.bfloat16), mask=out_mask)  # fp32 RNE, one RNE to bf16
    else:
        # Split-K without a second launch: store this partial; the LAST program to arrive at the tile sums all
        # SPLIT_K partials in the fixed order s = 0, 1, ... (bitwise deterministic whoever arrives last).
        MN = N.to(tl.int64) * M  # (M may be the constant 1 after specialisation: no .to on it)
        tl.store(part_ptr + pid_k * MN + out_offs, acc, mask=out_mask)
        tl.debug_barrier()  # all threads' partial stores precede the (release) arrival
        _splitk_last_arrival(count_ptr, pid_m * tl.num_programs(0) + pid_n, part_ptr, out_ptr, out_offs, out_mask,
                             MN, 1.0, g, SPLIT_K)


# ---------------------------------------------------------------------------------------------------------------
# Small-M GEMV on CUDA cores (LinearConfig.GEMV)
# ---------------------------------------------------------------------------------------------------------------
# Per weight element: one integer decode (4 integer ops) and one fp32 FMA per row of x, no tensor cores, no shared
# memory. Exactness (every step below is exact except the fp32 additions ACROSS 16-element blocks):
#
# * decode: E2M1 code c = s e1 e0 m placed as the fp32 bits s << 31 | (e1 e0 m) << 22 is exactly E2M1(c) * 2^-126
#   (e1 e0 = 0: the subnormal m * 2^-127 = 0.5 m * 2^-126; else 2^(e1e0 - 1) * (1 + m/2) * 2^-126 * 2): two
#   shifts and two masks per code, no conversion instruction.
# * x_dq = c_x * s_x (the quantizer's dequantized value, code value times block scale, WITHOUT the global decode
#   scale; fp32, exact) is a multiple of 2^-10 (c_x a multiple of 1/2, s_x an E4M3 value, a multiple of 2^-9), so
#   each product x_dq * E2M1(c_w) * 2^-126 is a multiple of 2^-137 (above fp32's subnormal step 2^-149; the
#   kernel keeps subnormals: no .ftz, checked by the sm_90 compile test).
# * per 16-element block (same block index for x and W) the 16 FMAs sum s_x * 2^-126 * sum(c_x * c_w): c_x c_w is
#   a multiple of 1/4 with |.| <= 36, so every partial sum is s_x * 2^-128 * q, |q| <= 2304 an integer (12
#   bits) and s_x has 4 significant bits: <= 16 significant bits, a multiple of 2^-137, < 2^-100: EXACT in fp32,
#   in any order (no rounding at all).
# * times fp32(s_w) * 2^100 (the E4M3 block scale, 4 significant bits, built with exponent bias + 100: no
#   overflow, 448 * 2^100 < 2^109): <= 20 significant bits, magnitude in [2^-46, 2^1] or 0: exact. The block
#   term is thus exactly 2^-26 * (x block . W block) with the true, unscaled products.
# * the fp32 accumulator adds K / 16 / SPLIT_K such terms per program (per slot of the [BLOCK_M, BLOCK_N,
#   BLOCK_K/16] accumulator, then one tl.sum over the slots: a fixed tree for a fixed layout), RN; split-K adds
#   the SPLIT_K partials in the fixed order s = 0, 1, .... Model: splitk(fp32_rn_block16, K / SPLIT_K)
#   (GEMV_MODEL). Scaling every term by 2^-26 changes no rounding (all stay normal), and acc * 2^26 is exact.
# * epilogue as the other paths: acc * 2^26 (exact) * fp32(x_gdec * w_gdec), one RNE rounding to bf16.
# Deterministic: fixed reduction orders only (tl.sum over a fixed layout compiles to a fixed shuffle tree, the
# same on every run on the same GPU and build), no floating-point atomics.
# Contiguous NVFP4 blocks per thread in the GEMV's weight tile (its VEC): 2 (16-byte loads). Without the hint
# Triton 3.6 gives each thread ONE weight row and all its BLOCK_K/16 blocks, so every x value is loaded once per
# weight element (sm_90 SASS at BLOCK_N 64, BLOCK_K 256, M = 1: 874 instructions per 128 elements, 133 of them
# loads); with it a thread holds 4 rows x 2 blocks and loads each x value once per 4 weight rows (778, 40 loads).
_GEMV_VEC = 2


@triton.jit
def _e2m1_fp32_sub(w, j: tl.constexpr):
    """Code j (bits 4j+3:4j) of each uint32 of ``w`` as the fp32 E2M1(c) * 2^-126 (sign s e1 e0 m -> bits
    s << 31 | (e1 e0 m) << 22; exact, see above)."""
    if j <= 5:
        mag = (w << (22 - 4 * j)) & 0x01C00000
    else:
        mag = (w >> (4 * j - 22)) & 0x01C00000
    sign = (w >> (4 * j + 3)) << 31
    return (mag | sign).to(tl.float32, bitcast=True)


@triton.jit
def _gemv_block_dots(x_row, lo, hi, kb, offs_b):
    """[BLOCK_N, NB]: sum_j x[16 (kb + b) + j] * E2M1(code j of block b) * 2^-126 over the 16 codes of each block
    (lo: codes 0..7, hi: 8..15), for one row of x at ``x_row``. Exact (see above): 2^-126 s_x sum(c_x c_w)."""
    xp = x_row + (kb + offs_b) * 16  # [NB]
    acc = tl.load(xp)[None, :] * _e2m1_fp32_sub(lo, 0)
    for j in tl.static_range(1, 8):
        acc += tl.load(xp + j)[None, :] * _e2m1_fp32_sub(lo, j)
    for j in tl.static_range(8):
        acc += tl.load(xp + (8 + j))[None, :] * _e2m1_fp32_sub(hi, j)
    return acc


@triton.jit
def _gemv_store_row(acc, r, out_ptr, part_ptr, offs_n, pid_m, M, N, g, BLOCK_M: tl.constexpr,
                    SPLIT_K: tl.constexpr, pid_k):
    """Row r of the program's x rows: the fixed-tree sum over the accumulator's slots, then either the output
    (acc * 2^26 exact, * g, one RNE to bf16) or this split's fp32 partial (times 2^26 later)."""
    row = pid_m * BLOCK_M + r
    tot = tl.sum(acc, axis=1)  # [BLOCK_N]
    mask = (offs_n < N) & (row < M)
    offs = row.to(tl.int64) * N + offs_n
    if SPLIT_K == 1:
        tl.store(out_ptr + offs, ((tot * 67108864.0) * g).to(tl.bfloat16), mask=mask)
    else:
        tl.store(part_ptr + pid_k * (N.to(tl.int64) * M) + offs, tot, mask=mask)


@triton.jit
def nvfp4_gemv_kernel(
    w_ptr,  # *i64 [N, K/16] packed E2M1 weight codes: one NVFP4 block (16 codes, element 2i in bits 3:0 of byte i)
    ws_ptr,  # *u8 [N, K/16] E4M3FN block-scale bytes (sign ignored: UE4M3)
    a_ptr,  # *fp32 [M, K] dequantized x (code * block scale, exact, no global scale)
    xgdec_ptr,  # *fp32 [1] x global decode scale (written by the quantize kernel)
    out_ptr,  # *bf16 [M, N]
    part_ptr,  # *fp32 [SPLIT_K, M, N] partial sums (SPLIT_K > 1)
    count_ptr,  # *i32 [tiles] arrivals per output tile (SPLIT_K > 1; 0 on entry, reset by the last arrival)
    w_gdec,  # fp32 weight global decode scale
    M,
    N,
    K,  # multiple of BLOCK_K (the host picks BLOCK_K so)
    KB,  # K // 16, passed as an argument so Triton sees its divisibility (16-byte weight loads when 2 | KB)
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,  # 1, 2, 3 or 4 rows of x per program (each decoded weight element feeds BLOCK_M FMAs)
    BLOCK_K: tl.constexpr,  # power of two >= 16
    SPLIT_K: tl.constexpr,
    VEC: tl.constexpr = 2,  # contiguous blocks per thread (weight load width VEC * 8 bytes)
):
    """y[m, n] = RNE_bf16((fp32 sum over 16-element blocks of exact block dot products) * 2^26 * g), CUDA cores.
    Rows past N or M are clamped on load and masked on store. 2D [BLOCK_N, BLOCK_K/16] tiles only (one per row
    of x), so the decoded weights never leave registers (no layout conversion)."""
    tl.static_assert(BLOCK_M >= 1 and BLOCK_M <= 4)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    NB: tl.constexpr = BLOCK_K // 16  # NVFP4 blocks per row per step

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_n = tl.minimum(offs_n, N - 1)
    offs_b = tl.arange(0, NB)

    k_steps = K // BLOCK_K
    steps_per_split = tl.cdiv(k_steps, SPLIT_K)
    step_lo = pid_k * steps_per_split
    step_hi = tl.minimum(step_lo + steps_per_split, k_steps)

    # VEC blocks per thread per load (a contiguity hint): Triton then gives each thread several ROWS of the tile
    # (instead of one row and all its blocks), so each loaded x value feeds several weight rows
    offs_v = tl.max_contiguous(tl.arange(0, NB), VEC)
    w_rows = w_ptr + rows_n[:, None].to(tl.int64) * KB + offs_v[None, :]  # [BLOCK_N, NB]
    s_rows = ws_ptr + rows_n[:, None].to(tl.int64) * KB + offs_v[None, :]
    # the program's x rows, clamped to M - 1 (their results are masked on store)
    x0 = a_ptr + tl.minimum(pid_m * BLOCK_M, M - 1).to(tl.int64) * K
    x1 = a_ptr + tl.minimum(pid_m * BLOCK_M + 1, M - 1).to(tl.int64) * K
    x2 = a_ptr + tl.minimum(pid_m * BLOCK_M + 2, M - 1).to(tl.int64) * K
    x3 = a_ptr + tl.minimum(pid_m * BLOCK_M + 3, M - 1).to(tl.int64) * K

    acc0 = tl.zeros([BLOCK_N, NB], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N, NB], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, NB], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, NB], dtype=tl.float32)
    for step in range(step_lo, step_hi):
        kb = step * NB
        wq = tl.load(w_rows + kb)  # [BLOCK_N, NB] int64: one 16-code block each
        sb = tl.load(s_rows + kb).to(tl.int32) & 0x7F  # block-scale bytes
        lo = wq.to(tl.uint32)  # codes 0..7 of the block (truncation: the low word)
        hi = (wq >> 32).to(tl.uint32)  # codes 8..15
        # fp32(E4M3 block scale) * 2^100: exponent bias + 100 (normal), m * 2^-9 * 2^100 = m * 2^91 (subnormal)
        be = sb >> 3
        sm = sb & 7
        sw = tl.where(be == 0, sm.to(tl.float32) * 2.4758800785707605e27,
                      (((be + 220) << 23) | (sm << 20)).to(tl.float32, bitcast=True))
        # each product below is exactly 2^-26 * (x block . W block); one RN addition into the accumulator
        acc0 += _gemv_block_dots(x0, lo, hi, kb, offs_b) * sw
        if BLOCK_M > 1:
            acc1 += _gemv_block_dots(x1, lo, hi, kb, offs_b) * sw
        if BLOCK_M > 2:
            acc2 += _gemv_block_dots(x2, lo, hi, kb, offs_b) * sw
        if BLOCK_M > 3:
            acc3 += _gemv_block_dots(x3, lo, hi, kb, offs_b) * sw

    g = tl.load(xgdec_ptr) * w_gdec  # fp32 RNE
    _gemv_store_row(acc0, 0, out_ptr, part_ptr, offs_n, pid_m, M, N, g, BLOCK_M, SPLIT_K, pid_k)
    if BLOCK_M > 1:
        _gemv_store_row(acc1, 1, out_ptr, part_ptr, offs_n, pid_m, M, N, g, BLOCK_M, SPLIT_K, pid_k)
    if BLOCK_M > 2:
        _gemv_store_row(acc2, 2, out_ptr, part_ptr, offs_n, pid_m, M, N, g, BLOCK_M, SPLIT_K, pid_k)
    if BLOCK_M > 3:
        _gemv_store_row(acc3, 3, out_ptr, part_ptr, offs_n, pid_m, M, N, g, BLOCK_M, SPLIT_K, pid_k)
    if SPLIT_K > 1:
        # the LAST program to arrive at the tile sums the SPLIT_K partials in the fixed order s = 0, 1, ...
        tl.debug_barrier()  # all threads' partial stores precede the (release) arrival
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        out_offs = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        _splitk_last_arrival(count_ptr, pid_m * tl.num_programs(0) + pid_n, part_ptr, out_ptr, out_offs, out_mask,
                             N.to(tl.int64) * M, 67108864.0, g, SPLIT_K)  # 2^26: undo the decode's 2^-26 (exact)


@triton.jit
def nvfp4_decode_weight_kernel(
    w_ptr,  # *u8 [N, K/2] packed E2M1 codes (element 2i in bits 3:0)
    ws_ptr,  # *u8 [N, K/16] E4M3FN block-scale bytes (sign ignored: UE4M3)
    out_ptr,  # *bf16|fp16 [N, K]: E2M1 value * block scale (exact)
    N,
    K,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,  # multiple of 32
):
    """The large-M pre-pass: the NVFP4 weight decoded to a 16-bit workspace for a plain TMA GEMM.

    fp32 value of the code (E2M1 c = s e1 e0 m: |v| = m / 2 when e1 e0 = 0, else the fp32 bits
    (e1 e0 m + 252) << 22), times the exact fp32 block scale, converted to the workspace dtype: every product has
    <= 6 significant bits and lies in [2^-10, 2688] (or is 0), so each step is exact (bf16 and fp16 alike).
    """
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows[:, None] < N
    pcols = pid_c * (BLOCK_C // 2) + tl.arange(0, BLOCK_C // 2)
    packed = tl.load(w_ptr + rows[:, None].to(tl.int64) * (K // 2) + pcols[None, :],
                     mask=rmask & (pcols[None, :] < K // 2), other=0).to(tl.int32)
    bcols = pid_c * (BLOCK_C // 16) + tl.arange(0, BLOCK_C // 16)
    sb = tl.load(ws_ptr + rows[:, None].to(tl.int64) * (K // 16) + bcols[None, :],
                 mask=rmask & (bcols[None, :] < K // 16), other=0).to(tl.int32) & 0x7F
    sval = _e4m3_byte_to_fp32(sb)  # [BLOCK_R, BLOCK_C/16]
    c = tl.join(packed & 0xF, packed >> 4).reshape(BLOCK_R, BLOCK_C // 16, 16)  # element 2i: low nibble
    m3 = c & 7
    mag = tl.where(m3 >= 2, ((m3 + 252) << 22).to(tl.float32, bitcast=True), m3.to(tl.float32) * 0.5)
    v = tl.where((c & 8) != 0, -mag, mag) * sval[:, :, None]  # -0.0 for code 8 (value 0 either way)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
             v.reshape(BLOCK_R, BLOCK_C).to(out_ptr.dtype.element_ty), mask=rmask & (cols[None, :] < K))


@triton.jit
def nvfp4_decode_weight_words_kernel(
    w_ptr,  # *i32 [N, K/8] packed E2M1 codes, 8 per word (element 8j + i in bits 4i+3:4i of word j)
    ws_ptr,  # *u8 [N, K/16] E4M3FN block-scale bytes (sign ignored: UE4M3)
    out_ptr,  # *fp16 [N, K]: E2M1 value * block scale (exact)
    N,
    K,  # multiple of BLOCK_C (the host picks BLOCK_C so)
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,  # power of two >= 16
    DECODE_PTX: tl.constexpr,  # True on the GPU; False in the CPU interpreter (no inline PTX there)
):
    """The large-M pre-pass, word decode: the in-kernel path's decode (_DECODE_WORD_PTX: E2M1 code -> E4M3 byte
    E2M1(c) * 2^-6, cvt.rn.f16x2.e4m3x2, times fp16(block scale) * 2^6, all exact: products have <= 6
    significant bits in [2^-10, 2688] or are 0) on [BLOCK_R, BLOCK_C / 8] code words; a word's 8 values are
    8 consecutive fp16 of a row (one 16-byte store). Rows past N are clamped on load and masked on store."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    rows_c = tl.minimum(rows, N - 1)
    w = tl.load(w_ptr + rows_c[:, None].to(tl.int64) * (K // 8) + (pid_c * (BLOCK_C // 8)
                                                                    + tl.arange(0, BLOCK_C // 8))[None, :])
    sb = tl.load(ws_ptr + rows_c[:, None].to(tl.int64) * (K // 16) + (pid_c * (BLOCK_C // 16)
                                                                       + tl.arange(0, BLOCK_C // 16))[None, :])
    s16 = (sb & 0x7F).to(tl.float8e4nv, bitcast=True).to(tl.float16) * 64.0  # block scale * 2^6, exact
    s16 = tl.join(s16, s16).reshape(BLOCK_R, BLOCK_C // 8)  # one scale per word (2 words per block)
    if DECODE_PTX:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            _DECODE_WORD_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, s16], dtype=(tl.float16,) * 8, is_pure=True,
            pack=1)
    else:
        v0, v1, v2, v3, v4, v5, v6, v7 = _decode_word_portable(w, s16)
    even = tl.join(tl.join(v0, v4), tl.join(v2, v6))  # element 8j + 4a + 2b + c at [j, a, b, c]
    odd = tl.join(tl.join(v1, v5), tl.join(v3, v7))
    v = tl.join(even, odd).reshape(BLOCK_R, BLOCK_C)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], v, mask=rows[:, None] < N)


# ---------------------------------------------------------------------------------------------------------------
# Host wrappers
# ---------------------------------------------------------------------------------------------------------------
_X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_x(x, name: str = "x"):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _X_DTYPES:
        raise TypeError(f"{name}.dtype={x.dtype}: expected one of torch.float32, torch.bfloat16, torch.float16")
    if x.dim() < 1:
        raise ValueError(f"{name}.shape={tuple(x.shape)}: expected [..., K] with at least one dimension")
    K = x.shape[-1]
    if K == 0 or K % 16:
        raise ValueError(f"{name}.shape[-1]=K={K}: expected a positive multiple of 16 (NVFP4 blocks of 16 along K)")
    if x.numel() == 0:
        raise ValueError(f"{name}.shape={tuple(x.shape)}: expected at least one row")
    if not x.is_contiguous():
        raise ValueError(f"{name} is not contiguous (strides {x.stride()}): pass x.contiguous()")
    return x.reshape(-1, K)


class _Launcher:
    """``kernel[grid](*args, **meta)`` with the compiled kernel cached per specialisation.

    Triton's own dispatch (binding, specialisation key, option parsing) costs tens of microseconds of host time
    per launch, which dominates this op at small M. The first call of a specialisation goes through Triton (and
    compiles); later calls launch the cached CompiledKernel directly. The key holds what Triton specialises on:
    tensor dtypes and 16-byte alignment, ints equal to 1, divisible by 16 or beyond int32, and every meta value.
    Under the CPU interpreter every call goes through Triton.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self.cache: dict = {}
        self.constexpr_names = None  # the kernel's constexpr parameters, in order (all come after the others)

    @staticmethod
    def _spec(a):
        if isinstance(a, torch.Tensor):
            return (a.dtype, a.data_ptr() % 16 == 0)
        if isinstance(a, bool) or not isinstance(a, int):
            return type(a)
        return (a == 1, a % 16 == 0, not -(2**31) <= a < 2**31)

    def __call__(self, grid, *args, **meta):
        if _interpreting():
            self.kernel[grid](*args, **meta)
            return None
        dev = torch.cuda.current_device()
        key = (dev, tuple(self._spec(a) for a in args), tuple(meta.items()))
        ck = self.cache.get(key)
        if ck is None:
            self.cache[key] = self.kernel[grid](*args, **meta)
            if self.constexpr_names is None:
                self.constexpr_names = [p.name for p in self.kernel.params if p.is_constexpr]
            return None
        stream = torch.cuda.current_stream(dev).cuda_stream
        g = tuple(grid) + (1,) * (3 - len(grid))
        consts = tuple(meta[n] for n in self.constexpr_names)
        ck.run(g[0], g[1], g[2], stream, ck.function, ck.packed_metadata, None, None, None, *args, *consts)
        return ck, g, consts


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_SYNC: dict = {}  # (device, stream) -> int32 zeros [tiles]: split-K arrival counters per output tile
_AMAX_PARTS: dict = {}  # (device, stream) -> int32 [_AMAX_MAX_PROGRAMS]: the amax kernel's per-program partials
_WORKSPACE: dict = {}  # (device, stream, N, K, dtype) -> the large-M path's decoded weight [N, K] (2 N K bytes)


def _stream_key(dev):
    return (dev, _raw_stream(dev) if dev.type == "cuda" else 0)


def _sync_words(dev, tiles: int = 0):
    """Per-(device, stream) int32 split-K arrival counters that every kernel leaves at 0. Grown (fresh zeros)
    when more tiles are needed."""
    key = _stream_key(dev)
    buf = _SYNC.get(key)
    if buf is None or buf.numel() < tiles:
        buf = torch.zeros(max(tiles, 4096), dtype=torch.int32, device=dev)
        _SYNC[key] = buf
    return buf


def _amax_parts(dev):
    key = _stream_key(dev)
    buf = _AMAX_PARTS.get(key)
    if buf is None:
        buf = torch.zeros(_AMAX_MAX_PROGRAMS, dtype=torch.int32, device=dev)
        _AMAX_PARTS[key] = buf
    return buf


def _weight_workspace(dev, N: int, K: int, dtype):
    """The large-M path's decoded-weight buffer [N, K] (2 N K bytes: 128 MiB for N = K = 8192), one per
    (device, stream, shape, dtype), kept between calls (stream-ordered reuse). ``clear_workspaces()`` frees them."""
    key = (*_stream_key(dev), N, K, dtype)
    buf = _WORKSPACE.get(key)
    if buf is None:
        buf = torch.empty((N, K), dtype=dtype, device=dev)
        _WORKSPACE[key] = buf
    return buf


def clear_workspaces() -> None:
    """Free the cached decoded-weight workspaces, launch plans and scratch buffers of this module."""
    _WORKSPACE.clear()
    _PLANS.clear()
    _QPLANS.clear()


_amax_launch = _Launcher(_amax_kernel)
_quantize_kernel_launch = _Launcher(nvfp4_quantize_kernel)
_linear_launch = _Launcher(nvfp4_linear_kernel)
_gemv_launch = _Launcher(nvfp4_gemv_kernel)
_decode_weight_launch = _Launcher(nvfp4_decode_weight_kernel)
_decode_words_launch = _Launcher(nvfp4_decode_weight_words_kernel)

_DECODE_TILE = (16, 512, 4, "fp32")  # default weight pre-pass (BLOCK_R, BLOCK_C, num_warps, mode): LinearConfig.PREPASS
# Operand dtype of the large-M path. fp16, not bf16: every E2M1 x E4M3 product (<= 6 significant bits, in
# [2^-10, 2688]) is exact in either, wgmma runs both at the same rate, and triton 3.6's CPU interpreter computes
# tl.dot of bf16 operands wrongly (errors ~1e10 on randn data), so CPU CI could not check a bf16 path.
_PREPASS_DTYPE = torch.float16


# Quantize tiles (BLOCK_R, BLOCK_C, num_warps) keyed on M (first key >= M), as LINEAR_CONFIGS. BLOCK_C is capped
# at K's next power of two (BLOCK_R grows to keep the tile's element count) and BLOCK_R at M's.
QUANT_CONFIGS = {
    1 << 62: (4, 1024, 4),
}


def _quant_tile(M: int, K: int):
    """The quantize tile (BLOCK_R, BLOCK_C, num_warps) for x [M, K], from QUANT_CONFIGS."""
    tile_r, tile_c, warps = QUANT_CONFIGS[min(k for k in QUANT_CONFIGS if k >= M)]
    block_c = min(triton.next_power_of_2(K), tile_c)
    block_r = max(1, min(tile_r * tile_c // block_c, triton.next_power_of_2(M)))
    return block_r, block_c, warps


def _quantize_launch(x2, write_packed: bool, write_dequant: bool, tile: tuple | None = None,
                     deq_dtype=torch.float16, w_gdec: float = 1.0):
    """Launch amax + quantize on x2 [M, K]; returns (packed u8 | None, scales u8 | None, deq | None, gdec fp32 [2]).
    gdec = [x global decode, fp32(x global decode * w_gdec)]. ``tile``: (BLOCK_R, BLOCK_C, num_warps) to force
    (benchmark sweeps); default _quant_tile(M, K). Records the compiled launches in _LAST_QUANT["recs"]."""
    M, K = x2.shape
    dev = x2.device
    parts = _amax_parts(dev)
    numel = M * K
    nprog = min(triton.cdiv(numel, _AMAX_BLOCK), _AMAX_MAX_PROGRAMS)
    iters = triton.cdiv(numel, nprog * _AMAX_BLOCK)
    rec_amax = _amax_launch((nprog,), x2, parts, numel, iters, BLOCK=_AMAX_BLOCK, num_warps=8)

    block_r, block_c, quant_warps = _quant_tile(M, K) if tile is None else tile
    packed = torch.empty((M, K // 2), dtype=torch.uint8, device=dev) if write_packed else None
    scales = torch.empty((M, K // 16), dtype=torch.uint8, device=dev) if write_packed else None
    deq = torch.empty((M, K), dtype=deq_dtype, device=dev) if write_dequant else None
    gdec = torch.empty((2,), dtype=torch.float32, device=dev)
    dummy = gdec  # unused pointer arguments
    grid = (triton.cdiv(M, block_r), triton.cdiv(K, block_c))
    rec_quant = _quantize_kernel_launch(
        grid, x2, parts,
        packed if write_packed else dummy, scales if write_packed else dummy, deq if write_dequant else dummy,
        gdec, float(w_gdec), M, K, x2.stride(0), nprog,
        BLOCK_R=block_r, BLOCK_C=block_c, WRITE_PACKED=write_packed, WRITE_DEQUANT=write_dequant,
        AMAX_PARTS=_AMAX_MAX_PROGRAMS, num_warps=quant_warps, enable_fp_fusion=False, enable_reflect_ftz=False,
    )
    _LAST_QUANT["recs"] = (rec_amax, rec_quant, parts, numel, iters, nprog)
    return packed, scales, deq, gdec


def _gemm_scaled(a, b, scale, gemm_config, out):
    """out [M, N] bf16 = RNE_bf16(fp32(a @ b^T accumulated in fp32) * scale[0]) on the gemm_fp16 TMA kernel."""
    gemm_tma(a, b, out, scale=scale, config=gemm_config)


def _decode_weight(w_u8, ws_u8, out, tile=None):
    """Launch the weight pre-pass: out [N, K] (bf16 / fp16; "cvt" mode: fp16 only) = decoded NVFP4 weight, exact.
    ``tile``: (BLOCK_R, BLOCK_C, num_warps, mode) (LinearConfig.PREPASS); None = _DECODE_TILE."""
    N, K = out.shape
    br, bc, nw, mode = _DECODE_TILE if tile is None else tile
    if mode == "cvt":
        if out.dtype != torch.float16:
            raise ValueError(f"out.dtype={out.dtype}: the 'cvt' pre-pass writes float16")
        bc = _block_k_for(K, bc)  # divides K: no column masks
        _decode_words_launch((triton.cdiv(N, br), K // bc), w_u8.view(torch.int32), ws_u8, out, N, K,
                             BLOCK_R=br, BLOCK_C=bc, DECODE_PTX=not _interpreting(), num_warps=nw)
    elif mode == "fp32":
        _decode_weight_launch((triton.cdiv(N, br), triton.cdiv(K, bc)), w_u8, ws_u8, out, N, K,
                              BLOCK_R=br, BLOCK_C=bc, num_warps=nw)
    else:
        raise ValueError(f"pre-pass mode {mode!r}: expected 'fp32' or 'cvt'")


# ---------------------------------------------------------------------------------------------------------------
# Host fast path: cached launch plans
# ---------------------------------------------------------------------------------------------------------------
# At small M this op is bound by host time (Python launch overhead on the CPU), not by the GPU. After two calls
# with the same operands' shapes, dtypes, weight storage, stream and default config, a plan replays the three
# cached compiled kernels directly, reusing its scratch buffers (dequantized x, x's global decode scale, split-K
# partials: stream-ordered, so reuse is safe on the plan's stream). Plans whose scratch exceeds _PLAN_MAX_SCRATCH
# bytes are not kept (at large M the host time is negligible); at most _MAX_PLANS are kept (oldest dropped).
# nvfp4_quantize has its own plans (_QPLANS): the two cached kernels, fresh outputs per call. Linear plans are also
# bound to Triton's C launch functions (_bind_linear, below).
_LAST_QUANT: dict = {}
_PLANS: dict = {}
_QPLANS: dict = {}
_PLANS_ENABLED = os.environ.get("FP4REF_NVFP4_PLANS", "1") != "0"  # debugging switch: 0 disables the fast path
_MAX_PLANS = 4
_PLAN_MAX_SCRATCH = 64 << 20


def _raw_stream(dev) -> int:
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton itself uses; no Stream object
    return get(dev.index) if get is not None and dev.index is not None else torch.cuda.current_stream(dev).cuda_stream


def _plan_key(x, weight_fp4, weight_scales, w_gdec):
    dev = x.device
    return (x.shape, x.dtype, dev, x.data_ptr() % 16 == 0, x.is_contiguous(), weight_fp4.data_ptr(),
            weight_fp4.shape, weight_fp4.dtype, weight_fp4.is_contiguous(), weight_scales.data_ptr(),
            weight_scales.shape, weight_scales.dtype, weight_scales.is_contiguous(), w_gdec, _raw_stream(dev))


def _run(rec, st, *args):
    """Triton's launch of a recorded (CompiledKernel, grid, constexprs) with ``args`` (hooks get their metadata)."""
    ck, g, c = rec
    launch_compiled(ck, g, st, (*args, *c))


# Direct launches (GPU, kernels/_launch.py): a linear plan is bound once (it has one stream) to Triton's C launch
# functions with prebuilt headers and argument tuples, every tensor but x and out as an integer pointer; a call is
# then three C calls (no per-call tuple of constexprs, data_ptr() or cuPointerGetAttribute per tensor argument).
# Triton's path (_run) is taken where this Triton's launcher has another shape (plan.bound None from the start), a
# launch hook is installed (that call), or the C launcher rejects the arguments (from then on). FAST_LAUNCH = False
# keeps Triton's path for plans built afterwards (comparisons).
FAST_LAUNCH = True


def _ptr(a):
    return a.data_ptr() if isinstance(a, torch.Tensor) else a


class _LinearBinding:
    __slots__ = ("amax_fn", "amax_head", "amax_tail", "quant_fn", "quant_head", "quant_tail", "lin_fn", "lin_head",
                 "lin_pre", "lin_post")


def _bind_linear(plan):
    """The plan's _LinearBinding (direct launches on plan.stream), or None where kernels/_launch.py says this
    Triton's launcher does not take them. The argument tuples are those _LinearPlan.run's Triton path passes, in
    the same order (x and out excepted: per call), tensors as their data pointers (the plan keeps the tensors)."""
    if not FAST_LAUNCH:
        return None
    recs = (plan.amax, plan.quant, plan.lin)
    raws = [raw_launcher(rec[0], 0) for rec in recs]
    if not all(raws):
        return None
    bd = _LinearBinding()
    st = plan.stream
    (bd.amax_fn, bd.quant_fn, bd.lin_fn) = (r.fn for r in raws)
    bd.amax_head, bd.quant_head, bd.lin_head = (r.head(rec[1], st) for r, rec in zip(raws, recs))
    bd.amax_tail = (*map(_ptr, plan.amax_args), *plan.amax[2])
    bd.quant_tail = (*map(_ptr, plan.quant_args), *plan.quant[2])
    a = plan.lin_args
    bd.lin_pre = tuple(map(_ptr, a[:4]))
    bd.lin_post = (*map(_ptr, a[4:]), *plan.lin[2])
    return bd


class _LinearPlan:
    __slots__ = ("amax", "quant", "lin", "amax_args", "quant_args", "lin_args", "out_shape", "device", "stream",
                 "bound")

    def run(self, x):
        out = torch.empty(self.out_shape, dtype=torch.bfloat16, device=self.device)
        bd = self.bound
        if bd is not None and not hooks_installed():
            px = x.data_ptr()
            try:
                bd.amax_fn(*bd.amax_head, px, *bd.amax_tail)
                bd.quant_fn(*bd.quant_head, px, *bd.quant_tail)
                bd.lin_fn(*bd.lin_head, *bd.lin_pre, out.data_ptr(), *bd.lin_post)
                return out
            except (TypeError, ValueError, SystemError):  # argument packing rejected (before any launch of that
                self.bound = None  # kernel; re-running the earlier ones is idempotent): Triton's path from now on
        st = self.stream
        _run(self.amax, st, x, *self.amax_args)
        _run(self.quant, st, x, *self.quant_args)
        a = self.lin_args
        _run(self.lin, st, *a[:4], out, *a[4:])
        return out


class _QuantPlan:
    __slots__ = ("amax", "quant", "amax_args", "tail", "M", "K", "device", "stream")

    def run(self, x):
        dev = self.device
        packed = torch.empty((self.M, self.K // 2), dtype=torch.uint8, device=dev)
        scales = torch.empty((self.M, self.K // 16), dtype=torch.uint8, device=dev)
        gdec = torch.empty((2,), dtype=torch.float32, device=dev)
        st = self.stream
        _run(self.amax, st, x, *self.amax_args)
        _run(self.quant, st, x, self.amax_args[0], packed, scales, gdec, gdec, *self.tail)
        return packed, scales.view(torch.float8_e4m3fn), gdec[0]


def nvfp4_quantize(x: torch.Tensor):
    """Quantize ``x`` to NVFP4 with the workload's recipe ("sol"), on the GPU, without host synchronisation.

    Args:
        x: torch float32 / bfloat16 / float16 tensor [..., K], contiguous, K a positive multiple of 16. Rows are
            the leading dimensions flattened: M = x.numel() // K.

    Returns:
        (x_fp4, x_scales, global_decode):
        x_fp4 uint8 [M, K/2]: E2M1 codes, two per byte, element 2i in bits 3:0 (design.md "Packing");
        x_scales torch.float8_e4m3fn [M, K/16]: block scales, plain row-major;
        global_decode float32 [] (0-d tensor, on x's device).

    Rule (fp4ref.blockscale recipe "sol", /work/shared/facts/seeds.md §2), all fp32, IEEE division, in this order:
        amax = max|x|; global_encode = min(2688 / amax, FLT_MAX), 1 if that is 0 (amax = inf);
        global_decode = 1 / global_encode; block scale = E4M3FN_RNE(min((block_amax / 6) * global_encode, 448));
        encode = min(1 / (block_scale * global_decode), FLT_MAX); code = E2M1_RNE(clamp(x * encode, -6, 6)),
        where [-0.25, 0) -> 0x8 and -0.0 -> 0x0. Bit for bit equal to fp4ref's for every non-NaN input
        (zeros, ties, subnormal block scales and inputs, huge amax, +-inf included).

    Raises:
        TypeError: x is not a tensor of a supported dtype.
        ValueError: K not a positive multiple of 16, no rows, or x not contiguous.
    """
    use_plan = _PLANS_ENABLED and isinstance(x, torch.Tensor) and x.is_cuda and not _interpreting()
    if use_plan:
        key = (x.shape, x.dtype, x.device, x.data_ptr() % 16 == 0, x.is_contiguous(), _raw_stream(x.device))
        plan = _QPLANS.get(key)
        if plan is not None:
            return plan.run(x)
    x2 = _check_x(x)
    packed, scales, _, gdec = _quantize_launch(x2, write_packed=True, write_dequant=False)
    rec_amax, rec_quant, parts, numel, iters, nprog = _LAST_QUANT.pop("recs", (None,) * 6)
    if use_plan and rec_amax and rec_quant:
        plan = _QuantPlan()
        plan.amax, plan.quant = rec_amax, rec_quant
        plan.amax_args = (parts, numel, iters)
        plan.tail = (1.0, x2.shape[0], x2.shape[1], x2.stride(0), nprog)
        plan.M, plan.K = x2.shape
        plan.device = x.device
        plan.stream = _raw_stream(x.device)
        if len(_QPLANS) >= _MAX_PLANS:
            _QPLANS.pop(next(iter(_QPLANS)))
        _QPLANS[key] = plan
    return packed, scales.view(torch.float8_e4m3fn), gdec[0]


def nvfp4_linear(x: torch.Tensor, weight_fp4: torch.Tensor, weight_scales: torch.Tensor,
                 weight_global_decode_scale: float, *, config: LinearConfig | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """y = NVFP4(x) @ NVFP4(W)^T, the SOL-ExecBench nvfp4_linear_layer op, for Hopper (exact decode to fp16).

    Small M decodes W in the GEMM kernel; large M (configs with ``GEMM`` set) decodes W per call into a cached
    fp16 workspace of 2 N K bytes (128 MiB at N = K = 8192; one per device, stream and shape; freed by
    ``clear_workspaces()``) and runs gemm_fp16.gemm_tma on it.

    Args:
        x: bfloat16 (or float16 / float32) [..., K], contiguous; quantized per call with the "sol" recipe.
        weight_fp4: torch.float4_e2m1fn_x2 or uint8 [N, K/2], E2M1 codes, element 2i in bits 3:0.
        weight_scales: torch.float8_e4m3fn (or uint8 bytes) [N, K/16], plain row-major block scales (sign bit
            ignored: UE4M3).
        weight_global_decode_scale: python float (rounded to fp32 once, RNE).
        config: a LinearConfig to force (default: pick_linear_config(M)); TypeError if not a LinearConfig.
        out: optional bfloat16 [..., N] contiguous tensor to write y into (tests pass a NaN-filled one).

    Returns:
        y bfloat16 [..., N] = RNE_bf16(fp32(acc) * fp32(x_gdec * w_gdec)), acc = sum_k xq[m,k] * wq[n,k] with
        exact products and fp32 (tensor-core) accumulation; see NUMERIC_CONTRACT. Any M >= 1; N, K multiples of 16.

    Raises:
        TypeError: wrong tensor types or dtypes.
        ValueError: shapes inconsistent, K or N not a multiple of 16, tensors on different devices or not
            contiguous.
    """
    use_plan = _PLANS_ENABLED and config is None and out is None and isinstance(x, torch.Tensor) and x.is_cuda
    if use_plan and isinstance(weight_fp4, torch.Tensor) and isinstance(weight_scales, torch.Tensor):
        key = _plan_key(x, weight_fp4, weight_scales, weight_global_decode_scale)
        plan = _PLANS.get(key)  # plans are only built by calls made without the interpreter
        if plan is not None:
            return plan.run(x)
    use_plan = use_plan and not _interpreting()
    x2 = _check_x(x)
    M, K = x2.shape
    for name, t in (("weight_fp4", weight_fp4), ("weight_scales", weight_scales)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name}.shape={tuple(t.shape)}: expected 2 dimensions")
        if not t.is_contiguous():
            raise ValueError(f"{name} is not contiguous (strides {t.stride()})")
        if t.device != x.device:
            raise ValueError(f"{name}.device={t.device}: expected x's device {x.device}")
    fp4_x2 = getattr(torch, "float4_e2m1fn_x2", None)
    if weight_fp4.dtype not in tuple(d for d in (torch.uint8, fp4_x2) if d is not None):
        raise TypeError(f"weight_fp4.dtype={weight_fp4.dtype}: expected torch.float4_e2m1fn_x2 or torch.uint8")
    if weight_scales.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise TypeError(f"weight_scales.dtype={weight_scales.dtype}: expected torch.float8_e4m3fn or torch.uint8")
    N = weight_fp4.shape[0]
    if N == 0 or N % 16:
        raise ValueError(f"weight_fp4.shape[0]=N={N}: expected a positive multiple of 16")
    if tuple(weight_fp4.shape) != (N, K // 2):
        raise ValueError(f"weight_fp4.shape={tuple(weight_fp4.shape)}: expected (N, K/2)=({N}, {K // 2}) for x K={K}")
    if tuple(weight_scales.shape) != (N, K // 16):
        raise ValueError(f"weight_scales.shape={tuple(weight_scales.shape)}: expected (N, K/16)=({N}, {K // 16})")
    if weight_fp4.data_ptr() % 16 or weight_scales.data_ptr() % 16:
        bad = "weight_fp4" if weight_fp4.data_ptr() % 16 else "weight_scales"
        off = (weight_fp4 if bad == "weight_fp4" else weight_scales).data_ptr() % 16
        raise ValueError(f"{bad}.data_ptr() % 16 = {off}: expected a 16-byte aligned base (the kernels read it in "
                         "4-16-byte words; .clone() aligns it)")
    if not isinstance(weight_global_decode_scale, (float, int)) or isinstance(weight_global_decode_scale, bool):
        raise TypeError(f"weight_global_decode_scale: expected a python float, got "
                        f"{type(weight_global_decode_scale).__name__}")
    if not (math.isfinite(weight_global_decode_scale) and weight_global_decode_scale > 0):
        raise ValueError(f"weight_global_decode_scale={weight_global_decode_scale!r}: expected a finite positive float "
                         "(the recipe's global decode scale amax / (448 * 6), or 1 for an all-zero weight)")
    cfg = pick_linear_config(M) if config is None else config
    if not isinstance(cfg, LinearConfig):
        raise TypeError(f"config: expected a LinearConfig or None, got {type(cfg).__name__}")
    if out is None:
        out = torch.empty((*x.shape[:-1], N), dtype=torch.bfloat16, device=x.device)
    elif (not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or tuple(out.shape) != (*x.shape[:-1], N)
          or not out.is_contiguous() or out.device != x.device):
        raise ValueError(f"out: expected a contiguous bfloat16 tensor of shape {(*x.shape[:-1], N)} on {x.device}, "
                         f"got {getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}")
    w_gdec = float(weight_global_decode_scale)

    if cfg.GEMM is not None:
        # Large-M path: x dequantized by the quantizer, W decoded to the cached workspace (both exact, in
        # _PREPASS_DTYPE), then the persistent TMA GEMM whose epilogue is acc * fp32(x_gdec * w_gdec), one RNE
        # to bf16.
        _, _, deq, xgdec = _quantize_launch(x2, write_packed=False, write_dequant=True, deq_dtype=_PREPASS_DTYPE,
                                            w_gdec=w_gdec)
        _LAST_QUANT.pop("recs", None)
        wdq = _weight_workspace(x.device, N, K, _PREPASS_DTYPE)
        _decode_weight(weight_fp4.view(torch.uint8), weight_scales.view(torch.uint8), wdq, cfg.PREPASS)
        if out.data_ptr() % 16 == 0:
            _gemm_scaled(deq, wdq, xgdec[1:], cfg.GEMM, out.view(M, N))
        else:  # TMA stores need a 16-byte aligned base: a caller's unaligned out gets a copy
            tmp = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
            _gemm_scaled(deq, wdq, xgdec[1:], cfg.GEMM, tmp)
            out.view(M, N).copy_(tmp)
        return out

    # GEMV: x dequantized to fp32 (exact; the kernel's FMAs take fp32 operands), W as one int64 per NVFP4 block
    _, _, deq, xgdec = _quantize_launch(x2, write_packed=False, write_dequant=True,
                                        deq_dtype=torch.float32 if cfg.GEMV else torch.float16)
    ws = weight_scales.view(torch.uint8)
    block_k = _block_k_for(K, cfg.BLOCK_K)
    grid = (triton.cdiv(N, cfg.BLOCK_N), triton.cdiv(M, cfg.BLOCK_M), cfg.SPLIT_K)
    if cfg.SPLIT_K > 1:
        counts = _sync_words(x.device, grid[0] * grid[1])
        part = torch.empty((cfg.SPLIT_K, M, N), dtype=torch.float32, device=x.device)
    else:
        counts = part = out  # unused
    if cfg.GEMV:
        w = weight_fp4.view(torch.uint8).view(torch.int64)  # [N, K/16]: one NVFP4 block (16 codes) per int64
        lin_tail = (w_gdec, M, N, K, K // 16)
        rec_lin = _gemv_launch(grid, w, ws, deq, xgdec, out, part, counts, *lin_tail,
                               BLOCK_N=cfg.BLOCK_N, BLOCK_M=cfg.BLOCK_M, BLOCK_K=block_k, SPLIT_K=cfg.SPLIT_K,
                               VEC=min(_GEMV_VEC, block_k // 16), num_warps=cfg.num_warps,
                               num_stages=cfg.num_stages, enable_reflect_ftz=False)
    else:
        w = weight_fp4.view(torch.uint8).view(torch.int32)  # [N, K/8]: 8 codes per word (K % 16 == 0)
        lin_tail = (w_gdec, M, N, K)
        scale_words = bool(cfg.SCALE_WORDS) and K % 64 == 0 and block_k % 64 == 0
        if scale_words:
            ws = ws.view(torch.int32)  # [N, K/64]
        rec_lin = _linear_launch(grid, w, ws, deq, xgdec, out, part, counts, w_gdec, M, N, K,
                                 BLOCK_N=cfg.BLOCK_N, BLOCK_M=cfg.BLOCK_M, BLOCK_K=block_k, SPLIT_K=cfg.SPLIT_K,
                                 DECODE_PTX=not _interpreting(), DECODE_BITS=bool(cfg.DECODE_BITS),
                                 SCALE_WORDS=scale_words, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    rec_amax, rec_quant, parts, numel, iters, nprog = _LAST_QUANT.pop("recs", (None,) * 6)
    scratch = deq.numel() * deq.element_size() + (part.numel() * 4 if cfg.SPLIT_K > 1 else 0)
    if use_plan and rec_amax and rec_quant and rec_lin and scratch <= _PLAN_MAX_SCRATCH:
        plan = _LinearPlan()
        plan.amax, plan.quant, plan.lin = rec_amax, rec_quant, rec_lin
        plan.amax_args = (parts, numel, iters)
        plan.quant_args = (parts, xgdec, xgdec, deq, xgdec, 1.0, M, K, x2.stride(0), nprog)
        plan.lin_args = (w, ws, deq, xgdec, part, counts, *lin_tail)
        plan.out_shape = tuple(out.shape)
        plan.device = x.device
        plan.stream = _raw_stream(x.device)
        plan.bound = _bind_linear(plan)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[key] = plan
    return out
