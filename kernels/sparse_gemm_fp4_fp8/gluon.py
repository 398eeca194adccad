"""Gluon path of sparse_gemm_fp4_fp8 (``GluonConfig``): swap-AB fp8 wgmma with A decoded on the fly, sm_90 only.

At small M the GEMM streams b (N x K E4M3FN bytes) and the compressed A is small, so the kernel is built around
reading b at full bandwidth on every SM and spending as little as possible on A:

* swap-AB: wgmma computes the c^T tile [BLOCK_N, BLOCK_M] = b tile [BLOCK_N, 128] @ A tile^T. N sits on the wgmma
  M side (64 rows per warpgroup) and b, K-major as fp8 wgmma needs, is the shared-memory A operand as TMA lands
  it; M, padded to BLOCK_M (8..64), is the wgmma N width.
* the program's A bytes (vals and meta, [BLOCK_M, 32] per 128-K step, for its whole K slice; rows past M are
  zero-filled and decode to zeros) arrive by TMA first; b tiles follow through a STAGES-deep mbarrier ring.
* while b streams in, the slice's A is decoded into shared memory in the wgmma's 128-byte-swizzled layout (the
  wgmma B operand must be in shared memory), each group to the word of its four E4M3FN bytes (v0 at idx0 plus v1
  at idx1, a duplicate index holding the exact sum): by one load from a 4096-entry table (``decode_table``, index
  (meta & 15) << 8 | vals, built on the host from fp4ref.packing.decompress_2to4) when BLOCK_M >= 32, by integer
  arithmetic for smaller tiles. The K loop then only waits for b and issues wgmma.
* promotion that overlaps the tensor cores: each step's wgmma goes into a fresh accumulator (<= 128 products in
  the tensor core's limited-precision accumulator); after the NEXT step's wgmma is issued, ``warpgroup_mma_wait(1)``
  retires this one and its result is added into the fp32 accumulator (``hopper_fp8_wgmma_promote(128)``). The
  fresh accumulators alternate between two register sets (two steps per loop iteration), so a retired one is
  never copied while the other wgmma runs: such a copy makes ptxas serialize every wgmma of the kernel (advisory
  C7514), which the CPU build test checks.
* NaN policy (module docstring of the package): a dense MMA makes a NaN byte of b poison its whole column, read or
  not. A tile whose fp32 accumulator holds a NaN is recomputed, for this program's K range, on CUDA cores from the
  selected positions only (exact products, fp32 sums: within the same model), so a NaN reaches c iff the
  metadata selects it. No NaN in b: the check costs one reduction per tile.
* split-K (SPLIT_K slices): the fixed-order last-arrival reduction of kernels/_gluon.py (bitwise reproducible),
  or with CLUSTER the slices of a tile as one thread-block cluster, summed in the same order in the first CTA's
  shared memory (``cluster_sum``; the same bits without the workspace's global-memory round trips).

There is no CPU interpreter for Gluon: CPU tests build every config for sm_90 (kernels/_sm90.py), GPU tests run it.
"""
from __future__ import annotations

import numpy as np
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .._gluon import cluster_sum, in_cluster, k_slice, store_layout, store_or_reduce
from .decode import _e4m3_of_e2m1, _e4m3_of_e2m1_sum

__all__ = ["STEP_K", "decode_table", "gluon_constexprs", "shared_layouts", "sparse_swapab_kernel"]

STEP_K = 128  # K per step = the promotion interval: one fresh wgmma accumulator per step


def shared_layouts(cluster: int = 1):
    """The TMA destinations' layouts: b [BLOCK_N, 128] and decoded A [BLOCK_M, 128] E4M3FN tiles (128-byte
    swizzle, the wgmma operand layout), vals / meta [BLOCK_M, 32] bytes (no swizzle); ``in_cluster``'s forms in a
    kernel launched in clusters of ``cluster`` CTAs (``GluonConfig.cluster_size``)."""
    fp8 = in_cluster(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2), cluster)
    raw = in_cluster(gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2), cluster)
    return fp8, raw


def gluon_constexprs(config, K: int) -> dict:
    """``sparse_swapab_kernel``'s constexpr arguments for ``config`` at reduction length K, in parameter order."""
    per, splits = config.k_split(K)
    return dict(BLOCK_N=config.BLOCK_N, BLOCK_M=config.BLOCK_M, STAGES=config.STAGES, SPLIT_K=splits, K_PER=per,
                CLUSTER=config.cluster_size(K), num_warps=config.num_warps)


_TABLES: dict = {}


