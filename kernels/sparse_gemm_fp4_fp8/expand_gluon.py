"""The expand path's Gluon GEMM (``ExpandConfig(gemm="gluon")``, sm_90): persistent, warp-specialized fp8 wgmma
over the dense E4M3FN A that expand.py's pre-pass writes.

    c[M, N] (bf16) = A8[M, K] @ b[N, K]^T, promoted into fp32 every 128 K-elements, one RNE rounding

* persistent: ``num_programs`` CTAs walk the c tiles [BLOCK_M, BLOCK_N] in grouped order (GROUP_M row tiles
  share b tiles in L2), every CTA the same walk from its own start.
* warp specialization: a 1-warp producer partition TMA-loads the A and b tiles of each 128-K step into a
  STAGES-deep ring ("ready" barriers carry the bytes; "empty" barriers hand a slot back); the default partition
  (one or two warpgroups stacked along BLOCK_M) only waits, issues wgmma and promotes. The producer runs ahead
  across tile boundaries, so the next tile's loads overlap this tile's epilogue.
* promotion that overlaps the tensor cores (as gluon.py): each step's wgmma goes into a fresh accumulator; after
  the NEXT step's wgmma is issued, ``warpgroup_mma_wait(1)`` retires this one, its result is added into the fp32
  accumulator and its slot is handed back. The fresh accumulators alternate between two register sets, so a
  retired one is never copied while the other wgmma runs (ptxas would serialize every wgmma: advisory C7514).
* programmatic dependent launch (PDL): the pre-pass triggers its dependents as it starts and this kernel is
  launched with ``launch_pdl``; its producer sends the b tiles of its first tile's first STAGES steps before
  ``griddepcontrol.wait`` and every A tile after it, so the launch and the b prologue overlap the pre-pass.
  Nothing else reads what the pre-pass writes, and c is written only after A has been read: the same bits.
* epilogue: the fp32 tile rounded once to bf16 (RNE) into shared memory, stored by TMA (rows >= M and columns
  >= N clipped by the descriptor), overlapping the next tile's main loop.
* NaN policy (package docstring): a dense MMA makes a NaN byte of b poison its whole column, read or not. A tile
  whose fp32 accumulator holds a NaN is recomputed on CUDA cores from the selected positions only (gluon.py's
  ``_selected_sum``: exact products, fp32 sums, within the same model) and stored directly.

Numerics: ``hopper_fp8_wgmma_promote(128)``, as every fp8 path of the package. There is no CPU interpreter for
Gluon: CPU tests build every config for sm_90 (kernels/_sm90.py), GPU tests run it.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .._gluon import (grouped_tile, invalidate_ring, release_slot, store_layout, store_or_reduce, tma_ring_producer,
                      tma_store_tile, ws_shared)
from .gluon import _selected_sum

__all__ = ["BK", "expand_gluon_constexprs", "expand_gluon_layouts", "promoted_chain", "promoted_tiles",
           "sparse_expanded_ws_kernel",
           "store_checked_tile"]

BK = gl.constexpr(128)  # K per ring step = the promotion interval


def expand_gluon_layouts(config):
    """The shared-memory layouts of the A [block_m, 128] and b [block_n, 128] E4M3FN tiles (128-byte swizzle, the
    wgmma operand layout) and of the c tile [block_m, block_n] bf16 (the TMA store's source)."""
    fp8 = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    c = gl.NVMMASharedLayout.get_default_for([config.block_m, config.block_n], gl.bfloat16)
    return fp8, c


def expand_gluon_constexprs(config, pdl: bool = False) -> dict:
    """``sparse_expanded_ws_kernel``'s constexpr arguments for ``config``, in parameter order (``pdl``: launched
    with programmatic dependent launch after the pre-pass)."""
    return dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, STAGES=config.num_stages, GROUP_M=config.group_m,
                num_warps=config.num_warps, PDL=pdl)


