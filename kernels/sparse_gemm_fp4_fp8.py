"""2:4 structured-sparse E2M1 x E4M3FN GEMM (workload sparse_gemm_fp4_fp8_n2048_k2048, facts/seeds.md §1).

    c[m, n] = sum_g ( v0[m, g] * b[n, 4g + idx0[m, g]]  +  v1[m, g] * b[n, 4g + idx1[m, g]] )

Operands (design.md, "2:4 sparse A"), K = 4 * G:
    a_vals  int8 [M, G]  byte (read as unsigned): low nibble = E2M1 code of v0, high nibble = E2M1 code of v1
    a_meta  int8 [M, G]  byte (read as unsigned): bits 1:0 = idx0, bits 3:2 = idx1, bits 7:4 ignored
    b_fp8   torch.float8_e4m3fn [N, K]
    c       torch.bfloat16 [M, N]
Every byte pair is defined: idx0 == idx1 ADDS the two values, idx0 > idx1 is as good as idx0 < idx1.

Policies (each a tested choice):
- NaN: an E4M3FN NaN byte (0x7F / 0xFF) of b makes c[m, n] NaN iff the sum above READS it, i.e. it sits at a
  position 4g + idx0 or 4g + idx1 that row m's metadata selects (IEEE: NaN * 0 = NaN, so a selected NaN times a
  zero value still gives NaN). A NaN at a pruned position does not reach c. (A dense rebuild + matmul would
  propagate it through 0 * NaN; the formula does not read it.)
- Signed zero: a zero result may come out as +0 where the exact sum is -0 (tensor cores and fp32 adds give +0).
- Output: one RNE rounding from the fp32 accumulator to bf16 (no intermediate rounding).

How it works. Each program owns a [BLOCK_M, BLOCK_N] tile of c and a 1/SPLIT_K share of the K-tiles.
Per K-tile it loads the packed A bytes [BLOCK_M, BLOCK_K/4] once, decodes each (vals, meta) pair into the
four E4M3FN bytes of its group (exact: E2M1 values and the sums of two of them lie on 2^-1 Z with <= 4
significant bits, so they are E4M3FN values), expands them to the dense [BLOCK_M, BLOCK_K] tile and calls
tl.dot with the E4M3FN b tile:
- mma="fp8": fp8 wgmma (Hopper) into a fresh accumulator per K-tile, whose result is added into the fp32
  accumulator, i.e. the tensor core's ~14-bit accumulator is promoted every BLOCK_K <= 128 products;
- mma="fp16": both tiles converted (exactly) to fp16 and an fp16 MMA with fp32 accumulator;
- mma="fma": no tensor core (small M, GEMV-like): exact fp32 products summed with fp32 FMAs/adds.
NaN handling costs nothing on the fast path: a dense MMA turns any NaN of the b tile into NaN in its whole
column, so a program whose raw accumulator has a NaN (or, with NAN_CHECK_BYTES, whose b bytes have one)
recomputes its share with NaN bytes replaced by zero and counts, with a second MMA, the selected NaNs.
Split-K partial tiles (fp32) are reduced in ONE launch and deterministically: each program writes its
partial to a workspace and bumps a per-tile counter; the last one to arrive sums the SPLIT_K partials in
split order 0, 1, ..., rounds once to bf16, stores, and resets the counter.

Large M (SparseGemmConfig.kernel="expand"): the in-loop decode (~1000 instructions per K-tile) cannot overlap the
MMA, so two launches instead: sparse_expand_a_kernel decodes (vals, meta) with the same _a_words into a dense
E4M3FN A [M, K] in a cached per-stream workspace (reads 0.5 B, writes 1 B per element of A; each group's 4
bytes are one little-endian word, stored as an int32: no byte interleave), then
sparse_gemm_expanded_kernel, a persistent GEMM whose A and b tiles come through TMA into shared memory, runs
fp8 wgmma with the same per-K-tile promotion and one RNE rounding. A dense MMA would spread a NaN byte of b at a
pruned position through 0 * NaN, so a tile whose raw accumulator has a NaN is recomputed by the fused kernel's
exact slow path (_nan_tile, decoding from vals/meta): same NaN policy, same bounds; by default in a third launch
(sparse_nan_fixup_kernel) over the tiles the GEMM flagged.

Host: a launch plan per key (dtypes, shapes, strides, devices, pointer alignment, config) keeps the compiled
kernels after the first call, which validates; later calls launch them directly (see "Launch plans"); the expand
path's three launches go straight to Triton's C launcher with prebuilt arguments and TMA descriptors encoded once
(_ExpandBinding, kernels/_launch.py).

Numeric contract: see NUMERIC_CONTRACT (the fp4ref accumulation model that bounds every config here).
"""
from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl

from ._launch import hooks_installed, launch_compiled, raw_launcher, tensor_desc

