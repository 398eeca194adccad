"""GEMV path of sparse_gemm_fp4_fp8 (``GemvConfig``): CUDA cores, no tensor cores, no split-K; a few rows of A.

At M = 1 the GEMM is a read of b (4 MiB at N = K = 2048) plus a handful of products per byte, so this kernel
does what a bare read does and little else:

* many small programs: program p owns BLOCK_N rows of b, the whole K, and every row of A (BLOCK_M = M padded to a
  power of two), so no partial sums leave the program (no split-K workspace, no arrival counter);
* b is read as int32 words (4 E4M3FN bytes of one group of 4 K-columns), BLOCK_G groups per chunk, the next
  chunk's words and A bytes loaded before this chunk's arithmetic, so a chunk of loads is always in flight;
* per chunk and position j of the group: the dense A value a_j (v0 where idx0 == j, plus v1 where idx1 == j: a
  duplicate index holds v0 + v1) times b's byte j converted to fp32 (E2M1 x E4M3FN products are exact in fp32),
  added into a per-lane fp32 partial [BLOCK_M, BLOCK_N, BLOCK_G]; the lanes are summed once at the end (a fixed
  tree), so the order is fixed per config: bitwise reproducible, within ``fp32_rn`` (any-order fp32 sums).
* NaN policy (package docstring): the fast pass multiplies every b byte, pruned positions by a zero value, so a
  NaN byte anywhere in the program's rows makes its sums NaN; a program whose sums hold a NaN recomputes them
  with the pruned positions masked out (the products of selected positions only), so a NaN reaches c iff the
  metadata selects it. NAN_BITS (the CPU interpreter, which decodes E4M3FN NaN bytes as +-480, or
  ``nan_check_bytes=True``) runs only the masked pass and turns a selected NaN byte into NaN by its bits.
* the output: one RNE rounding of the fp32 sum to bf16 (GPU).

A `tl` kernel: the CPU interpreter runs it as it is (tests), the GPU tests and benchmarks run it compiled.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .decode import _twice_e2m1

__all__ = ["sparse_gemv_kernel"]


@triton.jit
def _chunk_terms(acc, w, v, t, MASKED: tl.constexpr, NAN_BITS: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N, BLOCK_G] fp32 += the products of one chunk: w [BLOCK_N, BLOCK_G] int32 words of b,
    v / t [BLOCK_M, BLOCK_G] uint32 vals / meta bytes. MASKED: products of the selected positions only."""
    v0 = _twice_e2m1(v & 15).to(tl.float32) * 0.5  # exact: 2 x an E2M1 value is an int in [-12, 12]
    v1 = _twice_e2m1(v >> 4).to(tl.float32) * 0.5
    i0 = t & 3
    i1 = (t >> 2) & 3
    for j in tl.static_range(4):
        a_j = tl.where(i0 == j, v0, 0.0) + tl.where(i1 == j, v1, 0.0)  # exact (E2M1 sums)
        byte = ((w >> (8 * j)) & 0xFF).to(tl.uint8)
        b_j = byte.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        prod = a_j[:, None, :] * b_j[None, :, :]  # exact
        if MASKED:
            sel = ((i0 == j) | (i1 == j))[:, None, :]
            if NAN_BITS:
                prod = tl.where(((byte & 0x7F) == 0x7F)[None, :, :], float("nan"), prod)
            prod = tl.where(sel, prod, 0.0)
        acc += prod
    return acc


@triton.jit
def _row_sums(vals_ptr, meta_ptr, bw_ptr, rm, rn, M, N, G, stride_am, stride_ag, stride_bw,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, MASKED: tl.constexpr,
              NAN_BITS: tl.constexpr):
    """fp32 [BLOCK_M, BLOCK_N]: sum over every group of the products of rows rm of A and rows rn of b."""
    rg = tl.arange(0, BLOCK_G)
    m_ok = (rm < M)[:, None]
    n_ok = (rn < N)[:, None]
    w_ptrs = bw_ptr + rn[:, None].to(tl.int64) * stride_bw + rg[None, :]
    a_offs = rm[:, None].to(tl.int64) * stride_am + rg[None, :] * stride_ag
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_G], tl.float32)
    w = tl.load(w_ptrs, mask=n_ok & (rg[None, :] < G), other=0)
    v = tl.load(vals_ptr + a_offs, mask=m_ok & (rg[None, :] < G), other=0)
    t = tl.load(meta_ptr + a_offs, mask=m_ok & (rg[None, :] < G), other=0)
    for g0 in range(0, G, BLOCK_G):
        # the next chunk's loads go out before this chunk's arithmetic (past G they load nothing)
        g1 = g0 + BLOCK_G
        g_ok = (g1 + rg < G)[None, :]
        w_next = tl.load(w_ptrs + g1, mask=n_ok & g_ok, other=0)
        v_next = tl.load(vals_ptr + a_offs + g1 * stride_ag, mask=m_ok & g_ok, other=0)
        t_next = tl.load(meta_ptr + a_offs + g1 * stride_ag, mask=m_ok & g_ok, other=0)
        acc = _chunk_terms(acc, w, v.to(tl.uint8, bitcast=True).to(tl.uint32),
                           t.to(tl.uint8, bitcast=True).to(tl.uint32), MASKED, NAN_BITS)
        w = w_next
        v = v_next
        t = t_next
    return tl.sum(acc, axis=2)


@triton.jit(do_not_specialize=["M"])  # one build for every M of a BLOCK_M
def sparse_gemv_kernel(
    vals_ptr, meta_ptr, b_ptr, c_ptr,  # A bytes [M, G] (int8), b [N, 4G] E4M3FN (4-byte aligned rows), c [M, N] bf16
    M, N, G, stride_am, stride_ag, stride_bn, stride_cm, stride_cn,  # strides in elements (b: bytes, % 4 == 0)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, NAN_BITS: tl.constexpr,
):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    bw_ptr = b_ptr.to(tl.pointer_type(tl.int32), bitcast=True)  # one word = the 4 bytes of a group
    stride_bw = stride_bn // 4
    if NAN_BITS:
        acc = _row_sums(vals_ptr, meta_ptr, bw_ptr, rm, rn, M, N, G, stride_am, stride_ag, stride_bw,
                        BLOCK_M, BLOCK_N, BLOCK_G, True, True)
    else:
        acc = _row_sums(vals_ptr, meta_ptr, bw_ptr, rm, rn, M, N, G, stride_am, stride_ag, stride_bw,
                        BLOCK_M, BLOCK_N, BLOCK_G, False, False)
        if tl.max(tl.max((acc != acc).to(tl.int32), axis=1), axis=0) != 0:  # a NaN byte somewhere in these rows
            acc = _row_sums(vals_ptr, meta_ptr, bw_ptr, rm, rn, M, N, G, stride_am, stride_ag, stride_bw,
                            BLOCK_M, BLOCK_N, BLOCK_G, True, False)
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))
