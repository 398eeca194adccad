"""The expand path (``ExpandConfig``, large M): decode pre-pass, persistent TMA fp8 GEMM, NaN fix-up.

The fused loop's in-loop decode (~1000 instructions per K-tile) cannot overlap the MMA, so at large M:
1. ``sparse_expand_a_kernel`` decodes (vals, meta) with the fused kernel's own ``_a_words`` into a dense E4M3FN
   A [M, K] in a workspace (reads 0.5 B, writes 1 B per element of A; each group's 4 bytes are one
   little-endian word, stored as an int32: no byte interleave);
2. ``sparse_gemm_expanded_kernel``, a persistent GEMM whose A and b tiles come through TMA into shared memory,
   runs fp8 wgmma with the fused fp8 path's per-K-tile promotion and one RNE rounding;
3. a dense MMA spreads a NaN byte of b at a pruned position through 0 * NaN, so a tile whose raw accumulator
   holds a NaN is recomputed by the fused kernel's exact slow path (``_nan_tile``, decoding from vals/meta):
   inline (``INLINE_FIXUP``) or, flagged, by ``sparse_nan_fixup_kernel`` in a third launch.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .decode import _a_words
from .fused import _mma, _nan_tile

__all__ = ["PREP_BLOCK_G", "PREP_BLOCK_M", "PREP_WARPS", "sparse_expand_a_kernel", "sparse_gemm_expanded_kernel",
           "sparse_nan_fixup_kernel"]

# decode pre-pass tile, in groups (0.5 B read, 1 B written per element of A); on the H200 at N = K = 2048, 16 x 128
# took 3.6 us at M = 1024 against 4.5 for 32 x 128 and 16.1 vs 16.4 at M = 8192 (where every shape tried, 8 x 512
# to 128 x 64, took 16-19 us: the bytes under the benchmark's write flush)
PREP_BLOCK_M, PREP_BLOCK_G, PREP_WARPS = 16, 128, 4


@triton.jit(do_not_specialize=["M"])
def sparse_expand_a_kernel(
    vals_ptr, meta_ptr,            # int8 [M, G]
    a8w_ptr,                       # int32 view of the dense E4M3FN A [M, 4G] (written): row stride stride_wm words
    M, G,
    stride_am, stride_ag, stride_wm,
    BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr,
    # let the GEMM, launched with programmatic dependent launch (the Gluon GEMM), start as this grid starts: it
    # loads its first b tiles, then waits for this grid's completion (griddepcontrol.wait) before reading A
    TRIGGER_DEPENDENTS: tl.constexpr = False,
):
    """Dense E4M3FN A from (vals, meta) by the fused kernel's own decode (_a_words), exact, duplicate indices add:
    each group's word holds its 4 bytes in column order (little-endian), so it is stored as one int32."""
    if TRIGGER_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_g = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    word = _a_words(vals_ptr, meta_ptr, stride_am, stride_ag, offs_m, M, G, tl.program_id(1) * BLOCK_G,
                    BLOCK_M, BLOCK_G, False)
    mask = (offs_m[:, None] < M) & (offs_g[None, :] < G)
    tl.store(a8w_ptr + offs_m[:, None] * stride_wm + offs_g[None, :], word.to(tl.int32, bitcast=True), mask=mask)