# ----------------------------------------------------------------------------------------------------------
# Numeric contract (data; tests/test_kernel_sparse_gemm.py checks it through fp4ref.bounds)
# ----------------------------------------------------------------------------------------------------------
PROMOTION_INTERVAL = 128  # most K-elements the fp8 wgmma accumulator (~14 bits) holds before the fp32 add

NUMERIC_CONTRACT = {
    "inputs": "E2M1 (2:4 sparse, decoded exactly to E4M3FN) x E4M3FN",
    "output": "bfloat16",
    "products": "exact",  # E2M1 x E4M3FN has <= 6 significant bits
    # fp4ref.bounds model that bounds EVERY config in CONFIGS: fp8 wgmma whose accumulator is added into fp32
    # every <= 128 K-elements (Triton max_num_imprecise_acc=BLOCK_K); the K/BLOCK_K fp32 chunk sums (promotions
    # and the split-K partials, in any fixed order) are the gamma_{K/128}(2^-24) term of that model.
    "accumulation_model": f"hopper_fp8_wgmma_promote({PROMOTION_INTERVAL})",
    # configs with mma='fp16' or 'fma' meet a much tighter model: numeric_model(config, K)
    "split_k_reduction": "fp32_rn_fixed_order",  # partials summed in split order 0..SPLIT_K-1
    "output_rounding": "rne",  # fp32 -> bf16 once (GPU)
    "output_rounding_interpreter": "faithful",  # facts/triton.md: interpreted bf16 stores truncate
    "nan": "NaN iff a selected b position holds an E4M3FN NaN byte",
    "deterministic": True,  # bitwise, run to run (fixed reduction order, no float atomics)
}


MMA_KINDS = {"fp16": 0, "fp8": 1, "fma": 2}  # -> the kernel's MMA constexpr


