"""Gluon path of gemm_fp16 for small M (``GluonConfig``): swap-AB wgmma with a TMA / mbarrier ring, on sm_90.

At M <= 256 the GEMM streams B (N x K x 2 bytes) through the tensor cores, so the kernel is built around reading
B at full HBM bandwidth on every SM:

* swap-AB: wgmma computes the C^T tile = B tile @ A tile^T. N sits on the wgmma M side (64 rows per warpgroup);
  M, padded to BLOCK_M, is the wgmma N width, so a tiny M is not padded to 64 rows. BLOCK_M is a power of two
  (8..256) or the sum of two (``m_parts``: 48, 80, 96, ...; Triton's tensors and TMA blocks are powers of two):
  then each stage loads two A boxes, the high part's rows and the low part's after them, into two rings, and
  issues two wgmmas with an accumulator each, so a tile fits M more closely than the next power of two would (at
  mid M each CTA reads less of A).
* TMA loads of B [BLOCK_N, BLOCK_K] and A [BLOCK_M, BLOCK_K] tiles through a STAGES-deep mbarrier ring; rows of A
  beyond M are zero-filled by TMA (they add exact zeros to columns that are never stored). When M > BLOCK_M the
  last M tile's A box is shifted back to end at row M (it recomputes rows of the tile before and stores only its
  own): a box partly past A's last row streams slower (docs/benchmarks.md).
* async ``warpgroup_mma`` with ``warpgroup_mma_wait(1)``: one wgmma group stays in flight while the next tile
  lands; the slot the retired group read is refilled at once.
* optional split-K (SPLIT_K slices): the fixed-order last-arrival reduction of kernels/_gluon.py (the LAST slice
  to arrive sums the fp32 partials in the order s = 0, 1, ..., SPLIT_K-1 and rounds once to fp16), or with CLUSTER
  the same sum by the first CTA of the thread-block cluster the slices run in, in its shared memory
  (``cluster_sum``). Bitwise reproducible.
* optional warp specialization (WARP_SPEC): a 1-warp TMA producer partition.
* FLOOR (the floor benchmark's runs, kernels/bench_floor.py ``--tiles``): the same pipeline without its wgmmas
  (1) or without its refills (2); 0, the GEMM, is every other caller's.

Numerics: exact fp16 products, fp32 accumulation on wgmma (``hopper_fp16_wgmma``), one RNE rounding to fp16
(``configs.accumulation_model``). There is no CPU interpreter for Gluon: the CPU tests build every config for
sm_90 (kernels/_sm90.py) and the GPU tests run it.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .._gluon import cluster_sum, in_cluster, k_slice, m_parts, part_layouts, store_layout, store_or_reduce

__all__ = ["gemm_swapab_kernel", "gluon_constexprs", "m_parts", "operand_layouts"]


def operand_layouts(config):
    """The NVMMA shared-memory layouts of the B tile and of the two A parts' tiles (``m_parts``; a one-part
    config's second is its first) (the TMA destinations and wgmma operands; the same in a cluster: the kernel
    only hands them to TMA and wgmma)."""
    return (gl.NVMMASharedLayout.get_default_for([config.BLOCK_N, config.BLOCK_K], gl.float16),
            *part_layouts([config.BLOCK_M, config.BLOCK_K], 0))


def gluon_constexprs(config, K: int) -> dict:
    """``gemm_swapab_kernel``'s constexpr arguments for ``config`` at reduction length K, in parameter order."""
    per, splits = config.k_split(K)
    return dict(BLOCK_N=config.BLOCK_N, BLOCK_M=config.BLOCK_M, BLOCK_M_LO=m_parts(config.BLOCK_M)[1],
                BLOCK_K=config.BLOCK_K, STAGES=config.STAGES,
                SPLIT_K=splits, K_PER=per, WARP_SPEC=config.WARP_SPEC, CLUSTER=config.cluster_size(K),
                num_warps=config.num_warps, FLOOR=0)


@gluon.jit
def _issue_loads(b_desc, a_desc, b_bufs, a_bufs, bars, slot, off_n, off_m, k, a2_desc=None, a2_bufs=None):
    """TMA: B[off_n:+BLOCK_N, k:+BLOCK_K] and A[off_m:+BLOCK_M, k:+BLOCK_K] into ring slot ``slot`` (with
    ``a2_desc``, A's rows in two parts: a_desc's block rows from off_m, then a2_desc's)."""
    bar = bars.index(slot)
    # the stage's bytes: B's box, A's high part and, when there is one, its low part
    NBYTES: gl.constexpr = b_desc.block_type.nbytes + a_desc.block_type.nbytes + (
        0 if a2_desc is None else a2_desc.block_type.nbytes)
    mbarrier.expect(bar, NBYTES)
    tma.async_copy_global_to_shared(b_desc, [off_n, k], bar, b_bufs.index(slot))
    tma.async_copy_global_to_shared(a_desc, [off_m, k], bar, a_bufs.index(slot))
    if a2_desc is not None:
        tma.async_copy_global_to_shared(a2_desc, [off_m + a_desc.block_type.shape[0], k], bar, a2_bufs.index(slot))