@triton.jit(do_not_specialize=["M", "num_programs"])
def sparse_gemm_expanded_kernel(
    a_desc,                        # float8_e4m3fn [M, K] dense A (the pre-pass output), block [BLOCK_M, BLOCK_K]
    b_desc,                        # float8_e4m3fn [N, K], block [BLOCK_N // N_SPLIT, BLOCK_K]
    vals_ptr, meta_ptr,            # int8 [M, G]: read only by the NaN slow path
    b_ptr,                         # b_fp8 again, through pointers (NaN slow path)
    c_ptr,                         # bfloat16 [M, N]
    flag_ptr,                      # int32 [tiles]: set to 1 for a tile with a NaN (INLINE_FIXUP=False), else unused
    M, N, K, num_programs,
    stride_am, stride_ag,
    stride_bn, stride_bk,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    N_SPLIT: tl.constexpr,          # 1 or 2 column blocks of BLOCK_N // N_SPLIT, one fp32 accumulator each
    INLINE_FIXUP: tl.constexpr,     # True: recompute NaN tiles here; False: flag them for sparse_nan_fixup_kernel
    NAN_CHECK_BYTES: tl.constexpr,  # True: detect NaN bytes of b directly; False: from the raw accumulator
    EVEN_K: tl.constexpr,           # K % BLOCK_K == 0 (masks of the slow path)
):
    """Persistent fp8 GEMM over C tiles (grouped order), both operands through TMA into shared memory.

    Accumulation as the fused fp8 path: per K-tile (BLOCK_K <= 128) a fresh wgmma accumulator, added into fp32.
    A dense MMA spreads a NaN byte of b through 0 * NaN at pruned positions, so a tile whose raw accumulator
    holds a NaN is recomputed by the fused kernel's exact slow path (_nan_tile: A decoded from vals/meta), which
    gives NaN exactly where row m's metadata selects a NaN byte.
    """
    BN: tl.constexpr = BLOCK_N // N_SPLIT
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    num_in_group = GROUP_M * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    G = K // 4
    offs_k = tl.arange(0, BLOCK_K)
    for tile in tl.range(start, num_tiles, num_programs):
        first_m = (tile // num_in_group) * GROUP_M
        group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (tile % num_in_group) % group_size
        pid_n = (tile % num_in_group) // group_size
        acc0 = tl.zeros((BLOCK_M, BN), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_M, BN), dtype=tl.float32)  # N_SPLIT == 2 only
        nan_rows = tl.zeros((BN,), dtype=tl.int32)
        for kt in range(0, k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])   # rows >= M, columns >= K: zeros (TMA padding)
            b = b_desc.load([pid_n * BLOCK_N, kt * BLOCK_K])
            if NAN_CHECK_BYTES:
                nan_b = (b.to(tl.uint8, bitcast=True) & 0x7F) == 0x7F
                nan_rows = tl.maximum(nan_rows, tl.max(nan_b.to(tl.int32), axis=1))
            acc0 = _mma(a, b, acc0, BLOCK_K, 1)  # fp8 wgmma, promoted into fp32 every K-tile
            if N_SPLIT == 2:
                b1 = b_desc.load([pid_n * BLOCK_N + BN, kt * BLOCK_K])
                if NAN_CHECK_BYTES:
                    nan_b1 = (b1.to(tl.uint8, bitcast=True) & 0x7F) == 0x7F
                    nan_rows = tl.maximum(nan_rows, tl.max(nan_b1.to(tl.int32), axis=1))
                acc1 = _mma(a, b1, acc1, BLOCK_K, 1)
        if NAN_CHECK_BYTES:
            has_nan = tl.max(nan_rows, axis=0) > 0
        else:
            has_nan = tl.max(tl.where(acc0 != acc0, 1, 0)) > 0
            if N_SPLIT == 2:
                has_nan = has_nan | (tl.max(tl.where(acc1 != acc1, 1, 0)) > 0)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        if has_nan:
            if INLINE_FIXUP:
                _nan_fix_tile(vals_ptr, meta_ptr, b_ptr, c_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ag,
                              stride_bn, stride_bk, stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, BN, EVEN_K)
            else:
                tl.store(flag_ptr + pid_m * num_pid_n + pid_n, 1)  # c of this tile: written by the fix-up launch
        else:
            offs_n = pid_n * BLOCK_N + tl.arange(0, BN)
            c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
            tl.store(c_ptrs, acc0.to(tl.bfloat16), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # one RNE
            if N_SPLIT == 2:
                offs_n = offs_n + BN
                c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
                tl.store(c_ptrs, acc1.to(tl.bfloat16), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _nan_fix_tile(vals_ptr, meta_ptr, b_ptr, c_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ag, stride_bn,
                  stride_bk, stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, BN: tl.constexpr, EVEN_K: tl.constexpr):
    """Exact slow path (fp8 MMA, A decoded from vals/meta) for C tile (pid_m, pid_n), [BLOCK_M, BN] at a time."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    for h in tl.static_range(BLOCK_N // BN):
        offs_n = pid_n * BLOCK_N + h * BN + tl.arange(0, BN)
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        _nan_tile(vals_ptr, meta_ptr, stride_am, stride_ag, offs_m, M, K // 4, b_ptr + offs_n[:, None] * stride_bn,
                  offs_n[:, None] < N, offs_k, K, stride_bk, 0, tl.cdiv(K, BLOCK_K), c_ptrs, c_ptrs, c_mask,
                  BLOCK_M, BN, BLOCK_K, 1, EVEN_K, 1)


@triton.jit(do_not_specialize=["M"])
def sparse_nan_fixup_kernel(
    vals_ptr, meta_ptr, b_ptr, c_ptr,
    flag_ptr,                      # int32 [tiles], set by sparse_gemm_expanded_kernel; reset to 0 here
    M, N, K,
    stride_am, stride_ag,
    stride_bn, stride_bk,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BN: tl.constexpr, EVEN_K: tl.constexpr,
):
    """One program per C tile of the expand GEMM: if the GEMM flagged it (NaN in its accumulator), recompute it
    by the exact slow path and clear the flag (flags are 0 between launches); otherwise exit."""
    tile = tl.program_id(0)
    if tl.load(flag_ptr + tile) != 0:
        num_pid_n = tl.cdiv(N, BLOCK_N)
        _nan_fix_tile(vals_ptr, meta_ptr, b_ptr, c_ptr, tile // num_pid_n, tile % num_pid_n, M, N, K, stride_am,
                      stride_ag, stride_bn, stride_bk, stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, BN, EVEN_K)
        tl.store(flag_ptr + tile, 0)