@dataclasses.dataclass(frozen=True)
class SparseGemmConfig:
    """Tile shape and launch parameters of one sparse_gemm_fp4_fp8 launch."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    mma: str = "fp8"  # "fp8" (wgmma, block_m % 64 == 0), "fp16" (tensor core), "fma" (CUDA cores)
    # "fused": decode A inside the GEMM's K loop (one launch). "expand" (large M): a decode pre-pass writes the
    # dense E4M3FN A to a cached workspace, then a persistent TMA fp8 GEMM (mma "fp8", split_k 1 only)
    kernel: str = "fused"
    programs_per_sm: int = 1  # expand: persistent programs per SM
    # expand: the C tile as n_split column blocks of block_n / n_split, each its own wgmma chain and fp32
    # accumulator (the promotion's fresh accumulator is then [block_m, block_n / n_split]: fewer registers)
    n_split: int = 1
    # expand: where a tile whose accumulator holds a NaN is recomputed by the exact slow path: "inline" (in the
    # GEMM program; its registers then count for the whole kernel: 255 and spills at 128 x 128) or "launch" (the
    # GEMM flags the tile; a fix-up launch recomputes flagged tiles, ~2 us when none is flagged)
    nan_fixup: str = "launch"

    def __post_init__(self):
        if self.mma not in MMA_KINDS:
            raise ValueError(f"mma={self.mma!r}: expected one of {tuple(MMA_KINDS)}")
        if self.kernel not in ("fused", "expand"):
            raise ValueError(f"kernel={self.kernel!r}: expected 'fused' or 'expand'")
        if self.kernel == "expand" and (self.mma != "fp8" or self.split_k != 1):
            raise ValueError(f"kernel='expand' needs mma='fp8' and split_k=1, got mma={self.mma!r}, "
                             f"split_k={self.split_k}")
        if self.nan_fixup not in ("inline", "launch"):
            raise ValueError(f"nan_fixup={self.nan_fixup!r}: expected 'inline' or 'launch'")
        if self.n_split not in (1, 2) or (self.n_split == 2 and self.kernel != "expand"):
            raise ValueError(f"n_split={self.n_split}: expected 1, or 2 with kernel='expand'")


# Picked per M by the GPU sweep on the H200 (python -m fp4ref.kernels.bench sparse_gemm_fp4_fp8 --sweep --check,
# 2026-11-30, docs/benchmarks.md), then checked there against fp4ref with these exact configs. The sweep ranks by
# GPU-only time (CUDA graphs, host launch overhead excluded) and, at M <= 256, keeps the fused kernel unless the
# expand path's event time (host included) is also lower: with the direct launches it was at M = 100 and 256
# (16.5 / 17.2 us vs 19.5 / 23.8 us fused) but not at M = 64 (16.2 vs 15.7). M > 256: the expand path (decode
# pre-pass + persistent TMA fp8 GEMM); M = 1024: 19.9 us GPU, 4096: 51.0, 8192: 95.5.
# Each entry: (largest M it serves, config). fp8 wgmma needs block_m % 64 == 0 and num_warps % 4 == 0.
CONFIGS: tuple[tuple[int, SparseGemmConfig], ...] = (
    (1, SparseGemmConfig(1, 32, 128, split_k=8, num_warps=2, num_stages=3, mma="fma")),
    (16, SparseGemmConfig(16, 64, 128, split_k=8, num_warps=4, num_stages=3, mma="fp16")),
    (64, SparseGemmConfig(64, 64, 128, split_k=8, num_warps=4, num_stages=3)),
    (256, SparseGemmConfig(64, 64, 128, num_warps=4, num_stages=4, kernel="expand", nan_fixup="inline")),
    (1024, SparseGemmConfig(128, 128, 128, group_m=16, num_warps=8, num_stages=4, kernel="expand")),
    (1 << 62, SparseGemmConfig(128, 256, 128, group_m=16, num_warps=8, num_stages=3, kernel="expand", n_split=2)),
)

# Large M when b_fp8 cannot feed TMA descriptors (see tma_eligible): the fused kernel's large-M pick.
FALLBACK_CONFIG = SparseGemmConfig(64, 128, 128, split_k=1, num_warps=4, num_stages=4)

# Small tiles for the CPU interpreter (cost ~ programs x K-steps there). Not used on a GPU.
INTERPRETER_CONFIG = SparseGemmConfig(64, 64, 128, split_k=2, num_warps=4, num_stages=1)


def pick_config(m: int) -> SparseGemmConfig:
    """The CONFIGS entry for M rows (the first whose bound is >= m)."""
    for bound, cfg in CONFIGS:
        if m <= bound:
            return cfg
    raise AssertionError("unreachable: the last CONFIGS bound is unbounded")


def numeric_model(config: SparseGemmConfig, K: int) -> str:
    """The tightest fp4ref.bounds model name for one config at reduction length K (GPU).

    fp8 configs: ``hopper_fp8_wgmma_promote(BLOCK_K)``. fp16 configs: each K slice (the K-tiles one program
    owns, length <= ceil(K/BLOCK_K/SPLIT_K)*BLOCK_K) accumulates in fp32 on the tensor core (wgmma when
    block_m >= 64, otherwise mma.sync, bounded by the universal fp32 tensor-core model), then the SPLIT_K
    partials are summed in fp32: ``splitk(<model>, slice)``. Every one is within NUMERIC_CONTRACT's model.
    """
    if config.mma == "fp8":
        return f"hopper_fp8_wgmma_promote({config.block_k})"
    if config.mma == "fma":
        inner = "fp32_rn"  # exact products, fp32 RN sums in a fixed order
    else:
        inner = "hopper_fp16_wgmma" if config.block_m >= 64 else "tc_fp32_universal"
    k_tiles = -(-K // config.block_k)
    split = max(1, min(config.split_k, k_tiles))
    chunk = min(K, -(-k_tiles // split) * config.block_k)
    return f"splitk({inner}, {chunk})" if split > 1 else inner


# ----------------------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------------------
# Large M: decode pre-pass + persistent TMA fp8 GEMM (SparseGemmConfig.kernel == "expand")
# ----------------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["M"])
def sparse_expand_a_kernel(
    vals_ptr, meta_ptr,            # int8 [M, G]
    a8w_ptr,                       # int32 view of the dense E4M3FN A [M, 4G] (written): row stride stride_wm words
    M, G,
    stride_am, stride_ag, stride_wm,
    BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr,
):
    """Dense E4M3FN A from (vals, meta) by the fused kernel's own decode (_a_words), exact, duplicate indices add:
    each group's word holds its 4 bytes in column order (little-endian), so it is stored as one int32."""
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
                nan_rows = tl.maximum(nan_rows, tl.max(((b.to(tl.uint8, bitcast=True) & 0x7F) == 0x7F).to(tl.int32), axis=1))
            acc0 = _mma(a, b, acc0, BLOCK_K, 1)  # fp8 wgmma, promoted into fp32 every K-tile
            if N_SPLIT == 2:
                b1 = b_desc.load([pid_n * BLOCK_N + BN, kt * BLOCK_K])
                if NAN_CHECK_BYTES:
                    nan_rows = tl.maximum(nan_rows, tl.max(((b1.to(tl.uint8, bitcast=True) & 0x7F) == 0x7F).to(tl.int32), axis=1))
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


# ----------------------------------------------------------------------------------------------------------
# Host wrapper
# ----------------------------------------------------------------------------------------------------------
_WORKSPACES: dict = {}  # (device, stream) -> (fp32 split-K workspace, int32 counters); counters 0 between launches
_A8_WORKSPACES: dict = {}  # (device, stream) -> float8_e4m3fn buffer for the dense A of the "expand" path
_FLAGS: dict = {}  # (device, stream) -> int32 NaN-tile flags of the expand path; 0 between launches


