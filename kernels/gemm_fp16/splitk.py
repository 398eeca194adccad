"""The split-K pointer path of gemm_fp16 (``SplitKConfig``; small M, memory-bound on B).

``gemm_fp16_splitk_kernel``: pointer loads (cp.async pipelined on sm_90), one program per (C tile, K slice),
grid (num_tiles, SPLIT_K). With SPLIT_K > 1 each program writes its fp32 partial tile to a workspace, then
increments the tile's arrival counter (an atomic with acq_rel semantics); the LAST program to arrive sums the
SPLIT_K partials in the fixed order s = 0, 1, ..., SPLIT_K-1 in fp32, rounds once to fp16 and resets the counter
(``_splitk_reduce``, shared with the TMA kernel). Which program arrives last varies run to run, the summation
order does not: the output is bitwise deterministic. No program ever waits for another, so there is no deadlock
whatever order the hardware schedules programs in.
"""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["gemm_fp16_splitk_kernel", "splitk_constexprs"]


@triton.jit
def _splitk_reduce(acc, ws_ptr, cnt_ptr, tile, pid_k, num_tiles, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   SPLIT_K: tl.constexpr):  # fmt: skip
    """Deterministic split-K reduction shared by both kernels; returns (is_last, total).

    This program's fp32 partial tile ``acc`` (K slice ``pid_k`` of C tile ``tile``) goes to the workspace
    (bypassing L1: another SM reads it), then the tile's arrival counter is incremented (acq_rel atomic). The LAST
    program to arrive gets is_last True and total = the fixed-order fp32 (RNE) sum of the SPLIT_K partials,
    s = 0, 1, ..., SPLIT_K - 1, and resets the counter to 0 for the next launch; the caller stores total. Which
    program arrives last varies run to run, the summation order does not: bitwise deterministic. No program
    waits for another (no deadlock whatever the scheduling order). Other programs get (False, acc), unused.
    """
    tile_elems = BLOCK_M * BLOCK_N
    offs_t = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    ws_tile = ws_ptr + tile.to(tl.int64) * tile_elems
    ws_stride_s = num_tiles.to(tl.int64) * tile_elems
    tl.store(ws_tile + pid_k * ws_stride_s + offs_t, acc, cache_modifier=".cg")
    tl.debug_barrier()  # every thread's partial stores precede the release below
    arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    is_last = arrived == SPLIT_K - 1
    total = acc
    if is_last:
        total = tl.load(ws_tile + offs_t, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT_K):
            total += tl.load(ws_tile + s * ws_stride_s + offs_t, cache_modifier=".cg")
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next launch
    return is_last, total


@triton.jit(do_not_specialize=["M"])
def gemm_fp16_splitk_kernel(
    # pointers
    a_ptr,  # *fp16 [M, K], unit stride along K
    b_ptr,  # *fp16 [N, K], unit stride along K
    c_ptr,  # *fp16 [M, N], row-major (written)
    ws_ptr,  # *fp32 [SPLIT_K, num_tiles, BLOCK_M * BLOCK_N] partial tiles (SPLIT_K > 1 only)
    cnt_ptr,  # *i32 [num_tiles] arrival counters, all 0 between launches (SPLIT_K > 1 only)
    # sizes
    M,
    N,
    K,
    # strides (elements)
    stride_am,
    stride_bn,
    stride_cm,
    # meta-parameters
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,  # K is a multiple of BLOCK_K * SPLIT_K: no K masks
):
    tile = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    # Grouped tile order (tutorial 03): GROUP_M row-tiles share each B column-tile while it is in L2.
    group_size = GROUP_M * num_pid_n
    first_m = (tile // group_size) * GROUP_M
    rows_in_group = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % group_size) % rows_in_group
    pid_n = (tile % group_size) // rows_in_group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows past M / N are clamped to valid rows (their results are never stored), so A/B loads need no M/N mask.
    offs_am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)

    # This program's K slice: k-tiles [pid_k * tiles_per_split, (pid_k + 1) * tiles_per_split).
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_start = pid_k * tiles_per_split * BLOCK_K
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + (k_start + offs_k)[None, :]
    b_ptrs = b_ptr + offs_bn[:, None] * stride_bn + (k_start + offs_k)[None, :]

    # fp32 accumulation on the tensor cores; fp16 x fp16 products are exact.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tiles_per_split):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - (k_start + kt * BLOCK_K)
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(tl.float16), mask=c_mask)  # one RNE fp32 -> fp16
    else:
        is_last, total = _splitk_reduce(acc, ws_ptr, cnt_ptr, tile, pid_k, num_tiles, BLOCK_M, BLOCK_N, SPLIT_K)
        if is_last:
            tl.store(c_ptrs, total.to(tl.float16), mask=c_mask)  # one RNE fp32 -> fp16


def splitk_constexprs(config, K: int) -> dict:
    """gemm_fp16_splitk_kernel's constexpr arguments for ``config`` (a SplitKConfig) at reduction length K, in
    parameter order."""
    BK, S = config.BLOCK_K, config.SPLIT_K
    return dict(BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=BK, SPLIT_K=S, GROUP_M=config.GROUP_M,
                EVEN_K=(K % (BK * S) == 0))  # fmt: skip
