"""The CUDA-core GEMV path: ``nvfp4_gemv_kernel`` (GemvConfig; batch-1 decode, M of a few rows).

One integer decode per weight element (E2M1 code -> fp32 bits E2M1(c) * 2^-126) and one fp32 FMA per row of x;
each 16-element block's dot product is exact in fp32, only the K/16 block terms are added with rounding (model
``configs.accumulation_model(config, K)``: splitk(fp32_rn_block16, C); the derivation is above the kernel).
Split-K partials are summed by the tile's last program in fixed order (tensorcore.splitk_last_arrival).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._runtime import Launch
from .configs import GemvConfig, block_k_for
from .tensorcore import splitk_buffers, splitk_last_arrival

__all__ = ["GEMV_VEC", "GemvLaunch", "nvfp4_gemv_kernel"]


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
#   (configs.accumulation_model). Scaling every term by 2^-26 changes no rounding (all stay normal), and acc * 2^26
#   is exact.
# * epilogue as the other paths: acc * 2^26 (exact) * fp32(x_gdec * w_gdec), one RNE rounding to bf16.
# Deterministic: fixed reduction orders only (tl.sum over a fixed layout compiles to a fixed shuffle tree, the
# same on every run on the same GPU and build), no floating-point atomics.
# Contiguous NVFP4 blocks per thread in the GEMV's weight tile (its VEC): 2 (16-byte loads). Without the hint
# Triton 3.6 gives each thread ONE weight row and all its BLOCK_K/16 blocks, so every x value is loaded once per
# weight element (sm_90 SASS at BLOCK_N 64, BLOCK_K 256, M = 1: 874 instructions per 128 elements, 133 of them
# loads); with it a thread holds 4 rows x 2 blocks and loads each x value once per 4 weight rows (778, 40 loads).
GEMV_VEC = 2


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
        splitk_last_arrival(count_ptr, pid_m * tl.num_programs(0) + pid_n, part_ptr, out_ptr, out_offs, out_mask,
                             N.to(tl.int64) * M, 67108864.0, g, SPLIT_K)  # 2^26: undo the decode's 2^-26 (exact)



class GemvLaunch:
    """``nvfp4_gemv_kernel`` for x [M, K] times W [N, K] with ``config``; BLOCK_K narrowed to a power of two
    dividing K.

    ``run(stream, device, weight_fp4, weight_scales, deq, gdec, out, w_gdec)``: ``deq`` fp32 [>= M K] dequantized
    x (code * block scale, exact), ``gdec`` fp32 [2] from the quantizer, ``out`` bf16 [M, N] contiguous."""

    __slots__ = ("launch", "split_k", "tiles", "M", "N", "K")

    def __init__(self, config: GemvConfig, M: int, N: int, K: int):
        block_k = block_k_for(K, config.BLOCK_K)
        grid = (triton.cdiv(N, config.BLOCK_N), triton.cdiv(M, config.BLOCK_M), config.SPLIT_K)
        self.M, self.N, self.K, self.split_k, self.tiles = M, N, K, config.SPLIT_K, grid[0] * grid[1]
        self.launch = Launch(
            nvfp4_gemv_kernel, grid,
            dict(BLOCK_N=config.BLOCK_N, BLOCK_M=config.BLOCK_M, BLOCK_K=block_k, SPLIT_K=config.SPLIT_K,
                 VEC=min(GEMV_VEC, block_k // 16)),
            num_warps=config.num_warps, num_stages=config.num_stages, enable_reflect_ftz=False)

    def run(self, stream: int, device, weight_fp4, weight_scales, deq, gdec, out, w_gdec: float) -> None:
        w = weight_fp4.view(torch.int64)  # [N, K/16]: one NVFP4 block (16 codes) per int64
        ws = weight_scales.view(torch.uint8)
        part, cnt = splitk_buffers(device, stream, self.split_k, self.split_k * self.M * self.N, self.tiles)
        self.launch.launch(stream, w, ws, deq, gdec, out, part, cnt, w_gdec, self.M, self.N, self.K, self.K // 16)
