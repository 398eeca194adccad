"""Gluon path of gemm_fp16 for large M (``PersistentConfig``): persistent, warp-specialized wgmma with a
deterministic stream-K schedule, on sm_90.

    C[M, N] (fp16) = A[M, K] @ B[N, K]^T, fp32 accumulation on wgmma, one RNE rounding

At large M the GEMM is compute-bound and the loss is wave quantization: 128 x 256 tiles of the gemm_n3072_k2048
workload make 96 / 204 / 228 tiles at M = 972 / 2053 / 2379 for 132 SMs, so the last wave leaves up to 27% of the
SMs idle. This kernel's stream-K schedules give every SM the same work (measured on the H200 they are not faster:
the staggered K ranges feed the tensor cores more slowly than whole tiles do; docs/benchmarks.md):

* persistent: one CTA per SM (``num_programs``), each walking its own work in grouped tile order (GROUP_M row
  tiles share B's column tiles in L2).
* stream-K (``STREAM_K`` 1 or 2, the schedule of ``tma.gemm_fp16_tma_streamk_kernel``, mirrored on the host by
  ``configs.stream_k_schedule``): the (tile, K-iteration) pairs of the stream-K tiles, linearised as
  tile * k_tiles + kt, are cut into ``num_programs`` contiguous ranges of equal length (+-1). 1: every tile; 2
  (hybrid): only the num_tiles % num_programs tiles of the last partial wave, the full waves after them as whole
  tiles. 0: whole tiles only. A range's first piece is the tail of a tile (K-iterations up to the end) and its last
  piece the head of another (K-iterations from 0).
* split tiles, bitwise deterministic without any wait: a tail piece writes its fp32 partial (from the wgmma
  registers) to workspace slot (piece, tile) and bumps the tile's counter (acq_rel). The head, last in time,
  first reads the counter (acquire): with every tail in, it adds slots 1, 2, ... to its registers in K order;
  otherwise it writes slot 0 and bumps like a tail, and the last arrival sums slots 0, 1, ... in K order. Either
  way the pieces are summed in the order 0, 1, ..., P - 1 in fp32 (RN) by exactly one CTA, which rounds once,
  stores and resets the counter for the next launch.
* warp specialization: a 1-warp producer partition TMA-loads A [BLOCK_M, BLOCK_K] and B [BLOCK_N, BLOCK_K], each
  in its parts, into a STAGES-deep ring ("ready" barriers carry the bytes, "empty" barriers hand a slot back) and
  runs ahead across pieces and tiles, so the next piece's loads overlap this piece's fix-up or store. The default
  partition (one or two warpgroups stacked along BLOCK_M) waits, issues async wgmma with one K step's wgmma groups in
  flight (one, or one per column part), and stores.
* epilogue: a whole tile is rounded once to fp16 (RNE) into shared memory and stored by TMA (rows >= M and
  columns >= N clipped), overlapping the next piece's main loop; a split tile's finisher stores the same way.
* two column parts (BLOCK_N = 192 = 128 + 64, ``m_parts``; whole tiles only): Triton's tensors are powers of two,
  so each K step loads B's two boxes into two rings and issues one wgmma per part into its own accumulator, and
  the epilogue stores the two parts. N = 3072 then makes 16 column tiles, so M <= 1024 is one wave of 128 tiles
  (against 96 of 128 x 256 at M = 972, which leave 36 of 132 SMs idle).
* two row parts (BLOCK_M = 192 = 128 + 64; whole tiles only): the ring holds A's two boxes, the default partition
  (two warpgroups) computes and stores the high 128 rows and a worker partition of one warpgroup the low 64, each
  handing every slot back (the "empty" barriers count two arrivals). M = 2053 then makes 11 row tiles: 264 tiles
  of 192 x 128, two whole waves of 132 SMs (204 of 128 x 256 also take two, of larger tiles).

Numerics: each piece is one ``hopper_fp16_wgmma`` chain over its K-iterations (a two-part tile's elements have
the one-part tile's chains); a split tile's pieces are summed in K order in fp32 RN (``configs.accumulation_model``
bounds both with the schedule of the launch). There is no CPU interpreter for Gluon: the CPU tests build every
config for sm_90 (kernels/_sm90.py), the GPU tests run it.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .._gluon import grouped_tile, invalidate_ring, m_parts, part_layouts, release_slot, tma_store_tile, ws_shared

__all__ = ["gemm_persistent_kernel", "persistent_constexprs", "persistent_layouts"]


def persistent_layouts(config):
    """The NVMMA shared-memory layouts of A's two row parts [hi, BLOCK_K] and [lo, BLOCK_K] (``m_parts(BLOCK_M)``),
    of B's two column parts [hi, BLOCK_K] and [lo, BLOCK_K] (``m_parts(BLOCK_N)``) (the TMA destinations and wgmma
    operands) and of C's two parts along the split dimension ([BLOCK_M, hi] and [BLOCK_M, lo] of N, or [hi,
    BLOCK_N] and [lo, BLOCK_N] of M; the TMA stores' sources). A one-part dimension's second is its first."""
    return (*part_layouts([config.BLOCK_M, config.BLOCK_K], 0), *part_layouts([config.BLOCK_N, config.BLOCK_K], 0),
            *part_layouts([config.BLOCK_M, config.BLOCK_N], 0 if m_parts(config.BLOCK_M)[1] else 1))


def persistent_constexprs(config) -> dict:
    """``gemm_persistent_kernel``'s constexpr arguments for ``config``, in parameter order."""
    return dict(BLOCK_M=config.BLOCK_M, BLOCK_M_LO=m_parts(config.BLOCK_M)[1], BLOCK_N=config.BLOCK_N,
                BLOCK_N_LO=m_parts(config.BLOCK_N)[1], BLOCK_K=config.BLOCK_K, STAGES=config.STAGES,
                GROUP_M=config.GROUP_M, STREAM_K=config.STREAM_K, num_warps=config.num_warps)