def _workspace(device: torch.device, stream: int, ws_elems: int, n_counters: int):
    """Cached split-K workspace and zeroed arrival counters for (device, stream); grown, never shrunk.

    One per stream: launches on one stream run in order, so the counters are back at zero for the next launch.
    """
    key = (str(device), stream)
    entry = _WORKSPACES.get(key)
    ws, cnt = entry or (None, None)
    if ws is None or ws.numel() < ws_elems or cnt.numel() < n_counters:
        ws_n = max(ws_elems, ws.numel() if ws is not None else 0)
        cnt_n = max(n_counters, cnt.numel() if cnt is not None else 0, 1024)
        ws = torch.empty(ws_n, dtype=torch.float32, device=device)
        cnt = torch.zeros(cnt_n, dtype=torch.int32, device=device)
        entry = _WORKSPACES[key] = (ws, cnt)
    return entry  # the stored tuple itself: _FusedBinding checks it by identity


def _flags(device: torch.device, stream: int, n: int) -> torch.Tensor:
    """Cached zeroed int32 tile flags (>= n) for the expand path's NaN fix-up, per (device, stream); grown."""
    key = (str(device), stream)
    buf = _FLAGS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _FLAGS[key] = buf
    return buf


def _a8_workspace(device: torch.device, stream: int, elems: int) -> torch.Tensor:
    """Cached flat E4M3FN buffer (>= elems) for the dense A of the expand path, per (device, stream); grown."""
    key = (str(device), stream)
    buf = _A8_WORKSPACES.get(key)
    if buf is None or buf.numel() < elems:
        buf = torch.empty(-(-elems // 16) * 16, dtype=torch.float8_e4m3fn, device=device)  # int32-viewable
        _A8_WORKSPACES[key] = buf
    return buf


_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"  # triton reads it when the kernels are decorated


def _interpreting() -> bool:
    return _INTERPRET


_NUM_SMS: dict = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 2  # CPU interpreter: few persistent programs, so the persistent loop runs several tiles each
    n = _NUM_SMS.get(device.index)
    if n is None:
        n = _NUM_SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def _check(name: str, t, dtype: torch.dtype) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name}.dtype={t.dtype}: expected {dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name}.shape={tuple(t.shape)}: expected a 2-D tensor")


def tma_eligible(b_fp8: torch.Tensor) -> bool:
    """Whether b_fp8 [N, K] can feed the expand path's TMA descriptors: unit stride along K, 16-byte row stride
    and base, K % 16 == 0 (the dense-A workspace rows)."""
    n, k = b_fp8.shape
    return (k % 16 == 0 and b_fp8.stride(1) == 1 and (n == 1 or b_fp8.stride(0) % 16 == 0)
            and b_fp8.data_ptr() % 16 == 0)


# ----------------------------------------------------------------------------------------------------------
# Launch plans. The first call for a key (dtypes, shapes, strides, devices, 16-byte alignment of every pointer,
# out's strides, config, nan_check_bytes) validates everything, picks the config and the grid and goes through
# Triton's JIT (compiling if needed); it keeps the CompiledKernel the JIT returns. Later calls with the same key
# check only ``out`` and launch the kept kernels directly. Why: the JIT re-binds and re-specializes every argument
# on each call, ~20 us of Python on the H200 machine's CPU, which an L2-flushed CUDA-event timing of a ~8 us
# kernel measures as kernel time (the GPU idles waiting for the launch). The kept kernel is valid for the key:
# Triton specializes on integer arguments being 1 or multiples of 16 (N, K and the strides are in the key; M and
# num_programs are do_not_specialize) and on 16-byte pointer alignment (in the key; workspaces are torch
# allocations). Bounded: past _MAX_PLANS keys the cache starts over.
# ----------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Launch:
    kernel: object
    grid: tuple
    constexprs: dict  # in the kernel's parameter order (they follow its runtime parameters)
    num_warps: int
    num_stages: int
    ck: object = None  # CompiledKernel after the first launch (GPU only)


@dataclasses.dataclass
class _Plan:
    cfg: SparseGemmConfig
    main: _Launch
    prep: _Launch | None  # expand path: the decode pre-pass
    fix: _Launch | None  # expand path with nan_fixup="launch": the NaN fix-up
    ws_elems: int
    n_counters: int
    a8_elems: int
    # expand path on a GPU: stream -> _ExpandBinding (direct launches, see _bind_expand); False: not possible here
    bound: dict | bool = dataclasses.field(default_factory=dict)


_PLANS: dict = {}
_MAX_PLANS = 1024
PREP_BLOCK_M, PREP_BLOCK_G, PREP_WARPS = 32, 128, 4  # decode pre-pass tile, in groups (0.5 B read, 1 B written
# per element of A)


def _launch(launch: _Launch, stream, args: tuple, is_cuda: bool) -> None:
    """Launch through the JIT the first time (compiles, validates, keeps the CompiledKernel), directly after."""
    ck = launch.ck
    if ck is None:
        ck = launch.kernel[launch.grid](*args, **launch.constexprs, num_warps=launch.num_warps,
                                        num_stages=launch.num_stages)
        if is_cuda and ck is not None:
            launch.ck = ck
        return
    launch_compiled(ck, launch.grid, stream, (*args, *launch.constexprs.values()))


# Direct launches (GPU). The fused kernel: one C call with a prebuilt header and tail (_FusedBinding). The expand
# path: its three kernels have fixed arguments per (plan, stream) except the
# four operand pointers, so a binding prebuilds each launch's header and argument tail once and keeps the encoded
# TMA descriptors (dense-A workspace: once; b: per b pointer, a few entries); a call is then three calls of
# Triton's C launch function with integer pointers (kernels/_launch.py: no per-call descriptor encoding, dict,
# tuple of constexprs, data_ptr() or cuPointerGetAttribute per tensor). FAST_LAUNCH = False keeps Triton's
# launcher (which re-encodes both descriptors on every call; for comparisons; set before a plan's first call).
FAST_LAUNCH = True


class _ExpandBinding:
    __slots__ = ("skey", "a8", "flags", "flags_ptr", "prep_fn", "prep_head", "prep_tail", "main", "main_head",
                 "a8_desc", "main_tail", "fix_fn", "fix_head", "fix_tail", "b_pre", "b_desc_args")

    def b_prefix(self, b_fp8, pb: int) -> tuple:
        """The main launch's header + encoded descriptors (dense A, b at pointer pb): encoded once per pb."""
        pre = self.b_pre.get(pb)
        if pre is None:
            shape, strides, block = self.b_desc_args
            pre = (*self.main_head, *self.main.encode((self.a8_desc, tensor_desc(b_fp8, shape, strides, block, False))))
            if len(self.b_pre) >= 8:  # a few b operands per plan (weights); start over past that
                self.b_pre.clear()
            self.b_pre[pb] = pre
        return pre


class _FusedBinding:
    """The fused kernel's direct launch on one stream: header, split-K workspace (the (ws, counters) entry of
    _WORKSPACES, or None without split-K: out stands in) and its pointers, argument tail."""

    __slots__ = ("skey", "ws", "fn", "head", "ws_ptrs", "tail")


def _bind_fused(plan: _Plan, stream: int, skey: tuple, ws_cnt, tail: tuple) -> None:
    """Bind a fused plan whose kernel is compiled to ``stream`` (plan.bound[stream]); ``ws_cnt``: the split-K
    (workspace, counters) entry of _WORKSPACES or None; ``tail``: the runtime arguments after the six pointers.
    plan.bound becomes False where this Triton's launcher does not take direct launches."""
    raw = raw_launcher(plan.main.ck, 0)
    if not raw:
        plan.bound = False
        return
    bd = _FusedBinding()
    bd.skey, bd.ws, bd.fn, bd.head = skey, ws_cnt, raw.fn, raw.head(plan.main.grid, stream)
    bd.ws_ptrs = None if ws_cnt is None else (ws_cnt[0].data_ptr(), ws_cnt[1].data_ptr())
    bd.tail = (*tail, *plan.main.constexprs.values())
    plan.bound[stream] = bd


def _bind_expand(plan: _Plan, stream: int, skey: tuple, a8, flags, m: int, n: int, k: int, sa: tuple, sb: tuple,
                 sc: tuple):
    """An _ExpandBinding of a plan whose three kernels are compiled, on ``stream``; None when this Triton's
    launcher does not take direct launches (plan.bound becomes False: Triton's path from then on)."""
    cfg = plan.cfg
    prep = raw_launcher(plan.prep.ck, 0)
    main = raw_launcher(plan.main.ck, 2)
    fix = raw_launcher(plan.fix.ck, 0) if plan.fix is not None else None
    if not (prep and main and fix is not False):
        plan.bound = False
        return None
    sam, sag = sa
    sbn, sbk = sb
    bd = _ExpandBinding()
    bd.skey, bd.a8, bd.flags = skey, a8, flags
    bd.flags_ptr = flags.data_ptr() if flags is not None else None
    g = k // 4
    bd.prep_fn, bd.prep_head = prep.fn, prep.head(plan.prep.grid, stream)
    bd.prep_tail = (a8.data_ptr(), m, g, sam, sag, g, *plan.prep.constexprs.values())
    bd.main, bd.main_head = main, main.head(plan.main.grid, stream)
    bd.a8_desc = tensor_desc(a8, [m, k], [k, 1], [cfg.block_m, cfg.block_k], False)
    bd.main_tail = (m, n, k, plan.main.grid[0], sam, sag, sbn, sbk, *sc, *plan.main.constexprs.values())
    bd.b_desc_args = ([n, k], [sbn if n > 1 else k, 1], [cfg.block_n // cfg.n_split, cfg.block_k])
    bd.b_pre = {}
    if fix is not None:
        bd.fix_fn, bd.fix_head = fix.fn, fix.head(plan.fix.grid, stream)
        bd.fix_tail = (bd.flags_ptr, m, n, k, sam, sag, sbn, sbk, *sc, *plan.fix.constexprs.values())
    else:
        bd.fix_fn = None
    return bd


def _make_plan(a_vals, a_meta, b_fp8, config, nan_check_bytes) -> _Plan:
    """Validate a new key's operands and build its launch plan (raises as sparse_gemm_fp4_fp8 documents)."""
    _check("a_vals", a_vals, torch.int8)
    _check("a_meta", a_meta, torch.int8)
    _check("b_fp8", b_fp8, torch.float8_e4m3fn)
    n, k = b_fp8.shape
    m, g = a_vals.shape
    if k < 4 or k % 4 != 0:
        raise ValueError(f"b_fp8.shape={tuple(b_fp8.shape)}: K (dim 1) must be a positive multiple of 4, got K={k}")
    if n < 1:
        raise ValueError(f"b_fp8.shape={tuple(b_fp8.shape)}: N (dim 0) must be >= 1")
    if m < 1:
        raise ValueError(f"a_vals.shape={tuple(a_vals.shape)}: M (dim 0) must be >= 1")
    if g != k // 4:
        raise ValueError(f"a_vals.shape={tuple(a_vals.shape)}: expected [M, K/4] = [{m}, {k // 4}] for K={k} "
                         f"(b_fp8.shape={tuple(b_fp8.shape)})")
    if tuple(a_meta.shape) != tuple(a_vals.shape):
        raise ValueError(f"a_meta.shape={tuple(a_meta.shape)}: expected {tuple(a_vals.shape)} (as a_vals)")
    if not (a_vals.device == a_meta.device == b_fp8.device):
        raise ValueError(f"operands on different devices: a_vals {a_vals.device}, a_meta {a_meta.device}, "
                         f"b_fp8 {b_fp8.device}")
    if a_vals.stride() != a_meta.stride():
        raise ValueError(f"a_meta.stride()={a_meta.stride()}: expected a_vals' strides {a_vals.stride()} "
                         "(the kernels index both with one set)")
    interp = _interpreting()
    explicit = config is not None
    if config is None:
        config = INTERPRETER_CONFIG if interp else pick_config(m)
    if not isinstance(config, SparseGemmConfig):
        raise TypeError(f"config: expected a SparseGemmConfig, got {type(config).__name__}")
    if config.mma == "fp8" and config.block_k > PROMOTION_INTERVAL:
        raise ValueError(f"config.block_k={config.block_k}: fp8 MMA needs block_k <= {PROMOTION_INTERVAL} "
                         "(the promotion interval of the numeric contract)")
    if config.kernel == "expand" and not tma_eligible(b_fp8):
        if explicit:
            raise ValueError(f"config.kernel='expand' needs b_fp8 with unit stride along K, 16-byte row stride and "
                             f"base and K % 16 == 0; got shape {tuple(b_fp8.shape)}, strides {b_fp8.stride()}")
        config = FALLBACK_CONFIG
    ncb = bool(interp if nan_check_bytes is None else nan_check_bytes)
    even_k = k % config.block_k == 0
    tiles_m = triton.cdiv(m, config.block_m)
    tiles_n = triton.cdiv(n, config.block_n)
    if config.kernel == "expand":
        nprog = min(tiles_m * tiles_n, _num_sms(b_fp8.device) * config.programs_per_sm)
        main = _Launch(sparse_gemm_expanded_kernel, (nprog, 1, 1),
                       dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                            GROUP_M=config.group_m, N_SPLIT=config.n_split,
                            INLINE_FIXUP=config.nan_fixup == "inline", NAN_CHECK_BYTES=ncb, EVEN_K=even_k),
                       config.num_warps, config.num_stages)
        prep = _Launch(sparse_expand_a_kernel, (triton.cdiv(m, PREP_BLOCK_M), triton.cdiv(k // 4, PREP_BLOCK_G), 1),
                       dict(BLOCK_M=PREP_BLOCK_M, BLOCK_G=PREP_BLOCK_G), PREP_WARPS, 1)
        fix = None
        if config.nan_fixup == "launch":
            fix = _Launch(sparse_nan_fixup_kernel, (tiles_m * tiles_n, 1, 1),
                          dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                               BN=config.block_n // config.n_split, EVEN_K=even_k), config.num_warps, 2)
        return _Plan(config, main, prep, fix, 0, tiles_m * tiles_n, m * k)
    k_tiles = triton.cdiv(k, config.block_k)
    split_k = max(1, min(config.split_k, k_tiles))
    main = _Launch(sparse_gemm_fp4_fp8_kernel, (tiles_m * tiles_n, split_k, 1),
                   dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=split_k,
                        GROUP_M=config.group_m, MMA=MMA_KINDS[config.mma], NAN_CHECK_BYTES=ncb, EVEN_K=even_k),
                   config.num_warps, config.num_stages)
    ws_elems = tiles_m * tiles_n * split_k * config.block_m * config.block_n if split_k > 1 else 0
    return _Plan(config, main, None, None, ws_elems, tiles_m * tiles_n, 0)


def _expand_slow(plan: _Plan, stream, a_vals, a_meta, b_fp8, out, is_cuda: bool) -> None:
    """The expand path through Triton's launcher (first calls, the interpreter, launch hooks, FAST_LAUNCH off);
    on a GPU, once the three kernels are compiled, binds the plan to ``stream`` for direct launches."""
    cfg = plan.cfg
    device = b_fp8.device
    m, g = a_vals.shape
    n, k = b_fp8.shape
    sam, sag = sa = a_vals.stride()
    sbn, sbk = sb = b_fp8.stride()
    sc = out.stride()
    a8 = _a8_workspace(device, stream, plan.a8_elems)
    _launch(plan.prep, stream, (a_vals, a_meta, a8.view(torch.int32), m, g, sam, sag, g), is_cuda)
    flags = _flags(device, stream, plan.n_counters) if plan.fix is not None else None
    first = plan.main.ck is None
    args = (tensor_desc(a8, [m, k], [k, 1], [cfg.block_m, cfg.block_k], first),
            tensor_desc(b_fp8, [n, k], [sbn if n > 1 else k, 1], [cfg.block_n // cfg.n_split, cfg.block_k], first),
            a_vals, a_meta, b_fp8, out, out if flags is None else flags,  # flags unused with the inline fix-up
            m, n, k, plan.main.grid[0], sam, sag, sbn, sbk, *sc)
    _launch(plan.main, stream, args, is_cuda)
    if plan.fix is not None:
        _launch(plan.fix, stream, (a_vals, a_meta, b_fp8, out, flags, m, n, k, sam, sag, sbn, sbk, *sc), is_cuda)
    if (is_cuda and FAST_LAUNCH and plan.bound is not False and plan.main.ck is not None
            and plan.prep.ck is not None and (plan.fix is None or plan.fix.ck is not None)):
        bd = _bind_expand(plan, stream, (str(device), stream), a8, flags, m, n, k, sa, sb, sc)
        if bd is not None:
            plan.bound[stream] = bd


def plan_config(a_vals, a_meta, b_fp8, config=None, nan_check_bytes=None) -> SparseGemmConfig:
    """The config a call with these operands runs (pick_config(M), or FALLBACK_CONFIG where the expand path's TMA
    needs do not hold), validating the operands like sparse_gemm_fp4_fp8."""
    return _make_plan(a_vals, a_meta, b_fp8, config, nan_check_bytes).cfg


def sparse_gemm_fp4_fp8(a_vals: torch.Tensor, a_meta: torch.Tensor, b_fp8: torch.Tensor,
                        config: SparseGemmConfig | None = None, *, out: torch.Tensor | None = None,
                        nan_check_bytes: bool | None = None) -> torch.Tensor:
    """2:4 sparse E2M1 A times dense E4M3FN B^T -> bf16, c = A @ B.T (design.md "2:4 sparse A").

    Args:
        a_vals: int8 [M, K/4]; per group of 4 K-columns, E2M1 codes v0 (bits 3:0) and v1 (bits 7:4), bytes read
            as unsigned.
        a_meta: int8 [M, K/4], same strides as a_vals; idx0 = bits 1:0, idx1 = bits 3:2 (positions 0..3 in the
            group); bits 7:4 ignored. Any byte is accepted (non-canonical too: equal indices add, order is free).
        b_fp8: torch.float8_e4m3fn [N, K], any strides. M, N >= 1; K >= 4 and K % 4 == 0; no other alignment
            (the large-M "expand" configs also need unit stride along K, 16-byte rows and K % 16 == 0, and fall
            back to FALLBACK_CONFIG otherwise).
        config: a SparseGemmConfig overriding the CONFIGS entry picked by M (benchmarks, tests).
        out: optional bf16 [M, N] tensor to write (e.g. NaN-poisoned by a test); returned.
        nan_check_bytes: detect NaN bytes of b by their bits (True) or from the raw accumulator (False).
            Default: False on a GPU (free), True under the CPU interpreter, which decodes E4M3FN NaN bytes as
            +-480 (facts/triton.md).

    Returns:
        torch.bfloat16 [M, N]: one RNE rounding of the fp32 accumulator (NUMERIC_CONTRACT). A NaN byte of b at a
        position the metadata selects gives NaN; one at a pruned position does not (module docstring).

    Raises:
        TypeError: an operand is not a tensor of the dtype above; ``out`` is not a bf16 tensor.
        ValueError: not 2-D; M, N < 1; K < 4 or K % 4 != 0; a_vals / a_meta not [M, K/4] or of different
            strides; ``out`` not [M, N]; operands on different devices; an fp8 config with block_k > 128; an
            explicit expand config with a b_fp8 its TMA descriptors cannot read.

    Host cost: the first call per (shapes, strides, dtypes, devices, alignment, config) key validates and goes
    through Triton's JIT; later calls launch the kept kernels directly (see "Launch plans" in the source).
    Workspaces (split-K partials, the expand path's dense A) are cached per (device, stream): concurrent calls
    on one stream are ordered; on different streams they use different workspaces.

    Source: workload sparse_gemm_fp4_fp8_n2048_k2048 (FlashInfer-Bench; facts/seeds.md §1), layout and
    semantics fixed by design.md ("2:4 sparse A"); reference fp4ref.gemm.sparse_gemm_fp4_fp8.
    """
    if not isinstance(a_vals, torch.Tensor) or not isinstance(a_meta, torch.Tensor) or \
            not isinstance(b_fp8, torch.Tensor):
        for name, t in (("a_vals", a_vals), ("a_meta", a_meta), ("b_fp8", b_fp8)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if out is not None and (not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16):
        raise TypeError(f"out: expected a torch.bfloat16 tensor, got {getattr(out, 'dtype', type(out).__name__)}")
    if nan_check_bytes is not None and not isinstance(nan_check_bytes, bool):
        raise TypeError(f"nan_check_bytes: expected None or a bool, got {type(nan_check_bytes).__name__}")
    if config is not None and not isinstance(config, SparseGemmConfig):
        raise TypeError(f"config: expected a SparseGemmConfig or None, got {type(config).__name__}")
    pv, pm, pb = a_vals.data_ptr(), a_meta.data_ptr(), b_fp8.data_ptr()
    sa, sb = a_vals.stride(), b_fp8.stride()
    key = (a_vals.dtype, a_meta.dtype, b_fp8.dtype, a_vals.shape, a_meta.shape, b_fp8.shape,
           sa, a_meta.stride(), sb, a_vals.device, a_meta.device, b_fp8.device,
           pv % 16 == 0, pm % 16 == 0, pb % 16 == 0,
           None if out is None else (out.stride(), out.data_ptr() % 16 == 0), config, nan_check_bytes)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(a_vals, a_meta, b_fp8, config, nan_check_bytes)
        if len(_PLANS) >= _MAX_PLANS:  # many distinct keys: start over rather than grow without bound
            _PLANS.clear()
        new = True
    else:
        new = False
    m = a_vals.shape[0]
    n, k = b_fp8.shape
    device = b_fp8.device
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=device)
    elif tuple(out.shape) != (m, n) or out.device != device:
        raise ValueError(f"out.shape={tuple(out.shape)} on {out.device}: expected ({m}, {n}) on {device}")
    if new:
        _PLANS[key] = plan  # only once the whole call validated

    is_cuda = device.type == "cuda"
    stream = triton.runtime.driver.active.get_current_stream(device.index) if is_cuda else 0
    if plan.prep is not None:
        bound = plan.bound
        bd = bound.get(stream) if bound else None
        if (bd is not None and bd.a8 is _A8_WORKSPACES.get(bd.skey)
                and (bd.flags is None or bd.flags is _FLAGS.get(bd.skey)) and not hooks_installed()):
            # direct launches (_ExpandBinding); the workspaces are still this stream's (no other plan grew them)
            pc = out.data_ptr()
            try:
                bd.prep_fn(*bd.prep_head, pv, pm, *bd.prep_tail)
                bd.main.fn(*bd.b_prefix(b_fp8, pb), pv, pm, pb, pc, bd.flags_ptr or pc, *bd.main_tail)
                if bd.fix_fn is not None:
                    bd.fix_fn(*bd.fix_head, pv, pm, pb, pc, *bd.fix_tail)
                return out
            except (TypeError, ValueError, SystemError):  # argument packing rejected: Triton's path from now on
                plan.bound = False
        _expand_slow(plan, stream, a_vals, a_meta, b_fp8, out, is_cuda)
        return out
    bound = plan.bound
    bd = bound.get(stream) if bound else None
    if bd is not None and (bd.ws is None or bd.ws is _WORKSPACES.get(bd.skey)) and not hooks_installed():
        pc = out.data_ptr()  # direct launch (_FusedBinding); the split-K workspace is still this stream's
        try:
            bd.fn(*bd.head, pv, pm, pb, pc, *(bd.ws_ptrs or (pc, pc)), *bd.tail)
            return out
        except (TypeError, ValueError, SystemError):  # argument packing rejected: Triton's path from now on
            plan.bound = False
    sam, sag = sa
    sbn, sbk = sb
    scm, scn = out.stride()
    if plan.ws_elems:
        ws_cnt = _workspace(device, stream, plan.ws_elems, plan.n_counters)
        ws, locks = ws_cnt
    else:
        ws_cnt, (ws, locks) = None, (out, out)  # not read by the kernel
    tail = (m, n, k, sam, sag, sbn, sbk, scm, scn)
    _launch(plan.main, stream, (a_vals, a_meta, b_fp8, out, ws, locks, *tail), is_cuda)
    if is_cuda and FAST_LAUNCH and plan.bound is not False and plan.main.ck is not None:
        _bind_fused(plan, stream, (str(device), stream), ws_cnt, tail)
    return out