# ---------------------------------------------------------------------------------------------------------------
# Consumer (default) partition; its promoted chain and epilogue also serve fused_gluon.py
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit
def promoted_chain(issue, release, ring, step, k_steps, zero, num_warps: gl.constexpr):
    """fp32 sum of one tile's wgmma chain over ring steps step .. step + k_steps - 1 (k_steps >= 1): each step's
    wgmma goes into a fresh accumulator (``issue(ring, s, into)`` waits for step s and issues it into ``into``'s
    registers, use_acc=False), is retired by ``warpgroup_mma_wait(1)`` once the next step's wgmma is issued, added
    into the fp32 sum (``zero``'s layout) and hands its slots back (``release(ring, s, num_warps)``). Two steps
    per iteration, their accumulators in two register sets (pa carried, pb local): a retired accumulator is never
    copied while the other wgmma runs, which would make ptxas serialize every wgmma (advisory C7514)."""
    acc = zero
    pa = issue(ring, step, zero)  # step 0 of the tile (peeled)
    for i in range(1, k_steps - 1, 2):
        pb = issue(ring, step + i, zero)
        ra = warpgroup_mma_wait(num_outstanding=1, deps=(pa,))
        acc = acc + ra
        release(ring, step + i - 1, num_warps)
        pa = issue(ring, step + i + 1, ra)  # into step i - 1's registers
        acc = acc + warpgroup_mma_wait(num_outstanding=1, deps=(pb,))
        release(ring, step + i, num_warps)
    if k_steps % 2 == 0:  # one step left over: k_steps - 1
        pb = issue(ring, step + k_steps - 1, zero)
        acc = acc + warpgroup_mma_wait(num_outstanding=1, deps=(pa,))
        release(ring, step + k_steps - 2, num_warps)
        acc = acc + warpgroup_mma_wait(num_outstanding=0, deps=(pb,))
    else:
        acc = acc + warpgroup_mma_wait(num_outstanding=0, deps=(pa,))
    release(ring, step + k_steps - 1, num_warps)
    return acc