# ---------------------------------------------------------------------------------------------------------------
# The schedule: both partitions walk the same pieces
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit
def _schedule(M, N, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
              STREAM_K: gl.constexpr):
    """(num_pid_m, num_pid_n, k_tiles, sk_tiles, it, it_end, first_tile, end_tile) of this CTA: the stream-K
    tiles are 0..sk_tiles-1, its range of their (tile, K-iteration) pairs is [it, it_end) (configs.
    stream_k_schedule), and that range touches tiles first_tile..end_tile-1 (none when it is empty)."""
    G = gl.num_programs(0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = gl.cdiv(K, BLOCK_K)
    if STREAM_K == 1:
        sk_tiles = num_tiles
    elif STREAM_K == 2:  # the last partial wave; all tiles when there is at most one wave
        sk_tiles = num_tiles % G + (num_tiles <= G).to(gl.int32) * (num_tiles - num_tiles % G)
    else:
        sk_tiles = num_tiles * 0
    total = sk_tiles * k_tiles
    base = total // G
    extra = total % G
    pid = gl.program_id(0)
    it = pid * base + gl.minimum(pid, extra)
    it_end = it + base + (pid < extra).to(gl.int32)
    first_tile = it // k_tiles
    end_tile = first_tile + (it < it_end).to(gl.int32) * ((it_end + k_tiles - 1) // k_tiles - first_tile)
    return num_pid_m, num_pid_n, k_tiles, sk_tiles, it, it_end, first_tile, end_tile


@gluon.jit
def _owner(i, base, extra):
    """The CTA whose stream-K range holds linear K-iteration ``i``: CTAs 0..extra-1 own base + 1 iterations, the
    others base (the ranges are contiguous, in CTA order)."""
    big = extra * (base + 1)
    return gl.where(i < big, i // (base + 1), extra + (i - big) // gl.maximum(base, 1))


# ---------------------------------------------------------------------------------------------------------------
# Producer partition (1 warp)
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit
def _load_piece(a_desc, a2_desc, b_desc, b2_desc, a_bufs, a2_bufs, b_bufs, b2_bufs, ready, empty, off_m, off_n, kt0,
                kt1, step, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, BLOCK_M_LO: gl.constexpr,
                BLOCK_N_LO: gl.constexpr):
    """TMA K-iterations kt0..kt1-1 of one tile (with BLOCK_M_LO, A's rows in two parts: a_desc's block rows from
    off_m, then a2_desc's; with BLOCK_N_LO, B's likewise) into the ring from ring step ``step``; returns the next
    step."""
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes + (
        a2_desc.block_type.nbytes if BLOCK_M_LO > 0 else 0) + (b2_desc.block_type.nbytes if BLOCK_N_LO > 0 else 0)
    for kk in range(kt0, kt1):
        s = step % STAGES
        mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)  # fresh barriers: parity 1 counts as complete
        bar = ready.index(s)
        mbarrier.expect(bar, nbytes)
        tma.async_copy_global_to_shared(a_desc, [off_m, kk * BLOCK_K], bar, a_bufs.index(s))
        if BLOCK_M_LO > 0:
            tma.async_copy_global_to_shared(a2_desc, [off_m + a_desc.block_type.shape[0], kk * BLOCK_K], bar,
                                            a2_bufs.index(s))
        tma.async_copy_global_to_shared(b_desc, [off_n, kk * BLOCK_K], bar, b_bufs.index(s))
        if BLOCK_N_LO > 0:
            tma.async_copy_global_to_shared(b2_desc, [off_n + b_desc.block_type.shape[0], kk * BLOCK_K], bar,
                                            b2_bufs.index(s))
        step += 1
    return step


@gluon.jit
def _producer(a_desc, a2_desc, b_desc, b2_desc, a_bufs, a2_bufs, b_bufs, b2_bufs, ready, empty, M, N, K,
              BLOCK_M: gl.constexpr, BLOCK_M_LO: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_N_LO: gl.constexpr,
              BLOCK_K: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, STREAM_K: gl.constexpr):
    num_pid_m, num_pid_n, k_tiles, sk_tiles, it, it_end, first_tile, end_tile = _schedule(
        M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, STREAM_K)
    step = 0
    for tile in range(first_tile, end_tile):  # the stream-K pieces of this range
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        kt0 = gl.maximum(it - tile * k_tiles, 0)
        kt1 = gl.minimum(it_end - tile * k_tiles, k_tiles)
        step = _load_piece(a_desc, a2_desc, b_desc, b2_desc, a_bufs, a2_bufs, b_bufs, b2_bufs, ready, empty,
                           pid_m * BLOCK_M, pid_n * BLOCK_N, kt0, kt1, step, BLOCK_K, STAGES, BLOCK_M_LO, BLOCK_N_LO)
    for tile in range(sk_tiles + gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):  # whole tiles
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        step = _load_piece(a_desc, a2_desc, b_desc, b2_desc, a_bufs, a2_bufs, b_bufs, b2_bufs, ready, empty,
                           pid_m * BLOCK_M, pid_n * BLOCK_N, 0, k_tiles, step, BLOCK_K, STAGES, BLOCK_M_LO, BLOCK_N_LO)


# ---------------------------------------------------------------------------------------------------------------
# Consumer (default) partition
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit
def _mma_piece(a_bufs, b_bufs, ready, empty, step, nk, acc_layout: gl.constexpr, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """One fp32 wgmma chain over the ``nk`` >= 1 ring steps from ``step``: one wgmma group in flight, a slot
    handed back as soon as the group that read it retired."""
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    for i in range(nk):
        s = (step + i) % STAGES
        mbarrier.wait(ready.index(s), ((step + i) // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        if i > 0:
            release_slot(empty, step + i - 1, STAGES, num_warps)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    release_slot(empty, step + nk - 1, STAGES, num_warps)
    return acc


@gluon.jit
def _mma_piece_2(a_bufs, b_bufs, b2_bufs, ready, empty, step, nk, acc_layout: gl.constexpr,
                 acc2_layout: gl.constexpr, BLOCK_M: gl.constexpr, BN_HI: gl.constexpr, BN_LO: gl.constexpr,
                 STAGES: gl.constexpr, num_warps: gl.constexpr):
    """``_mma_piece`` of a two-part tile: per ring step one wgmma per column part into its own accumulator (each
    element's chain is the one-part tile's), each committed as its own wgmma group; waiting down to two groups
    keeps this step's pair in flight and retires the previous step's, whose slot goes back. Returns (acc, acc2)."""
    acc = gl.zeros([BLOCK_M, BN_HI], gl.float32, acc_layout)
    acc2 = gl.zeros([BLOCK_M, BN_LO], gl.float32, acc2_layout)
    for i in range(nk):
        s = (step + i) % STAGES
        mbarrier.wait(ready.index(s), ((step + i) // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
        acc2 = warpgroup_mma(a_bufs.index(s), b2_bufs.index(s).permute((1, 0)), acc2, is_async=True)
        acc, acc2 = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc2))
        if i > 0:
            release_slot(empty, step + i - 1, STAGES, num_warps)
    acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2))
    release_slot(empty, step + nk - 1, STAGES, num_warps)
    return acc, acc2


@gluon.jit
def _store_tile(acc, c_smem, c_desc, off_m, off_n):
    """Round once to fp16 and TMA-store, after the previous store from ``c_smem`` has read it."""
    tma.store_wait(pendings=0)
    gl.thread_barrier()
    tma_store_tile(acc, c_smem, c_desc, off_m, off_n)


@gluon.jit
def _finish_split(acc, ws_tile, slot_stride, offs, n_pieces, cnt, c_smem, c_desc, off_m, off_n,
                  FROM_SLOT0: gl.constexpr):
    """The one CTA that completes a split tile: piece 0 (``acc``, or slot 0 when FROM_SLOT0) + slot 1 + ... +
    slot n_pieces - 1 in that order (fp32 RN), the counter reset for the next launch, one rounding, the store."""
    if FROM_SLOT0:
        acc = gl.load(ws_tile + offs, cache_modifier=".cg")
    for s in range(1, n_pieces):
        acc = acc + gl.load(ws_tile + s * slot_stride + offs, cache_modifier=".cg")
    gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
    _store_tile(acc, c_smem, c_desc, off_m, off_n)


@gluon.jit
def _consumer(a_bufs, b_bufs, b2_bufs, ready, empty, c_smem, c2_smem, c_desc, c2_desc, ws_ptr, cnt_ptr, M, N, K,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_N_LO: gl.constexpr, BLOCK_K: gl.constexpr,
              STAGES: gl.constexpr, GROUP_M: gl.constexpr, STREAM_K: gl.constexpr, num_warps: gl.constexpr,
              ROWS: gl.constexpr, ROW0: gl.constexpr):
    """A consumer partition: rows ROW0..ROW0+ROWS-1 of every tile (all BLOCK_M rows, or one of a two-part tile's row
    parts: then the A ring, C buffer and C descriptor given are that part's), one warpgroup per 64 rows."""
    BN_HI: gl.constexpr = BLOCK_N - BLOCK_N_LO
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BN_HI, 16])
    num_pid_m, num_pid_n, k_tiles, sk_tiles, it, it_end, first_tile, end_tile = _schedule(
        M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, STREAM_K)
    G = gl.num_programs(0)
    step = 0
    if STREAM_K != 0:
        TILE: gl.constexpr = BLOCK_M * BLOCK_N
        rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
        offs = gl.expand_dims(rows, 1) * BLOCK_N + gl.expand_dims(cols, 0)  # partials in the wgmma layout
        slot_stride = sk_tiles.to(gl.int64) * TILE
        base = sk_tiles * k_tiles // G
        extra = sk_tiles * k_tiles % G
        for tile in range(first_tile, end_tile):
            pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
            t0 = tile * k_tiles
            kt0 = gl.maximum(it - t0, 0)
            kt1 = gl.minimum(it_end - t0, k_tiles)
            acc = _mma_piece(a_bufs, b_bufs, ready, empty, step, kt1 - kt0, acc_layout, BLOCK_M, BLOCK_N, STAGES,
                             num_warps)
            step += kt1 - kt0
            if (kt0 == 0) & (kt1 == k_tiles):  # a whole tile
                _store_tile(acc, c_smem, c_desc, pid_m * BLOCK_M, pid_n * BLOCK_N)
            else:
                first = _owner(t0, base, extra)  # the CTA holding the tile's K-iteration 0 (its head)
                n_pieces = _owner(t0 + k_tiles - 1, base, extra) - first + 1
                piece = gl.program_id(0) - first  # position in K order
                ws_tile = ws_ptr + tile.to(gl.int64) * TILE
                cnt = cnt_ptr + tile
                tails_in = 0
                if piece == 0:  # the head: have all the tails arrived?
                    tails_in = gl.atomic_add(cnt, 0, sem="acquire", scope="gpu")
                if tails_in == n_pieces - 1:
                    _finish_split(acc, ws_tile, slot_stride, offs, n_pieces, cnt, c_smem, c_desc, pid_m * BLOCK_M,
                                  pid_n * BLOCK_N, False)
                else:
                    gl.store(ws_tile + piece * slot_stride + offs, acc, cache_modifier=".cg")
                    gl.thread_barrier()  # every thread's partial stores precede the release below
                    arrived = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
                    if arrived == n_pieces - 1:
                        _finish_split(acc, ws_tile, slot_stride, offs, n_pieces, cnt, c_smem, c_desc,
                                      pid_m * BLOCK_M, pid_n * BLOCK_N, True)
    for tile in range(sk_tiles + gl.program_id(0), num_pid_m * num_pid_n, G):  # whole tiles
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        if BLOCK_N_LO > 0:  # two column parts (whole tiles only: the config checks STREAM_K == 0)
            acc2_layout: gl.constexpr = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N_LO, 16])
            acc, acc2 = _mma_piece_2(a_bufs, b_bufs, b2_bufs, ready, empty, step, k_tiles, acc_layout, acc2_layout,
                                     BLOCK_M, BN_HI, BLOCK_N_LO, STAGES, num_warps)
            _store_tile(acc, c_smem, c_desc, pid_m * BLOCK_M, pid_n * BLOCK_N)  # (waits for both parts' stores)
            tma_store_tile(acc2, c2_smem, c2_desc, pid_m * BLOCK_M, pid_n * BLOCK_N + BN_HI)
        else:
            acc = _mma_piece(a_bufs, b_bufs, ready, empty, step, k_tiles, acc_layout, ROWS, BLOCK_N, STAGES,
                             num_warps)
            _store_tile(acc, c_smem, c_desc, pid_m * BLOCK_M + ROW0, pid_n * BLOCK_N)
        step += k_tiles
    tma.store_wait(pendings=0)