def decode_table(device: torch.device) -> torch.Tensor:
    """int32 [4096] on ``device``: entry (t << 8) | v for a vals byte v and a meta nibble t (meta bits 3:0; bits
    7:4 are never read) is the group's dense E4M3FN bytes, byte j = column 4g + j (little-endian), from
    fp4ref.packing.decompress_2to4 (exact: every value and duplicate-index sum is an E4M3FN value; zeros +0).
    Built once per device."""
    key = (device.type, device.index)
    table = _TABLES.get(key)
    if table is None:
        import ml_dtypes

        from fp4ref.packing import decompress_2to4

        idx = np.arange(4096)
        dense = decompress_2to4((idx & 255).astype(np.uint8)[:, None], (idx >> 8).astype(np.uint8)[:, None])
        codes = dense.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)  # [4096, 4], exact
        words = np.ascontiguousarray(codes).view("<i4").reshape(4096)  # little-endian: byte j at bits 8j
        table = _TABLES[key] = torch.from_numpy(words.copy()).to(device)
    return table


# ---------------------------------------------------------------------------------------------------------------
# Decode
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit
def _words_by_arithmetic(v, t):
    """The table's word (``decode_table``) for int32 vals bytes v and meta bytes t, by integer arithmetic (no
    fp16 -> e4m3 conversion: triton 3.6's packed one gave wrong bytes on the H200) with decode.py's helpers, which
    use only elementwise ops and so serve Gluon as they are. Zeros come out +0."""
    v = v.to(gl.uint32)
    t = t.to(gl.uint32)
    sh0 = (t & 3) << 3  # bit offset of idx0's byte
    sh1 = (t & 12) << 1
    c0 = v & 15
    c1 = v >> 4
    m0 = (c0 & 7) != 0  # -0 codes add nothing (the table's +0)
    m1 = (c1 & 7) != 0
    pair = (gl.where(m0, _e4m3_of_e2m1(c0), 0) << sh0) | (gl.where(m1, _e4m3_of_e2m1(c1), 0) << sh1)
    word = gl.where(sh0 == sh1, _e4m3_of_e2m1_sum(c0, c1) << sh0, pair)
    return word.to(gl.int32, bitcast=True)


@gluon.jit
def _decode_slice(v_smem, t_smem, a_smem, lut_ptr, nk, BLOCK_M: gl.constexpr, num_warps: gl.constexpr,
                  CLUSTER: gl.constexpr):
    """Decode the nk steps of A bytes in v_smem / t_smem [K_PER, BLOCK_M, 32] into a_smem [K_PER, BLOCK_M, 128]
    E4M3FN, stored in the wgmma's 128-byte-swizzled layout: by integer arithmetic for BLOCK_M <= 16 (a few
    groups per thread; no memory latency), else one load of the table word per group (``decode_table``; the
    first touch after an L2 flush costs one HBM round trip, then L1 hits)."""
    # a thread decodes 4 consecutive groups of a row: 4-byte shared loads, one 16-byte store of 16 E4M3FN bytes
    dec_layout: gl.constexpr = in_cluster(gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0]), CLUSTER)
    # the tile as int32 words [BLOCK_M, 32]: the 128-byte swizzle puts 16-byte chunk c of row r at c ^ (r % 8)
    words_smem: gl.constexpr = in_cluster(gl.SwizzledSharedLayout(4, 1, 8, [1, 0]), CLUSTER)
    for st in range(nk):
        v = v_smem.index(st).load(dec_layout).to(gl.uint8, bitcast=True).to(gl.int32)
        t = t_smem.index(st).load(dec_layout).to(gl.uint8, bitcast=True).to(gl.int32)
        if BLOCK_M <= 16:
            words = _words_by_arithmetic(v, t)
        else:
            words = gl.load(lut_ptr + (((t & 15) << 8) | v))  # L1-resident 16 KB table
        a_smem.index(st)._reinterpret(gl.int32, [BLOCK_M, 32], words_smem).store(words)
    fence_async_shared()  # the generic-proxy stores before the async-proxy (wgmma) reads
    gl.thread_barrier()  # every warp's part of every tile is stored


