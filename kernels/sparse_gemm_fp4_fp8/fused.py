"""The fused path: A decoded inside the GEMM's K loop, one launch (``FusedConfig``), and the exact NaN slow path.

    c[m, n] = sum_g ( v0[m, g] * b[n, 4g + idx0[m, g]]  +  v1[m, g] * b[n, 4g + idx1[m, g]] )

Each program owns a [BLOCK_M, BLOCK_N] tile of c and a 1/SPLIT_K share of the K-tiles. Per K-tile it loads the
packed A bytes [BLOCK_M, BLOCK_K/4] once, decodes them to the dense E4M3FN tile (decode.py) and calls tl.dot with
the E4M3FN b tile:
- MMA=1 ("fp8"): fp8 wgmma (Hopper) into a fresh accumulator per K-tile, whose result is added into the fp32
  accumulator, i.e. the tensor core's ~14-bit accumulator is promoted every BLOCK_K <= 128 products;
- MMA=0 ("fp16"): both tiles converted (exactly) to fp16 and an fp16 MMA with fp32 accumulator;
- MMA=2 ("fma"): no tensor core (small M, GEMV-like): exact fp32 products summed with fp32 FMAs/adds.
NaN handling costs nothing on the fast path: a dense MMA turns any NaN of the b tile into NaN in its whole
column, so a program whose raw accumulator has a NaN (or, with NAN_CHECK_BYTES, whose b bytes have one)
recomputes its share with NaN bytes replaced by zero and counts, with a second MMA, the selected NaNs
(``_nan_tile``, which the expand path uses too).
Split-K partial tiles (fp32) are reduced in ONE launch and deterministically: each program writes its partial to
a workspace and bumps a per-tile counter; the last one to arrive sums the SPLIT_K partials in split order
0, 1, ..., rounds once to bf16, stores, and resets the counter.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .decode import _a_tile

__all__ = ["sparse_gemm_fp4_fp8_kernel"]


@triton.jit
def _mma(a, b, acc, BLOCK_K: tl.constexpr, MMA: tl.constexpr):
    """acc += a @ b.T for E4M3FN tiles a [BM, BK], b [BN, BK]; fp32 accumulator."""
    if MMA == 1:
        # fp8 wgmma: the tile's BLOCK_K (<= 128) products go into a fresh tensor-core accumulator (~14 bits), whose
        # result is then added into the fp32 accumulator: promotion every BLOCK_K, written out in the source.
        # (Not tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K): when A comes from registers, triton 3.6 splits
        # that dot into K=32 pieces and drops the attribute, i.e. never promotes.)
        acc += tl.dot(a, tl.trans(b), max_num_imprecise_acc=BLOCK_K)
    elif MMA == 0:
        # E2M1 and E4M3FN values are exact in fp16; fp16 MMA, fp32 accumulator
        acc = tl.dot(a.to(tl.float16), tl.trans(b.to(tl.float16)), acc)
    else:
        # CUDA cores: acc is [BM, BN, BK]; exact fp32 products (<= 6 significant bits) accumulated per K column
        # with fp32 FMAs (no cross-thread work in the loop); _acc_final sums the columns once
        acc += a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def _acc_init(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MMA: tl.constexpr):
    if MMA == 2:
        return tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        return tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@triton.jit
def _acc_final(acc, MMA: tl.constexpr):
    if MMA == 2:
        return tl.sum(acc, axis=2)  # fixed reduction tree: deterministic
    else:
        return acc


@triton.jit(do_not_specialize=["M"])
def sparse_gemm_fp4_fp8_kernel(
    # pointers
    vals_ptr, meta_ptr,            # int8 [M, G]
    b_ptr,                         # float8_e4m3fn [N, K]
    c_ptr,                         # bfloat16 [M, N]
    ws_ptr,                        # fp32 split-K workspace [tiles, SPLIT_K, BLOCK_M, BLOCK_N] (unused if SPLIT_K=1)
    lock_ptr,                      # int32 [tiles] arrival counters, zero between launches
    # sizes
    M, N, K,
    # strides (elements)
    stride_am, stride_ag,
    stride_bn, stride_bk,
    stride_cm, stride_cn,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr,
    MMA: tl.constexpr,              # 1: fp8 wgmma, promoted every BLOCK_K; 0: fp16 MMA; 2: fp32 FMA
    NAN_CHECK_BYTES: tl.constexpr,  # True: detect NaN bytes of b directly; False: from the raw accumulator
    EVEN_K: tl.constexpr,           # K % BLOCK_K == 0: no K masks
):
    # ---- tile and split of this program (grouped order: GROUP_M row tiles share b tiles in L2) ----
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_in_group = GROUP_M * num_pid_n
    first_m = (pid // num_in_group) * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % num_in_group) % group_size
    pid_n = (pid % num_in_group) // group_size

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    G = K // 4
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    kt_begin = pid_k * per_split
    kt_end = tl.minimum(kt_begin + per_split, k_tiles)

    b_rows = b_ptr + offs_n[:, None] * stride_bn
    n_ok = offs_n[:, None] < N

    # ---- fast path: raw b tiles ----
    acc = _acc_init(BLOCK_M, BLOCK_N, BLOCK_K, MMA)
    nan_rows = tl.zeros((BLOCK_N,), dtype=tl.int32)
    for kt in range(kt_begin, kt_end):
        k0 = kt * BLOCK_K
        a = _a_tile(vals_ptr, meta_ptr, stride_am, stride_ag, offs_m, M, G, k0 // 4,
                    BLOCK_M, BLOCK_K, False)
        if EVEN_K:
            b_mask = n_ok
        else:
            b_mask = n_ok & ((k0 + offs_k)[None, :] < K)
        b = tl.load(b_rows + (k0 + offs_k)[None, :] * stride_bk, mask=b_mask, other=0.0)  # E4M3FN
        if NAN_CHECK_BYTES:
            b_bits = b.to(tl.uint8, bitcast=True)
            nan_rows = tl.maximum(nan_rows, tl.max(((b_bits & 0x7F) == 0x7F).to(tl.int32), axis=1))
        acc = _mma(a, b, acc, BLOCK_K, MMA)
    acc = _acc_final(acc, MMA)

    if NAN_CHECK_BYTES:
        has_nan = tl.max(nan_rows, axis=0) > 0
    else:
        has_nan = tl.max(tl.where(acc != acc, 1, 0)) > 0

    # ---- where this program's fp32 result goes: its split-K workspace slot, or c directly ----
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tile = pid_m * num_pid_n + pid_n
    local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    ws_tile = ws_ptr + tile * (SPLIT_K * BLOCK_M * BLOCK_N) + local

    if has_nan:
        # ---- slow path (b had a NaN byte in this program's range): exact recompute, selected NaNs only ----
        _nan_tile(vals_ptr, meta_ptr, stride_am, stride_ag, offs_m, M, G, b_rows, n_ok, offs_k, K, stride_bk,
                  kt_begin, kt_end, ws_tile + pid_k * (BLOCK_M * BLOCK_N), c_ptrs, c_mask,
                  BLOCK_M, BLOCK_N, BLOCK_K, MMA, EVEN_K, SPLIT_K)
    else:
        _store_result(acc, ws_tile + pid_k * (BLOCK_M * BLOCK_N), c_ptrs, c_mask, SPLIT_K)

    # ---- split-K: the last program to arrive at this tile reduces the partials in split order ----
    if SPLIT_K > 1:
        tl.debug_barrier()  # every thread's partial is written before the release below
        arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            # sum in split order 0, 1, ... (deterministic), reading through L2 (.cg), one RNE to bf16
            total = tl.load(ws_tile, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT_K):
                total += tl.load(ws_tile + s * (BLOCK_M * BLOCK_N), cache_modifier=".cg")
            tl.store(c_ptrs, total.to(tl.bfloat16), mask=c_mask)
            tl.atomic_xchg(lock_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next launch


@triton.jit
def _store_result(acc, ws_ptrs, c_ptrs, c_mask, SPLIT_K: tl.constexpr):
    """fp32 tile -> split-K workspace slot (full tile, no mask), or -> c with one RNE rounding to bf16."""
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(tl.bfloat16), mask=c_mask)
    else:
        tl.store(ws_ptrs, acc)


@triton.jit
def _store_nan(where_nan, ws_ptrs, c_ptrs, c_mask, SPLIT_K: tl.constexpr):
    """Overwrite the elements flagged in where_nan (a [BLOCK_M, BLOCK_N] bool tile) with NaN."""
    if SPLIT_K == 1:
        tl.store(c_ptrs, tl.full(where_nan.shape, float("nan"), tl.float32).to(tl.bfloat16), mask=c_mask & where_nan)
    else:
        tl.store(ws_ptrs, tl.full(where_nan.shape, float("nan"), tl.float32), mask=where_nan)


@triton.jit
def _nan_pass(vals_ptr, meta_ptr, stride_am, stride_ag, offs_m, M, G, b_rows, n_ok, offs_k, K, stride_bk,
              kt_begin, kt_end, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              MMA: tl.constexpr, EVEN_K: tl.constexpr, SELECTOR: tl.constexpr):
    """One K-loop of the NaN slow path over K-tiles [kt_begin, kt_end), b read through pointers (b_rows).

    SELECTOR=False: the values times b with its NaN bytes replaced by 0 (the sum without the NaN terms).
    SELECTOR=True: the selector (1.0 at each selected position) times 1.0 where b is NaN, 0 elsewhere: a count of
    non-negative terms, > 0 (under any rounding) iff a selected position holds a NaN.
    """
    acc = _acc_init(BLOCK_M, BLOCK_N, BLOCK_K, MMA)
    for kt in range(kt_begin, kt_end):
        k0 = kt * BLOCK_K
        a = _a_tile(vals_ptr, meta_ptr, stride_am, stride_ag, offs_m, M, G, k0 // 4,
                    BLOCK_M, BLOCK_K, SELECTOR)
        if EVEN_K:
            b_mask = n_ok
        else:
            b_mask = n_ok & ((k0 + offs_k)[None, :] < K)
        b = tl.load(b_rows + (k0 + offs_k)[None, :] * stride_bk, mask=b_mask, other=0.0).to(tl.uint8, bitcast=True)
        if SELECTOR:
            b_use = tl.where((b & 0x7F) == 0x7F, 0x38, 0).to(tl.uint8)  # E4M3FN 1.0 where b is NaN
        else:
            b_use = tl.where((b & 0x7F) == 0x7F, 0, b).to(tl.uint8)
        acc = _mma(a, b_use.to(tl.float8e4nv, bitcast=True), acc, BLOCK_K, MMA)
    return _acc_final(acc, MMA)


@triton.jit
def _nan_tile(vals_ptr, meta_ptr, stride_am, stride_ag, offs_m, M, G, b_rows, n_ok, offs_k, K, stride_bk,
              kt_begin, kt_end, ws_ptrs, c_ptrs, c_mask, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, MMA: tl.constexpr, EVEN_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """The NaN slow path of one [BLOCK_M, BLOCK_N] tile: recompute with NaN bytes of b -> 0 and store, then count
    with a second pass the selected NaNs and overwrite those elements with NaN. Two passes of one loop
    (_nan_pass), one accumulator live at a time (registers)."""
    acc = _nan_pass(vals_ptr, meta_ptr, stride_am, stride_ag, offs_m, M, G, b_rows, n_ok, offs_k, K, stride_bk,
                    kt_begin, kt_end, BLOCK_M, BLOCK_N, BLOCK_K, MMA, EVEN_K, False)
    _store_result(acc, ws_ptrs, c_ptrs, c_mask, SPLIT_K)
    hits = _nan_pass(vals_ptr, meta_ptr, stride_am, stride_ag, offs_m, M, G, b_rows, n_ok, offs_k, K, stride_bk,
                     kt_begin, kt_end, BLOCK_M, BLOCK_N, BLOCK_K, MMA, EVEN_K, True)
    tl.debug_barrier()  # the store above may map elements to other threads: order it before the overwrite
    _store_nan(hits > 0, ws_ptrs, c_ptrs, c_mask, SPLIT_K)