@gluon.jit
def store_checked_tile(acc, c_smem, c_desc, b_ptr, vals_ptr, meta_ptr, c_ptr, M, N, k_steps, stride_bn, stride_am,
                       stride_cm, off_m, off_n, TMA_STORE: gl.constexpr, num_warps: gl.constexpr):
    """Epilogue of the fp32 tile ``acc`` [BLOCK_M, BLOCK_N] (wgmma layout) at c[off_m, off_n]: rounded once to
    bf16 (RNE) and stored, by TMA from ``c_smem`` (TMA_STORE: waits for the previous tile's store first; rows
    >= M and columns >= N clipped) or from registers; a tile holding a NaN is recomputed from the selected
    positions instead (gluon.py's ``_selected_sum``, in column chunks of 16 rows of c: few registers, a rare
    path) and stored directly."""
    BLOCK_M: gl.constexpr = acc.shape[0]
    BLOCK_N: gl.constexpr = acc.shape[1]
    has_nan = gl.max(gl.max((acc != acc).to(gl.int32), axis=1), axis=0)
    if TMA_STORE:
        tma.store_wait(pendings=0)  # the previous tile's store has read c_smem
        gl.thread_barrier()
    if has_nan != 0:
        st_layout: gl.constexpr = store_layout(BLOCK_N, 16, num_warps)
        for m0 in range(off_m, gl.minimum(off_m + BLOCK_M, M), 16):
            part = _selected_sum(b_ptr, stride_bn, vals_ptr, meta_ptr, stride_am, off_n, m0, M, N, 0,
                                 k_steps * (BK // 4), BLOCK_N, 16, st_layout)
            store_or_reduce(part, c_ptr, c_ptr, c_ptr, M, N, stride_cm, off_n, m0, m0, 0, 0, 1.0,
                            BLOCK_N, 16, 1, False, num_warps)
    elif TMA_STORE:
        tma_store_tile(acc, c_smem, c_desc, off_m, off_n)  # one RNE rounding to bf16
    else:  # one RNE rounding to bf16, from the wgmma layout (no shared memory for a TMA store)
        rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc.type.layout))
        cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc.type.layout))
        ptrs = c_ptr + gl.expand_dims(rows.to(gl.int64) * stride_cm, 1) + gl.expand_dims(cols, 0)
        mask = gl.expand_dims(rows < M, 1) & gl.expand_dims(cols < N, 0)
        gl.store(ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def promoted_tiles(issue, release, ring, zero, c_smem, c_desc, b_ptr, vals_ptr, meta_ptr, c_ptr, M, N, num_pid_m,
                   num_pid_n, k_steps, stride_bn, stride_am, stride_cm, GROUP_M: gl.constexpr,
                   TMA_STORE: gl.constexpr, num_warps: gl.constexpr):
    """A consumer partition's whole walk: for each tile of this CTA (``grouped_tile`` order from program_id, step
    num_programs) its ``promoted_chain`` over the ring, then ``store_checked_tile``; the last TMA store waited for."""
    BLOCK_M: gl.constexpr = zero.shape[0]
    BLOCK_N: gl.constexpr = zero.shape[1]
    gl.assume(k_steps >= 1)
    step = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = promoted_chain(issue, release, ring, step, k_steps, zero, num_warps)
        step += k_steps
        store_checked_tile(acc, c_smem, c_desc, b_ptr, vals_ptr, meta_ptr, c_ptr, M, N, k_steps, stride_bn,
                           stride_am, stride_cm, pid_m * BLOCK_M, pid_n * BLOCK_N, TMA_STORE, num_warps)
    if TMA_STORE:
        tma.store_wait(pendings=0)


@gluon.jit
def _issue(ring, step, into):
    """Wait for ring step ``step`` (A and b landed) and issue its wgmma into ``into``'s registers."""
    a_bufs, b_bufs, ready, empty, STAGES = ring
    s = step % STAGES
    mbarrier.wait(ready.index(s), (step // STAGES) & 1)
    return warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), into, use_acc=False, is_async=True)


@gluon.jit
def _release(ring, step, num_warps: gl.constexpr):
    """Step ``step``'s wgmma retired: hand its slot back to the producer."""
    a_bufs, b_bufs, ready, empty, STAGES = ring
    release_slot(empty, step, STAGES, num_warps)


@gluon.jit
def _consumer(a_bufs, b_bufs, ready, empty, c_smem, c_desc, b_ptr, vals_ptr, meta_ptr, c_ptr,
              M, N, num_pid_m, num_pid_n, k_steps, stride_bn, stride_am, stride_cm,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
              num_warps: gl.constexpr):
    """Default partition: the promoted wgmma chain of each tile of this CTA, its NaN check, its epilogue."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 32])
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    ring = (a_bufs, b_bufs, ready, empty, STAGES)
    promoted_tiles(_issue, _release, ring, zero, c_smem, c_desc, b_ptr, vals_ptr, meta_ptr, c_ptr, M, N, num_pid_m,
                   num_pid_n, k_steps, stride_bn, stride_am, stride_cm, GROUP_M, True, num_warps)


# ---------------------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit(do_not_specialize=["M"])  # one build for every M of a config
def sparse_expanded_ws_kernel(
    # TMA descriptors: dense A [M, K] E4M3FN (block [BLOCK_M, 128]), b [N, K] E4M3FN (block [BLOCK_N, 128]),
    # c [M, N] bf16 (block [BLOCK_M, BLOCK_N])
    a_desc, b_desc, c_desc,
    # the operands as pointers for the NaN recompute: b, vals and meta [M, K/4], c
    b_ptr, vals_ptr, meta_ptr, c_ptr,
    # sizes and strides (elements): K steps of 128 in all
    M, N, k_steps, stride_bn, stride_am, stride_cm,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
    num_warps: gl.constexpr, PDL: gl.constexpr = False,
):
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    a_bufs, b_bufs, c_smem, ready, empty = ws_shared(a_desc, b_desc, c_desc, STAGES)
    gl.warp_specialize(
        [(_consumer, (a_bufs, b_bufs, ready, empty, c_smem, c_desc, b_ptr, vals_ptr, meta_ptr, c_ptr, M, N,
                      num_pid_m, num_pid_n, k_steps, stride_bn, stride_am, stride_cm, BLOCK_M, BLOCK_N, STAGES,
                      GROUP_M, num_warps)),
         (tma_ring_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, num_pid_m, num_pid_n, k_steps,
                              BLOCK_M, BLOCK_N, BK, STAGES, GROUP_M, PDL))],
        [1], [40])
    invalidate_ring(ready, empty, STAGES)