@gluon.jit
def _issue_b(b_desc, b_smem, bar, off_n, k):
    """TMA: b[off_n:+BLOCK_N, k:+128] into one ring slot."""
    mbarrier.expect(bar, b_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(b_desc, [off_n, k], bar, b_smem)


# ---------------------------------------------------------------------------------------------------------------
# NaN slow path
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit
def _selected_sum(b_ptr, stride_bn, vals_ptr, meta_ptr, stride_am, off_n, off_m, M, N, g0, g1,
                  BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, layout: gl.constexpr):
    """fp32 [BLOCK_N, BLOCK_M] c^T tile over groups g0 .. g1 - 1 on CUDA cores, reading only the positions the
    metadata selects: v0 * b[n, 4g + idx0] + v1 * b[n, 4g + idx1] (exact products, fp32 sums in group order), so
    a NaN of b reaches the tile iff it is selected."""
    rn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    rm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, layout))
    m_ok = rm < M
    n_ok = gl.expand_dims(rn < N, 1) & gl.expand_dims(m_ok, 0)
    b_rows = b_ptr + gl.expand_dims(rn.to(gl.int64) * stride_bn, 1)
    a_rows = rm.to(gl.int64) * stride_am
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout)
    for g in range(g0, g1):
        v = gl.load(vals_ptr + a_rows + g, mask=m_ok, other=0).to(gl.uint8, bitcast=True).to(gl.uint32)
        t = gl.load(meta_ptr + a_rows + g, mask=m_ok, other=0).to(gl.uint8, bitcast=True).to(gl.uint32)
        v0 = _e4m3_of_e2m1(v & 15).to(gl.uint8).to(gl.float8e4nv, bitcast=True).to(gl.float32)
        v1 = _e4m3_of_e2m1(v >> 4).to(gl.uint8).to(gl.float8e4nv, bitcast=True).to(gl.float32)
        k0 = gl.expand_dims(4 * g + (t & 3).to(gl.int32), 0)
        k1 = gl.expand_dims(4 * g + ((t >> 2) & 3).to(gl.int32), 0)
        b0 = gl.load(b_rows + k0, mask=n_ok, other=0.0).to(gl.float32)
        b1 = gl.load(b_rows + k1, mask=n_ok, other=0.0).to(gl.float32)
        acc = acc + gl.expand_dims(v0, 0) * b0
        acc = acc + gl.expand_dims(v1, 0) * b1
    return acc


