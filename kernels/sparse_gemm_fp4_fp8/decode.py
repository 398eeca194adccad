"""E2M1 -> E4M3FN decode of the 2:4 sparse A operand, shared by both paths (jit helpers).

Operand layout (docs/kernels.md, "sparse_gemm_fp4_fp8"), per group g of 4 K-columns, K = 4 * G:
    vals  byte (int8 storage, read as unsigned): low nibble = E2M1 code of v0, high nibble = E2M1 code of v1
    meta  byte (int8 storage, read as unsigned): bits 1:0 = idx0, bits 3:2 = idx1, bits 7:4 ignored
A group becomes its 4 E4M3FN bytes, v0 at idx0 plus v1 at idx1 (a duplicate index holds v0 + v1). Exact: E2M1
values and the sums of two of them lie on 2^-1 Z with <= 4 significant bits, so they are E4M3FN values.

* ``_a_words``: [BLOCK_M, BLOCK_G] uint32 words, one per group, byte j = column 4g + j (the expand pre-pass
  stores them as int32; the fused kernel's ``_a_tile`` interleaves them into a dense tile).
* ``_a_tile``: the dense E4M3FN tile [BLOCK_M, BLOCK_K] (fused kernel, NaN slow path).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _e4m3_of_e2m1(code):
    """E2M1 code (uint32, 0..15) -> its E4M3FN byte (uint32). Exact: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 are
    bytes 0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C (4*mag + 0x30 for mag >= 2); sign bit 3 -> bit 7."""
    mag = code & 7
    return tl.where(mag > 1, (mag << 2) + 0x30, mag * 0x30) | ((code & 8) << 4)


@triton.jit
def _twice_e2m1(code):
    """2 x the value of E2M1 code (uint32, 0..15) as int32 in [-12, 12]: magnitudes 0, 1, 2, 3, 4, 6, 8, 12."""
    mag = code & 7
    tw = tl.where(mag < 4, mag, (4 + 2 * (mag & 1)) << ((mag >> 1) - 2)).to(tl.int32)
    return tl.where((code & 8) != 0, -tw, tw)


@triton.jit
def _e4m3_of_e2m1_sum(code0, code1):
    """E4M3FN byte (uint32) of e2m1(code0) + e2m1(code1), exact, with integer operations and one exact int -> fp32
    conversion (no fp8 conversion instruction). s = 2 x the sum is an integer, |s| <= 24 with <= 4 significant
    bits; |sum| = |s| / 2 >= 0.5 is an E4M3FN normal: exponent field = e32(|s|) - 127 - 1 + 7, mantissa = the top 3
    fraction bits of fp32(|s|); sign bit 7. A zero sum gives +0 (byte 0x00)."""
    s = _twice_e2m1(code0) + _twice_e2m1(code1)
    a = tl.abs(s)
    bits = a.to(tl.float32).to(tl.uint32, bitcast=True)
    byte = ((((bits >> 23) & 0xFF) - 121) << 3) | ((bits >> 20) & 7)
    byte = tl.where(s < 0, byte | 0x80, byte)
    return tl.where(a == 0, 0, byte).to(tl.uint32)


@triton.jit
def _a_words(vals_ptr, meta_ptr, stride_am, stride_ag, offs_m, M, G, g0,
             BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, SELECTOR: tl.constexpr):
    """uint32 [BLOCK_M, BLOCK_G]: for groups g0 ... g0 + BLOCK_G - 1 of A, the group's 4 E4M3FN bytes as one
    little-endian word (byte j = column 4g + j).

    SELECTOR=False: the values (v0 at idx0 plus v1 at idx1; a duplicate index holds v0 + v1, exact).
    SELECTOR=True: 1.0 at each selected position (used to count selected NaNs of b).
    Rows >= M and groups >= G load zero bytes, which decode to an all-zero group.
    """
    offs_g = g0 + tl.arange(0, BLOCK_G)
    mask = (offs_m[:, None] < M) & (offs_g[None, :] < G)
    off = offs_m[:, None] * stride_am + offs_g[None, :] * stride_ag
    # int8 storage, read as unsigned bytes: bitcast to uint8 first, then zero-extend
    meta = tl.load(meta_ptr + off, mask=mask, other=0).to(tl.uint8, bitcast=True).to(tl.uint32)
    sh0 = (meta & 3) << 3    # bit offset of idx0's byte in the group's word
    sh1 = (meta & 12) << 1   # bit offset of idx1's byte; meta bits 7:4 are never read
    if SELECTOR:
        word = (0x38 << sh0) | (0x38 << sh1)  # 0x38 = E4M3FN 1.0
    else:
        vals = tl.load(vals_ptr + off, mask=mask, other=0).to(tl.uint8, bitcast=True).to(tl.uint32)
        e0 = _e4m3_of_e2m1(vals & 15)
        e1 = _e4m3_of_e2m1(vals >> 4)
        # duplicate index: one byte holds v0 + v1, built with integer arithmetic only (_e4m3_of_e2m1_sum). (An
        # fp16 add + .to(tl.float8e4nv) was exact in the interpreter but gave wrong bytes (0xFC) on the H200 for
        # tiles of >= 64 groups: triton 3.6's packed cvt.rn.satfinite.e4m3x2.f16x2 path; docs/kernels.md.)
        es = _e4m3_of_e2m1_sum(vals & 15, vals >> 4)
        word = tl.where(sh0 == sh1, es << sh0, (e0 << sh0) | (e1 << sh1))
    return word


@triton.jit
def _a_tile(vals_ptr, meta_ptr, stride_am, stride_ag, offs_m, M, G, g0,
            BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SELECTOR: tl.constexpr):
    """Dense E4M3FN tile [BLOCK_M, BLOCK_K] of A for K-columns 4*g0 ... 4*g0 + BLOCK_K - 1 (see _a_words).

    Work is per group (byte pair), in the loaded [BLOCK_M, BLOCK_K/4] layout: each group becomes one 32-bit word
    holding its 4 E4M3FN bytes, split into bytes and interleaved with tl.join + tl.reshape (no data movement).
    """
    word = _a_words(vals_ptr, meta_ptr, stride_am, stride_ag, offs_m, M, G, g0, BLOCK_M, BLOCK_K // 4, SELECTOR)
    # column 4g + j holds byte j of word g: interleave the 4 byte planes (join puts the new axis in-thread)
    c0 = (word & 0xFF).to(tl.uint8)
    c1 = ((word >> 8) & 0xFF).to(tl.uint8)
    c2 = ((word >> 16) & 0xFF).to(tl.uint8)
    c3 = (word >> 24).to(tl.uint8)
    x = tl.join(tl.join(c0, c2), tl.join(c1, c3))  # [BM, G, 2, 2]: [m, g, i, s] = byte 2i + s
    return tl.reshape(x, [BLOCK_M, BLOCK_K]).to(tl.float8e4nv, bitcast=True)
