"""GEMV path of gemm_fp16 (``GemvConfig``): CUDA cores, no tensor cores, no split-K; a row or two of A.

At M = 1-2 the GEMM is a read of B (12.6 MB at N = 3072, K = 2048) with one or two products per element, and
what a tensor-core kernel adds to that read is its pipeline: the swap-AB Gluon kernel has 48 CTAs (one per 64 rows
of B) stream B through a TMA ring, and measures ~1 us above a bare read of B. This kernel is laid out like a bare
read instead:

* many small programs: program p owns BLOCK_N rows of B, the whole K, and every row of A (BLOCK_M = M padded to a
  power of two), so no partial sum leaves the program (no workspace, no arrival counter); at the table's
  BLOCK_N = 1-2 that is 1536-3072 programs of one warp, each reading 4-8 KB of B;
* per iteration a [BLOCK_N, BLOCK_K] tile of B and the [BLOCK_M, BLOCK_K] tile of A (16-byte loads: unit K
  stride, 16-byte aligned rows, as gemm_fp16 requires), converted to fp32 and multiplied (fp16 x fp16 products are
  exact in fp32), the BLOCK_K products of each (row of A, row of B) summed by ``tl.sum`` (a fixed tree per
  config) and added to the fp32 accumulator: fp32 RN throughout, in an order fixed by the config, so the output
  is bitwise reproducible and bounded by ``fp32_rn`` (gamma_K);
* one RNE rounding of the fp32 sum to fp16 (overflow to +-inf), as every gemm_fp16 path.

A `tl` kernel: the CPU interpreter runs it as it is (tests), the GPU runs it compiled.
"""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["gemm_fp16_gemv_kernel", "gemv_constexprs"]


def gemv_constexprs(config, M: int, K: int) -> dict:
    """The kernel's constexprs for ``config`` (a GemvConfig) at M rows of A and this K."""
    return dict(BLOCK_M=triton.next_power_of_2(M), BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K,
                EVEN_K=K % config.BLOCK_K == 0)


@triton.jit(do_not_specialize=["M"])  # one build for every M of a BLOCK_M
def gemm_fp16_gemv_kernel(
    a_ptr, b_ptr, c_ptr,  # A fp16 [M, K], B fp16 [N, K] (unit K stride), C fp16 [M, N] (contiguous)
    M, N, K, stride_am, stride_bn, stride_cm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = (rm < M)[:, None]
    n_ok = (rn < N)[:, None]
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :]
    b_ptrs = b_ptr + rn[:, None].to(tl.int64) * stride_bn + rk[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            b = tl.load(b_ptrs + k0, mask=n_ok, other=0.0)
            a = tl.load(a_ptrs + k0, mask=m_ok, other=0.0)
        else:
            k_ok = (k0 + rk < K)[None, :]
            b = tl.load(b_ptrs + k0, mask=n_ok & k_ok, other=0.0)
            a = tl.load(a_ptrs + k0, mask=m_ok & k_ok, other=0.0)
        # [BLOCK_M, 1, BLOCK_K] x [1, BLOCK_N, BLOCK_K]: exact products, summed over K in fp32
        acc += tl.sum(a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :], axis=2)
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(tl.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))