# ---------------------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit(do_not_specialize=["M"])  # one build for every M of a config
def gemm_persistent_kernel(
    # TMA descriptors: A [M, K] fp16 in its row parts (``m_parts(BLOCK_M)``: blocks [hi, BLOCK_K] and [lo, BLOCK_K]);
    # B [N, K] fp16 in its column parts (``m_parts(BLOCK_N)``: blocks [hi, BLOCK_K] and [lo, BLOCK_K]); C [M, N]
    # fp16 in the parts of the split dimension (blocks [BLOCK_M, hi] and [BLOCK_M, lo] of N, or [hi, BLOCK_N] and
    # [lo, BLOCK_N] of M). A one-part dimension's second descriptor is never read.
    a_desc, a2_desc, b_desc, b2_desc, c_desc, c2_desc,
    # stream-K scratch: fp32 partial tiles [max pieces, stream-K tiles, BLOCK_M * BLOCK_N] and int32 arrival
    # counters [stream-K tiles], 0 between launches (never read without a split tile)
    ws_ptr, cnt_ptr,
    M, N, K,
    BLOCK_M: gl.constexpr, BLOCK_M_LO: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_N_LO: gl.constexpr,
    BLOCK_K: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, STREAM_K: gl.constexpr,
    num_warps: gl.constexpr,
):
    gl.static_assert(((BLOCK_N_LO == 0) & (BLOCK_M_LO == 0)) | (STREAM_K == 0), "two-part tiles run whole tiles only")
    gl.static_assert((BLOCK_N_LO == 0) | (BLOCK_M_LO == 0), "one of the two dimensions in parts")
    a_bufs, b_bufs, c_smem, ready, empty = ws_shared(a_desc, b_desc, c_desc, STAGES, 2 if BLOCK_M_LO > 0 else 1)
    a2_bufs = a_bufs  # a one-part tile's stand-ins: never read
    b2_bufs = b_bufs
    c2_smem = c_smem
    if BLOCK_N_LO > 0:
        b2_bufs = gl.allocate_shared_memory(b2_desc.dtype, [STAGES, BLOCK_N_LO, BLOCK_K], b2_desc.layout)
        c2_smem = gl.allocate_shared_memory(c2_desc.dtype, [BLOCK_M, BLOCK_N_LO], c2_desc.layout)
    if BLOCK_M_LO > 0:
        a2_bufs = gl.allocate_shared_memory(a2_desc.dtype, [STAGES, BLOCK_M_LO, BLOCK_K], a2_desc.layout)
        c2_smem = gl.allocate_shared_memory(c2_desc.dtype, [BLOCK_M_LO, BLOCK_N], c2_desc.layout)
    ROWS: gl.constexpr = BLOCK_M - BLOCK_M_LO
    # (each call spells its partitions' arguments out: Triton 3.6's warp_specialize takes neither a JIT function
    # nor its arguments through a tuple variable)
    if BLOCK_M_LO > 0:  # the low row part in a worker partition of its own warpgroup(s), releasing slots too
        gl.warp_specialize(
            [(_consumer, (a_bufs, b_bufs, b2_bufs, ready, empty, c_smem, c2_smem, c_desc, c2_desc, ws_ptr, cnt_ptr, M,
                          N, K, BLOCK_M, BLOCK_N, BLOCK_N_LO, BLOCK_K, STAGES, GROUP_M, STREAM_K, num_warps, ROWS, 0)),
             (_producer, (a_desc, a2_desc, b_desc, b2_desc, a_bufs, a2_bufs, b_bufs, b2_bufs, ready, empty, M, N, K,
                          BLOCK_M, BLOCK_M_LO, BLOCK_N, BLOCK_N_LO, BLOCK_K, STAGES, GROUP_M, STREAM_K)),
             (_consumer, (a2_bufs, b_bufs, b2_bufs, ready, empty, c2_smem, c2_smem, c2_desc, c2_desc, ws_ptr,
                          cnt_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_N_LO, BLOCK_K, STAGES, GROUP_M, STREAM_K,
                          BLOCK_M_LO // 16, BLOCK_M_LO, ROWS))],
            [1, BLOCK_M_LO // 16], [40, 152])
    else:
        gl.warp_specialize(
            [(_consumer, (a_bufs, b_bufs, b2_bufs, ready, empty, c_smem, c2_smem, c_desc, c2_desc, ws_ptr, cnt_ptr, M,
                          N, K, BLOCK_M, BLOCK_N, BLOCK_N_LO, BLOCK_K, STAGES, GROUP_M, STREAM_K, num_warps, ROWS, 0)),
             (_producer, (a_desc, a2_desc, b_desc, b2_desc, a_bufs, a2_bufs, b_bufs, b2_bufs, ready, empty, M, N, K,
                          BLOCK_M, BLOCK_M_LO, BLOCK_N, BLOCK_N_LO, BLOCK_K, STAGES, GROUP_M, STREAM_K))],
            [1], [40])
    invalidate_ring(ready, empty, STAGES)
