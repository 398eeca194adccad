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
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .._gluon import (grouped_tile, invalidate_ring, release_slot, store_layout, store_or_reduce, tma_ring_producer,
                      tma_store_tile, ws_shared)
from .gluon import _selected_sum, _words_by_arithmetic

__all__ = ["BK", "FLAG_WORDS", "expand_gluon_constexprs", "flag_words", "expand_gluon_layouts", "sparse_expanded_ws_kernel"]

BK = gl.constexpr(128)  # K per ring step = the promotion interval
FLAG_WORDS = gl.constexpr(2)  # the in-kernel decode's words before its unit flags: exit count, generation


def expand_gluon_layouts(config):
    """The shared-memory layouts of the A [block_m, 128] and b [block_n, 128] E4M3FN tiles (128-byte swizzle, the
    wgmma operand layout), of the c tile [block_m, block_n] bf16 (the TMA store's source) and of the vals / meta
    tiles [block_m, 32] bytes (no swizzle; the in-kernel decode's)."""
    fp8 = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    c = gl.NVMMASharedLayout.get_default_for([config.block_m, config.block_n], gl.bfloat16)
    raw = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
    return fp8, c, raw


def expand_gluon_constexprs(config, pdl: bool = False) -> dict:
    """``sparse_expanded_ws_kernel``'s constexpr arguments for ``config``, in parameter order (``pdl``: launched
    with programmatic dependent launch after the pre-pass; not with ``config.decode_warps``)."""
    return dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, STAGES=config.num_stages, GROUP_M=config.group_m,
                num_warps=config.num_warps, PDL=pdl, DECODE_WARPS=config.decode_warps, DECODE_LUT=DEV_LUT, DECODE_REGS=DEV_REGS)


DEV_LUT = False
DEV_REGS = 88