@gluon.jit
def _ws_loader(b_desc, a_desc, b_bufs, a_bufs, ready, empty, off_n, off_m, kt0, nk,
               BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    """Producer partition (1 warp): for each K tile, wait until its slot is empty, then TMA it in. The first pass
    over the ring waits on parity 1 of fresh barriers, which counts as complete."""
    for j in range(nk):
        slot = j % STAGES
        mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)
        _issue_loads(b_desc, a_desc, b_bufs, a_bufs, ready, slot, off_n, off_m, (kt0 + j) * BLOCK_K)


@gluon.jit
def _ws_mma(b_bufs, a_bufs, ready, empty, nk, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
            STAGES: gl.constexpr, num_warps: gl.constexpr):
    """Consumer partition (num_warps warps): wgmma each landed tile; free a slot once the wgmma reading it retired."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_M, 16])
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=acc_layout)
    for i in range(nk):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        acc = warpgroup_mma(b_bufs.index(slot), a_bufs.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        if i > 0:
            mbarrier.arrive(empty.index((i - 1) % STAGES), count=1)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    return (acc, )  # warp_specialize flattens the default partition's results: a tuple


@gluon.jit(do_not_specialize=["M"])  # one build for every M of a config
def gemm_swapab_kernel(
    # operands: TMA descriptors of B [N, K] (block [BLOCK_N, BLOCK_K]) and A [M, K] (block [BLOCK_M - BLOCK_M_LO,
    # BLOCK_K]), and A again with block [BLOCK_M_LO, BLOCK_K] (its rows after the first block's; unused when
    # BLOCK_M_LO is 0)
    b_desc, a_desc, a2_desc,
    # output C [M, N] fp16 (row stride stride_cm), fp32 split-K workspace and per-N-tile arrival counters (int32,
    # zero between launches)
    c_ptr, ws_ptr, cnt_ptr,
    # sizes: M rows of A/C, N rows of B, K tiles in all, C's row stride (elements)
    M, N, k_tiles, stride_cm,
    # tiling (see GluonConfig); BLOCK_M_LO: the low part of a two-part BLOCK_M (0: one part, ``m_parts``); K_PER:
    # K tiles per split (the last split takes the rest)
    BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_M_LO: gl.constexpr, BLOCK_K: gl.constexpr,
    STAGES: gl.constexpr, SPLIT_K: gl.constexpr, K_PER: gl.constexpr, WARP_SPEC: gl.constexpr,
    CLUSTER: gl.constexpr, num_warps: gl.constexpr,
    # the floor benchmark's parts of the pipeline (kernels/bench_floor.py): 0 the GEMM; 1 the loads without the
    # wgmmas (zeros stored); 2 the wgmmas over the ring's first fill, without refills
    FLOOR: gl.constexpr = 0,
):
    BM_HI: gl.constexpr = BLOCK_M - BLOCK_M_LO  # the first (power-of-two) part's wgmma N width
    pid_n = gl.program_id(0)  # with CLUSTER > 1 the ids number clusters: a cluster's CTAs are the K slices
    gl.static_assert(CLUSTER == 1 or BLOCK_M_LO == 0, "a cluster sums one accumulator: a one-part BLOCK_M")
    gl.static_assert(FLOOR == 0 or (SPLIT_K == 1 and not WARP_SPEC and CLUSTER == 1),
                     "FLOOR: one slice, no WS / CLUSTER")
    READ: gl.constexpr = FLOOR != 2  # every K tile through the ring
    MMA: gl.constexpr = FLOOR != 1
    pid_k = k_slice(1, BLOCK_N, BM_HI, CLUSTER)  # (the tile cluster_sum sends)
    pid_m = gl.program_id(2)  # M tiles (M > BLOCK_M): each re-reads B (mostly from L2)
    tile = pid_m * gl.num_programs(0) + pid_n  # output tile: workspace slot and arrival counter
    off_n = pid_n * BLOCK_N
    m_own = pid_m * BLOCK_M  # the first row of C this program stores
    # the last M tile's A box ends at row M (when M > BLOCK_M it overlaps the tile before, whose rows it computes
    # again and does not store): a box partly past A's last row streams slower (docs/benchmarks.md)
    off_m = gl.minimum(m_own, gl.maximum(M - BLOCK_M, 0))
    kt0 = pid_k * K_PER
    nk = gl.minimum(k_tiles - kt0, K_PER)  # >= 1: the host launches no empty split
    gl.assume(nk >= 1)  # no zero-trip path around the wgmma loop (ptxas would serialize a two-part tile's wgmmas)

    # ---- shared memory: the TMA ring and its "full" barriers ------------------------------------------------
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM_HI, BLOCK_K], a_desc.layout)
    if BLOCK_M_LO > 0:
        a2_bufs = gl.allocate_shared_memory(a2_desc.dtype, [STAGES, BLOCK_M_LO, BLOCK_K], a2_desc.layout)
    else:
        a2_desc = None
        a2_bufs = None
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], in_cluster(mbarrier.MBarrierLayout(), CLUSTER))
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()

    if WARP_SPEC:
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(empty.index(i), count=1)
        fence_async_shared()
        acc = gl.warp_specialize(
            [(_ws_mma, (b_bufs, a_bufs, bars, empty, nk, BLOCK_N, BM_HI, STAGES, num_warps)),
             (_ws_loader, (b_desc, a_desc, b_bufs, a_bufs, bars, empty, off_n, off_m, kt0, nk, BLOCK_K, STAGES))],
            [1], [40])[0]
    else:
        # ---- prologue: fill STAGES - 1 slots (FLOOR 2: every slot, landed before the loop) ----------------------
        for i in gl.static_range(STAGES - 1 if READ else STAGES):
            if i < nk:
                _issue_loads(b_desc, a_desc, b_bufs, a_bufs, bars, i, off_n, off_m, (kt0 + i) * BLOCK_K, a2_desc,
                             a2_bufs)
        if not READ:
            for i in gl.static_range(STAGES):
                if i < nk:
                    mbarrier.wait(bars.index(i), 0)

        # ---- main loop: C^T tile [BLOCK_N, BLOCK_M] += B tile @ A tile^T on wgmma -----------------------------
        acc_layout: gl.constexpr = in_cluster(gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM_HI, 16]), CLUSTER)
        acc = gl.zeros([BLOCK_N, BM_HI], gl.float32, layout=acc_layout)
        if BLOCK_M_LO > 0:
            lo_layout: gl.constexpr = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_M_LO, 16])
            acc_lo = gl.zeros([BLOCK_N, BLOCK_M_LO], gl.float32, layout=lo_layout)
        for i in range(nk):
            slot = i % STAGES
            if READ:
                mbarrier.wait(bars.index(slot), (i // STAGES) & 1)
            if MMA:
                acc = warpgroup_mma(b_bufs.index(slot), a_bufs.index(slot).permute((1, 0)), acc, is_async=True)
                if BLOCK_M_LO > 0:
                    acc_lo = warpgroup_mma(b_bufs.index(slot), a2_bufs.index(slot).permute((1, 0)), acc_lo,
                                           is_async=True)
                    # retire step i - 1's two groups: its slot ((i - 1) % STAGES) is free for step i + STAGES - 1
                    acc, acc_lo = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_lo))
                else:
                    # retire the group of step i - 1: its slot ((i - 1) % STAGES) is free for step i + STAGES - 1
                    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
                if num_warps > 4:
                    gl.thread_barrier()  # both warpgroups retired step i - 1 before its slot is refilled
            if READ:
                j = i + STAGES - 1
                if j < nk:
                    _issue_loads(b_desc, a_desc, b_bufs, a_bufs, bars, j % STAGES, off_n, off_m,
                                 (kt0 + j) * BLOCK_K, a2_desc, a2_bufs)
        if MMA:
            if BLOCK_M_LO > 0:
                acc, acc_lo = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_lo))
            else:
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    # ---- epilogue: a plain store, or the fixed-order split-K reduction (kernels/_gluon.py) ---------------------
    # (a two-part tile has SPLIT_K 1: GluonConfig)
    if CLUSTER > 1:  # the slices' sum in rank order, in rank 0 (which alone stores)
        acc = cluster_sum(acc, CLUSTER, num_warps)
    part = gl.convert_layout(acc, store_layout(BLOCK_N, BM_HI, num_warps, CLUSTER))
    store_or_reduce(part, c_ptr, ws_ptr, cnt_ptr, M, N, stride_cm, off_n, off_m, m_own, tile, pid_k, 1.0,
                    BLOCK_N, BM_HI, SPLIT_K, False, num_warps, CLUSTER)
    if BLOCK_M_LO > 0:
        part = gl.convert_layout(acc_lo, store_layout(BLOCK_N, BLOCK_M_LO, num_warps))
        store_or_reduce(part, c_ptr, ws_ptr, cnt_ptr, M, N, stride_cm, off_n, off_m + BM_HI, m_own, tile, pid_k,
                        1.0, BLOCK_N, BLOCK_M_LO, 1, False, num_warps)