@gluon.jit
def _step_mma(b_smem, a_smem, ready, i, into, STAGES: gl.constexpr):
    """Issue step i's wgmma (b tile of ring slot i % STAGES, decoded A of step i) into a fresh accumulator held in
    ``into``'s registers (use_acc=False: their value is not read)."""
    s = i % STAGES
    mbarrier.wait(ready.index(s), (i // STAGES) & 1)
    return warpgroup_mma(b_smem.index(s), a_smem.index(i).permute((1, 0)), into, use_acc=False, is_async=True)


@gluon.jit
def _refill(b_desc, b_smem, ready, off_n, ks0, i, nk, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """Step i - 1 retired: its ring slot takes step i + STAGES - 1 (two warpgroups: both retired it first)."""
    if num_warps > 4:
        gl.thread_barrier()
    j = i + STAGES - 1
    if j < nk:
        _issue_b(b_desc, b_smem.index(j % STAGES), ready.index(j % STAGES), off_n, (ks0 + j) * 128)


# ---------------------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit(do_not_specialize=["M"])  # one build for every M of a config
def sparse_swapab_kernel(
    # TMA descriptors: b [N, K] E4M3FN (block [BLOCK_N, 128]), vals and meta [M, K/4] bytes (block [BLOCK_M, 32])
    b_desc, v_desc, t_desc,
    # the same operands as pointers (NaN slow path), c [M, N] bf16, fp32 split-K workspace and per-tile arrival
    # counters (int32, zero between launches), the decode table (int32 [4096], ``decode_table``)
    b_ptr, vals_ptr, meta_ptr, c_ptr, ws_ptr, cnt_ptr, lut_ptr,
    # sizes and strides (elements): K steps of 128 in all
    M, N, k_steps, stride_bn, stride_am, stride_cm,
    BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, SPLIT_K: gl.constexpr,
    K_PER: gl.constexpr, CLUSTER: gl.constexpr, num_warps: gl.constexpr,
):
    BK: gl.constexpr = 128
    BG: gl.constexpr = 32  # groups per step
    pid_n = gl.program_id(0)  # with CLUSTER > 1 the ids number clusters: a cluster's CTAs are the K slices
    pid_k = k_slice(1, BLOCK_N, BLOCK_M, CLUSTER)
    pid_m = gl.program_id(2)  # M tiles (M > BLOCK_M): each re-reads b (mostly from L2)
    off_n = pid_n * BLOCK_N
    off_m = pid_m * BLOCK_M
    ks0 = pid_k * K_PER
    nk = gl.minimum(k_steps - ks0, K_PER)  # >= 1: the host launches no empty split

    # ---- shared memory: this slice's A bytes and decoded A, the b ring, barriers --------------------------------
    v_smem = gl.allocate_shared_memory(gl.int8, [K_PER, BLOCK_M, BG], v_desc.layout)
    t_smem = gl.allocate_shared_memory(gl.int8, [K_PER, BLOCK_M, BG], t_desc.layout)
    a_smem = gl.allocate_shared_memory(gl.float8e4nv, [K_PER, BLOCK_M, BK], b_desc.layout)
    b_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, BK], b_desc.layout)
    bar_layout: gl.constexpr = in_cluster(mbarrier.MBarrierLayout(), CLUSTER)
    a_bar = gl.allocate_shared_memory(gl.int64, [1, 1], bar_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    mbarrier.init(a_bar.index(0), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    fence_async_shared()
    # A's bytes for the whole slice first (small), then the b ring's first STAGES - 1 tiles
    # (K_PER boxes each: past the last step of a shorter last slice they fall beyond K and are zero-filled)
    mbarrier.expect(a_bar.index(0), 2 * K_PER * v_desc.block_type.nbytes)
    for st in gl.static_range(K_PER):
        tma.async_copy_global_to_shared(v_desc, [off_m, (ks0 + st) * BG], a_bar.index(0), v_smem.index(st))
        tma.async_copy_global_to_shared(t_desc, [off_m, (ks0 + st) * BG], a_bar.index(0), t_smem.index(st))
    for i in gl.static_range(STAGES - 1):
        if i < nk:
            _issue_b(b_desc, b_smem.index(i), ready.index(i), off_n, (ks0 + i) * BK)

    # ---- decode the slice's A while b streams in ------------------------------------------------------------
    mbarrier.wait(a_bar.index(0), 0)
    _decode_slice(v_smem, t_smem, a_smem, lut_ptr, nk, BLOCK_M, num_warps, CLUSTER)

    # ---- main loop: one fresh-accumulator wgmma per step, the previous step promoted while it runs -----------
    acc_layout: gl.constexpr = in_cluster(gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_M, 32]), CLUSTER)
    zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, acc_layout)
    acc = zero
    pa = _step_mma(b_smem, a_smem, ready, 0, zero, STAGES)  # step 0, peeled: from here on one group is in flight
    if STAGES - 1 < nk:  # the ring's last slot was never filled
        _issue_b(b_desc, b_smem.index(STAGES - 1), ready.index(STAGES - 1), off_n, (ks0 + STAGES - 1) * BK)
    # two steps per iteration, their fresh accumulators alternating between two register sets (pa carried, pb
    # local): a promoted accumulator is never copied while the other wgmma runs, which would make ptxas
    # serialize every wgmma (C7514)
    for i in range(1, nk - 1, 2):
        pb = _step_mma(b_smem, a_smem, ready, i, zero, STAGES)
        ra = warpgroup_mma_wait(num_outstanding=1, deps=(pa,))  # retire step i - 1, promote it into fp32
        acc = acc + ra
        _refill(b_desc, b_smem, ready, off_n, ks0, i, nk, STAGES, num_warps)
        pa = _step_mma(b_smem, a_smem, ready, i + 1, ra, STAGES)  # into step i - 1's registers
        acc = acc + warpgroup_mma_wait(num_outstanding=1, deps=(pb,))
        _refill(b_desc, b_smem, ready, off_n, ks0, i + 1, nk, STAGES, num_warps)
    if nk % 2 == 0:  # one step left over: nk - 1
        pb = _step_mma(b_smem, a_smem, ready, nk - 1, zero, STAGES)
        acc = acc + warpgroup_mma_wait(num_outstanding=1, deps=(pa,))
        acc = acc + warpgroup_mma_wait(num_outstanding=0, deps=(pb,))
    else:
        acc = acc + warpgroup_mma_wait(num_outstanding=0, deps=(pa,))
    mbarrier.invalidate(a_bar.index(0))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    # ---- NaN: recompute this program's share of a tile whose accumulator holds one ---------------------------
    st_layout: gl.constexpr = store_layout(BLOCK_N, BLOCK_M, num_warps, CLUSTER)
    has_nan = gl.max(gl.max((acc != acc).to(gl.int32), axis=1), axis=0)
    if has_nan != 0:
        acc = gl.convert_layout(_selected_sum(b_ptr, stride_bn, vals_ptr, meta_ptr, stride_am, off_n, off_m, M, N,
                                              ks0 * BG, (ks0 + nk) * BG, BLOCK_N, BLOCK_M, st_layout), acc_layout)
    if CLUSTER > 1:  # the slices' sum in rank order, in rank 0 (which alone stores)
        acc = cluster_sum(acc, CLUSTER, num_warps)
    store_or_reduce(gl.convert_layout(acc, st_layout), c_ptr, ws_ptr, cnt_ptr, M, N, stride_cm, off_n, off_m, off_m,
                    pid_m * gl.num_programs(0) + pid_n, pid_k, 1.0, BLOCK_N, BLOCK_M, SPLIT_K, False, num_warps,
                    CLUSTER)