def flag_words(config, M: int, K: int) -> int:
    """int32 words of the in-kernel decode's flag workspace at M x K: FLAG_WORDS, then one flag per unit (M tile x
    128-K step)."""
    return FLAG_WORDS + -(-M // config.block_m) * (K // BK)


# ---------------------------------------------------------------------------------------------------------------
# Consumer (default) partition
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit
def _issue(a_bufs, b_bufs, ready, step, into, STAGES: gl.constexpr):
    """Wait for ring step ``step`` and issue its wgmma into a fresh accumulator held in ``into``'s registers
    (use_acc=False: their value is not read)."""
    s = step % STAGES
    mbarrier.wait(ready.index(s), (step // STAGES) & 1)
    return warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), into, use_acc=False, is_async=True)


@gluon.jit
def _consumer(a_bufs, b_bufs, ready, empty, c_smem, c_desc, b_ptr, vals_ptr, meta_ptr, c_ptr,
              M, N, num_pid_m, num_pid_n, k_steps, stride_bn, stride_am, stride_cm,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
              num_warps: gl.constexpr):
    """Default partition: the promoted wgmma chain of each tile of this CTA, its NaN check, its epilogue."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 32])
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    gl.assume(k_steps >= 1)
    step = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        # ---- main loop: one fresh-accumulator wgmma per step, the previous step promoted while it runs ----
        acc = zero
        pa = _issue(a_bufs, b_bufs, ready, step, zero, STAGES)  # step 0 of the tile (peeled)
        for i in range(1, k_steps - 1, 2):  # two steps per iteration: pa carried, pb local (C7514)
            pb = _issue(a_bufs, b_bufs, ready, step + i, zero, STAGES)
            ra = warpgroup_mma_wait(num_outstanding=1, deps=(pa,))
            acc = acc + ra
            release_slot(empty, step + i - 1, STAGES, num_warps)
            pa = _issue(a_bufs, b_bufs, ready, step + i + 1, ra, STAGES)  # into step i - 1's registers
            acc = acc + warpgroup_mma_wait(num_outstanding=1, deps=(pb,))
            release_slot(empty, step + i, STAGES, num_warps)
        if k_steps % 2 == 0:  # one step left over: k_steps - 1
            pb = _issue(a_bufs, b_bufs, ready, step + k_steps - 1, zero, STAGES)
            acc = acc + warpgroup_mma_wait(num_outstanding=1, deps=(pa,))
            release_slot(empty, step + k_steps - 2, STAGES, num_warps)
            acc = acc + warpgroup_mma_wait(num_outstanding=0, deps=(pb,))
        else:
            acc = acc + warpgroup_mma_wait(num_outstanding=0, deps=(pa,))
        release_slot(empty, step + k_steps - 1, STAGES, num_warps)
        step += k_steps

        # ---- epilogue: the previous tile's TMA store has read c_smem; this tile's NaN check, then its store ----
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        has_nan = gl.max(gl.max((acc != acc).to(gl.int32), axis=1), axis=0)
        tma.store_wait(pendings=0)
        gl.thread_barrier()
        if has_nan != 0:  # recomputed in column chunks of 16 rows of c (few registers: a rare path)
            st_layout: gl.constexpr = store_layout(BLOCK_N, 16, num_warps)
            for m0 in range(off_m, gl.minimum(off_m + BLOCK_M, M), 16):
                part = _selected_sum(b_ptr, stride_bn, vals_ptr, meta_ptr, stride_am, off_n, m0, M, N, 0,
                                     k_steps * (BK // 4), BLOCK_N, 16, st_layout)
                store_or_reduce(part, c_ptr, c_ptr, c_ptr, M, N, stride_cm, off_n, m0, 0, 0, 1.0,
                                BLOCK_N, 16, 1, False, num_warps)
        else:
            tma_store_tile(acc, c_smem, c_desc, off_m, off_n)  # one RNE rounding to bf16
    tma.store_wait(pendings=0)


# ---------------------------------------------------------------------------------------------------------------
# In-kernel decode (DECODE_WARPS > 0): decode partition, flag-waiting producer
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit
def _proxy_fence():
    """fence.proxy.async.global: order this thread's generic-proxy global accesses with async-proxy (TMA) ones."""
    gl.inline_asm_elementwise("fence.proxy.async.global; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _unit(u, num_pid_m, k_steps, GROUP_M: gl.constexpr):
    """(M tile j, K step ks) of decode unit ``u``: units go group by group of GROUP_M row tiles (``grouped_tile``'s
    groups), K step by K step within a group, so they come in the order the tile walk first needs them."""
    per_group = GROUP_M * k_steps
    first_m = (u // per_group) * GROUP_M
    size = gl.minimum(num_pid_m - first_m, GROUP_M)
    r = u % per_group
    return first_m + r % size, r // size


@gluon.jit
def _load_unit(v_desc, t_desc, v_buf, t_buf, bar, u, num_pid_m, k_steps, pred, BLOCK_M: gl.constexpr,
               GROUP_M: gl.constexpr):
    """TMA (when ``pred``): the vals and meta bytes [BLOCK_M, 32] of decode unit ``u`` (rows past M zero-filled)."""
    j, ks = _unit(u, num_pid_m, k_steps, GROUP_M)
    mbarrier.expect(bar, 2 * v_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(v_desc, [j * BLOCK_M, ks * 32], bar, v_buf, pred=pred)
    tma.async_copy_global_to_shared(t_desc, [j * BLOCK_M, ks * 32], bar, t_buf, pred=pred)


@gluon.jit
def _decoder(v_desc, t_desc, a8w_ptr, lut_ptr, flag_ptr, M, G, num_pid_m, k_steps,
             BLOCK_M: gl.constexpr, GROUP_M: gl.constexpr, DECODE_WARPS: gl.constexpr, DECODE_LUT: gl.constexpr):
    """Decode partition: the CTAs share the decode units (one M tile x one 128-K step of A) round-robin, in the
    tile walk's order of first need (``_unit``). A unit's vals and meta bytes arrive by TMA into one of two
    buffers (the next unit's are in flight while this one is decoded); each group goes through the decode table
    (``gluon.decode_table``: one L1-resident word per group, exact) into the dense-A workspace (int32 words,
    byte j = column 4g + j); then the unit's flag (word j * k_steps + ks after FLAG_WORDS) takes this launch's
    generation + 1 (release, after every thread's stores and an async-proxy fence): the producers' TMA loads of
    A wait for it."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [DECODE_WARPS, 1], [1, 0])
    v_bufs = gl.allocate_shared_memory(gl.int8, [2, BLOCK_M, 32], v_desc.layout)
    t_bufs = gl.allocate_shared_memory(gl.int8, [2, BLOCK_M, 32], t_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    gen = gl.atomic_add(flag_ptr + 1, 0, sem="relaxed", scope="gpu")  # completed launches (the last bump came before)
    rows = gl.arange(0, BLOCK_M // 2, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, 32, layout=gl.SliceLayout(0, layout))
    units = num_pid_m * k_steps
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    _load_unit(v_desc, t_desc, v_bufs.index(0), t_bufs.index(0), bars.index(0), pid, num_pid_m, k_steps,
               pid < units, BLOCK_M, GROUP_M)
    if DECODE_LUT:  # the table's 128 lines into L1 while the first unit's bytes are in flight
        pl: gl.constexpr = gl.BlockedLayout([1], [32], [DECODE_WARPS], [0])
        lines = gl.arange(0, 32 * DECODE_WARPS, layout=pl)
        for c in gl.static_range(0, 128, 32 * DECODE_WARPS):
            gl.inline_asm_elementwise("prefetch.global.L1 [$1]; mov.u32 $0, 0;", "=r,l", [lut_ptr + (c + lines) * 32],
                                      dtype=gl.int32, is_pure=False, pack=1)
    i = 0
    for u in range(pid, units, nprog):
        nb = (i + 1) % 2  # read in the previous iteration, which ended with a barrier
        _load_unit(v_desc, t_desc, v_bufs.index(nb), t_bufs.index(nb), bars.index(nb), u + nprog, num_pid_m,
                   k_steps, u + nprog < units, BLOCK_M, GROUP_M)
        b = i % 2
        mbarrier.wait(bars.index(b), (i // 2) & 1)
        j, ks = _unit(u, num_pid_m, k_steps, GROUP_M)
        # half a unit at a time: its table loads all in flight together (a store between them orders them)
        for r0 in gl.static_range(0, BLOCK_M, BLOCK_M // 2):
            v = v_bufs.index(b).slice(r0, BLOCK_M // 2, dim=0).load(layout).to(gl.uint8, bitcast=True).to(gl.int32)
            t = t_bufs.index(b).slice(r0, BLOCK_M // 2, dim=0).load(layout).to(gl.uint8, bitcast=True).to(gl.int32)
            if DECODE_LUT:
                words = gl.load(lut_ptr + (((t & 15) << 8) | v))
            else:
                words = _words_by_arithmetic(v, t)
            r = gl.expand_dims(j * BLOCK_M + r0 + rows, 1)
            g = gl.expand_dims(ks * 32 + cols, 0)
            gl.store(a8w_ptr + r.to(gl.int64) * G + g, words, mask=(r < M) & (g < G))
        _proxy_fence()
        gl.thread_barrier()  # every thread's stores of the unit precede the release (and its reads the next TMA)
        gl.atomic_xchg(flag_ptr + FLAG_WORDS + j * k_steps + ks, gen + 1, sem="release", scope="gpu")
        i += 1
    for i in gl.static_range(2):
        mbarrier.invalidate(bars.index(i))


@gluon.jit
def _ready_steps(flag_ptr, f0, kk, k_steps, target):
    """K steps of one M tile known decoded (its flags start at word f0 after FLAG_WORDS): kk + the number of
    consecutive steps kk, kk + 1, ... (up to 32, one per lane; volatile loads, no atomics: many producers poll
    the same few lines) whose flag holds ``target``."""
    lanes: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    idx = kk + gl.arange(0, 32, layout=lanes)
    f = gl.load(flag_ptr + FLAG_WORDS + f0 + idx, mask=idx < k_steps, other=0, volatile=True)
    return gl.min(gl.where((f == target) | (idx >= k_steps), kk + 32, idx), axis=0)


@gluon.jit
def _acquire_fence():
    """fence.acq_rel.gpu: with the volatile flag reads before it, an acquire of the decoders' release."""
    gl.inline_asm_elementwise("fence.acq_rel.gpu; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _backoff():
    """nanosleep between polls of a flag that is not set yet (fewer L2 requests while the decoders work)."""
    gl.inline_asm_elementwise("nanosleep.u32 64; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _flag_producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, flag_ptr, num_pid_m, num_pid_n, k_steps,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    """``tma_ring_producer`` for the in-kernel decode: each slot's b tile goes out as soon as the slot is empty,
    its A tile once the unit's flag says the decode partitions wrote it (acquire, then an async-proxy fence)."""
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    target = gl.atomic_add(flag_ptr + 1, 0, sem="relaxed", scope="gpu") + 1  # as the decoders read it
    step = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        known = 0
        for kk in range(k_steps):
            s = step % STAGES
            mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)
            tma.async_copy_global_to_shared(b_desc, [pid_n * BLOCK_N, kk * BK], bar, b_bufs.index(s))
            if known <= kk:
                known = _ready_steps(flag_ptr, pid_m * k_steps, kk, k_steps, target)
                while known <= kk:
                    _backoff()
                    known = _ready_steps(flag_ptr, pid_m * k_steps, kk, k_steps, target)
                _acquire_fence()
                _proxy_fence()
            tma.async_copy_global_to_shared(a_desc, [pid_m * BLOCK_M, kk * BK], bar, a_bufs.index(s))
            step += 1


# ---------------------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit(do_not_specialize=["M"])  # one build for every M of a config
def sparse_expanded_ws_kernel(
    # TMA descriptors: dense A [M, K] E4M3FN (block [BLOCK_M, 128]), b [N, K] E4M3FN (block [BLOCK_N, 128]),
    # c [M, N] bf16 (block [BLOCK_M, BLOCK_N]); vals and meta [M, K/4] bytes (block [BLOCK_M, 32]: read by the
    # in-kernel decode only)
    a_desc, b_desc, c_desc, v_desc, t_desc,
    # the operands as pointers for the NaN recompute: b, vals and meta [M, K/4], c
    b_ptr, vals_ptr, meta_ptr, c_ptr,
    # in-kernel decode (DECODE_WARPS > 0; else unused): the dense-A workspace as int32 words, its flags (int32,
    # FLAG_WORDS + tiles of M x K steps, zeroed when allocated), the decode table (``gluon.decode_table``)
    a8w_ptr, flag_ptr, lut_ptr,
    # sizes and strides (elements): K steps of 128 in all
    M, N, k_steps, stride_bn, stride_am, stride_cm,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
    num_warps: gl.constexpr, PDL: gl.constexpr = False, DECODE_WARPS: gl.constexpr = 0, DECODE_LUT: gl.constexpr = False,
    DECODE_REGS: gl.constexpr = 120,
):
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    a_bufs, b_bufs, c_smem, ready, empty = ws_shared(a_desc, b_desc, c_desc, STAGES)
    if DECODE_WARPS == 0:  # A written by the pre-pass
        gl.warp_specialize(
            [(_consumer, (a_bufs, b_bufs, ready, empty, c_smem, c_desc, b_ptr, vals_ptr, meta_ptr, c_ptr, M, N,
                         num_pid_m, num_pid_n, k_steps, stride_bn, stride_am, stride_cm, BLOCK_M, BLOCK_N, STAGES,
                         GROUP_M, num_warps)),
             (tma_ring_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, num_pid_m, num_pid_n, k_steps,
                                  BLOCK_M, BLOCK_N, BK, STAGES, GROUP_M, PDL))],
            [1], [40])
    else:  # A decoded by this grid's decode partitions (a cooperative launch: every CTA resident)
        gl.warp_specialize(
            [(_consumer, (a_bufs, b_bufs, ready, empty, c_smem, c_desc, b_ptr, vals_ptr, meta_ptr, c_ptr, M, N,
                         num_pid_m, num_pid_n, k_steps, stride_bn, stride_am, stride_cm, BLOCK_M, BLOCK_N, STAGES,
                         GROUP_M, num_warps)),
             (_flag_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, flag_ptr, num_pid_m, num_pid_n,
                               k_steps, BLOCK_M, BLOCK_N, STAGES, GROUP_M)),
             (_decoder, (v_desc, t_desc, a8w_ptr, lut_ptr, flag_ptr, M, k_steps * 32, num_pid_m, k_steps, BLOCK_M,
                         GROUP_M, DECODE_WARPS, DECODE_LUT))],
            [1, DECODE_WARPS], [40, DECODE_REGS])
    invalidate_ring(ready, empty, STAGES)
    if DECODE_WARPS > 0:
        # every CTA read the generation at its start; the last to get here bumps it for the next launch
        arrived = gl.atomic_add(flag_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == gl.num_programs(0) - 1:
            gl.atomic_xchg(flag_ptr, 0, sem="relaxed", scope="gpu")
            gl.atomic_add(flag_ptr + 1, 1, sem="release", scope="gpu")
