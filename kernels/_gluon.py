"""Gluon helpers shared by the kernels of gemm_fp16, sparse_gemm_fp4_fp8 and nvfp4_linear: the c^T tile's store layout
and its epilogue, a plain store or the deterministic split-K reduction, with an optional epilogue scale; the wait of a
programmatic dependent launch; the widths of a two-part swap-AB tile (``m_parts``); the shared memory, grouped tile
walk, TMA producer partition, slot release and TMA-store epilogue of a persistent, warp-specialized C = A @ B^T
(sparse_gemm_fp4_fp8's expand path, gemm_fp16's persistent path).

Split-K: each K slice writes its fp32 partial tile to a workspace and bumps the tile's arrival counter (atomic,
acq_rel, gpu scope); the LAST to arrive sums the partials in the fixed order s = 0, 1, ..., SPLIT_K - 1 (fp32, RN),
multiplies by the scale (HAS_SCALE; fp32 RN), rounds once to c's dtype (RNE) and resets the counter for the next
launch. Bitwise reproducible run to run.

Split-K in a thread-block cluster (CLUSTER > 1): the K slices of a tile are the CLUSTER CTAs of one cluster (the
launch's ``num_ctas``; ``gl.program_id`` then numbers clusters, ``cluster_rank`` is the slice). ``cluster_sum``
sends the partials of ranks 1 .. CLUSTER - 1 into rank 0's shared memory (``st.async``, counted on an mbarrier
there), rank 0 adds them in the same fixed order s = 0, 1, ... and stores: the bits equal the workspace
reduction's, without the workspace round trips and without a cluster barrier at the end. Triton 3.6's Gluon has
no cross-CTA operation (``gl.convert_layout`` / ``gl.sum`` over a cluster-spread layout fail to build), so the
exchange is inline PTX over a buffer it declares in static shared memory (``cluster_sum_start``; the host lets
such a kernel use more than 48 KiB of static + dynamic shared memory, ``_runtime.Launch``); in such a kernel
every register layout holds the whole tile in each CTA (``in_cluster``) and the CTAs share nothing else.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from ._runtime import m_parts  # the two-part tile widths (re-exported for the kernels' host code)
from ._sm90 import SM90_MAX_SHARED_BYTES

__all__ = ["STATIC_SHARED_MAX", "check_cluster", "cluster_rank", "cluster_sum", "cluster_sum_start", "exchange_bytes",
           "grouped_tile", "in_cluster", "k_slice", "m_parts", "part_layouts", "release_slot", "store_layout",
           "store_or_reduce", "tma_ring_producer", "tma_store_tile", "wait_primary", "workspace_elements", "ws_shared",
           "ring_barriers", "invalidate_ring"]


@gluon.jit
def wait_primary():
    """griddepcontrol.wait: block until the grid this one depends on under programmatic dependent launch has
    completed and its writes are visible; a no-op in a grid launched without it."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


def workspace_elements(tiles: int, split_k: int, block_n: int, block_m: int) -> int:
    """fp32 elements of ``store_or_reduce``'s split-K workspace for ``tiles`` c tiles (0 when split_k == 1)."""
    return tiles * split_k * block_n * block_m if split_k > 1 else 0


@gluon.constexpr_function
def store_layout(BLOCK_N, BLOCK_M, num_warps, CLUSTER=1):
    """Blocked layout of a [BLOCK_N, BLOCK_M] c^T tile with N fastest: 8 consecutive N per thread (16 bytes of a
    16-bit c, 32 of fp32), so that a warp writes whole rows of c (and of the workspace) with wide stores. CLUSTER:
    ``in_cluster``'s form for a kernel launched in clusters of that many CTAs."""
    tpw_n = min(32, BLOCK_N // 8)
    return in_cluster(gl.BlockedLayout([8, 1], [tpw_n, 32 // tpw_n], [1, num_warps], [0, 1]), CLUSTER)


def part_layouts(block_shape, axis: int, dtype=gl.float16) -> tuple:
    """The default NVMMA shared-memory layouts (the TMA destination and wgmma operand layout) of a tile's two parts
    along block axis ``axis`` (``m_parts``: the high part, then the rest), as ``_runtime.Desc.parts`` splits its
    descriptors; a one-part tile's second is its first (never read). Callable on the host."""
    hi, lo = m_parts(block_shape[axis])

    def layout(width):
        shape = list(block_shape)
        shape[axis] = width
        return gl.NVMMASharedLayout.get_default_for(shape, dtype)

    first = layout(hi)
    return first, (layout(lo) if lo else first)


@gluon.constexpr_function
def in_cluster(layout, CLUSTER):
    """``layout`` for a kernel launched in clusters of CLUSTER CTAs (a power of two), each CTA holding the whole
    tensor (every CTA-tiling basis zero): Triton requires every register layout of such a kernel, and every shared
    layout loaded into one, to say how the cluster's CTAs share a tensor. ``layout`` itself when CLUSTER is 1.
    Takes blocked, linear, NVMMA-distributed, NVMMA-shared and swizzled shared layouts (a dot operand or slice
    layout follows its parent's; an ``MBarrierLayout`` comes back as the swizzled layout it is). A shared buffer
    the kernel slices (``.slice``) keeps its layout as it is: triton 3.6 refuses to slice one with CTA bases
    ("non-trivial block dimension not supported")."""
    if CLUSTER == 1:
        return layout
    L = layout
    bases = CLUSTER.bit_length() - 1
    if isinstance(L, gl.BlockedLayout):
        return gl.BlockedLayout(L.size_per_thread, L.threads_per_warp, L.warps_per_cta, L.order,
                                [[0] * len(L.order)] * bases)
    if isinstance(L, gl.NVMMADistributedLayout):
        return gl.NVMMADistributedLayout(L.version, L.warps_per_cta, L.instr_shape,
                                         [[0] * len(L.warps_per_cta)] * bases)
    if isinstance(L, gl.DistributedLinearLayout):
        return gl.DistributedLinearLayout(L.reg_bases, L.lane_bases, L.warp_bases, [[0] * L.rank] * bases, L.shape)
    if isinstance(L, gl.NVMMASharedLayout):
        return gl.NVMMASharedLayout(L.swizzle_byte_width, L.element_bitwidth, L.rank, L.transposed, L.fp4_padded,
                                    [[0] * L.rank] * bases)
    if isinstance(L, gl.SwizzledSharedLayout):  # MBarrierLayout too
        return gl.SwizzledSharedLayout(L.vec, L.per_phase, L.max_phase, L.order, [[0] * len(L.order)] * bases)
    raise TypeError(f"in_cluster: unsupported layout {L!r}")


@gluon.jit
def cluster_rank():
    """This CTA's rank in its thread-block cluster (``%cluster_ctarank``; 0 in a launch without clusters)."""
    return gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r", [], dtype=gl.int32, is_pure=True, pack=1)


@gluon.constexpr_function
def exchange_bytes(numel, cluster):
    """Static shared memory a kernel using ``cluster_sum`` on tiles of ``numel`` fp32 values declares: a slot per
    rank 1 .. cluster - 1 and the mbarrier, rounded up to whole KiB so that the dynamic shared memory after it
    keeps the 1024-byte alignment the swizzled TMA destinations need (0 without a cluster). Callable on the host."""
    return -(-(4 * numel * (cluster - 1) + 8) // 1024) * 1024 if cluster > 1 else 0


STATIC_SHARED_MAX = 48 * 1024  # ptxas caps a kernel's static shared memory at 48 KiB


def check_cluster(config, numel: int, shared_bytes: int | None = None) -> None:
    """A config's CLUSTER rule: SPLIT_K 2, 4 or 8 (a portable cluster of a power-of-two size), an exchange buffer
    for its tile of ``numel`` fp32 values within the 48 KiB of static shared memory a kernel may declare and, when
    given, the config's ``shared_bytes`` (rings and exchange buffer) within the 227 KiB of an sm_90 CTA.

    Raises:
        ValueError: naming SPLIT_K, the buffer's size or the shared memory."""
    if config.SPLIT_K not in (2, 4, 8):
        raise ValueError(f"SPLIT_K={config.SPLIT_K}: CLUSTER=True needs 2, 4 or 8 (the cluster's CTAs)")
    size = exchange_bytes(numel, config.SPLIT_K)
    if size > STATIC_SHARED_MAX:
        raise ValueError(f"{config}: CLUSTER=True needs a {size}-byte exchange buffer ((SPLIT_K - 1) tiles of fp32), "
                         f"more than the {STATIC_SHARED_MAX} bytes of static shared memory a kernel may declare")
    if shared_bytes is not None and shared_bytes > SM90_MAX_SHARED_BYTES:
        raise ValueError(f"{config}: {shared_bytes} bytes of shared memory with the exchange buffer (> 227 KiB)")


@gluon.constexpr_function
def _cluster_start_ptx(SLOTS_BYTES, STATIC_BYTES):
    """``cluster_sum_start``'s PTX: the exchange buffer (static shared memory, at the same address in every CTA;
    its mbarrier after the slots), initialized by thread 0 of rank 0 to expect SLOTS_BYTES, the init fenced for
    the cluster, and every thread's arrival on the cluster barrier (relaxed)."""
    return "\n".join([
        f".shared .align 1024 .b8 fp4ref_cluster_xbuf[{STATIC_BYTES}];",
        "{", ".reg .pred %first;", ".reg .u32 %who, %bar;", f"mov.u32 %bar, fp4ref_cluster_xbuf+{SLOTS_BYTES};",
        "mov.u32 %who, %cluster_ctarank;", "mov.u32 $0, %tid.x;", "or.b32 %who, %who, $0;",
        "setp.eq.u32 %first, %who, 0;",
        "@%first mbarrier.init.shared::cta.b64 [%bar], 1;",
        f"@%first mbarrier.arrive.expect_tx.shared::cta.b64 _, [%bar], {SLOTS_BYTES};",
        "fence.mbarrier_init.release.cluster;", "barrier.cluster.arrive.relaxed.aligned;", "}"])


@gluon.constexpr_function
def _cluster_sum_ptx(PACK, CLUSTER, THREADS):
    """``cluster_sum``'s PTX for PACK fp32 values per thread ($0.. outputs, $PACK.. inputs). Ranks 1 .. CLUSTER - 1
    wait for the cluster barrier of ``cluster_sum_start`` (every CTA of the cluster is running and rank 0's
    mbarrier is initialized) and send their values into their slot of rank 0's buffer with ``st.async``, which
    counts the bytes on rank 0's mbarrier; rank 0 waits on that mbarrier (phase 0) and adds the slots to its own
    values in rank order (fp32 RN). Every rank returns its inputs except rank 0, which returns the sum."""
    slot = THREADS * PACK * 4
    n = PACK * (CLUSTER - 1)
    lines = ["{", ".reg .u32 %off, %addr, %rank, %bar;", ".reg .pred %lead, %done;", f".reg .f32 %x<{n}>;",
             "mov.u32 %rank, %cluster_ctarank;", "setp.eq.u32 %lead, %rank, 0;", "setp.ne.u32 %done, %rank, 0;",
             "mov.u32 %off, %tid.x;", f"mul.lo.u32 %off, %off, {PACK * 4};",
             "barrier.cluster.wait.aligned;",
             "mov.u32 %addr, fp4ref_cluster_xbuf;", f"@!%lead mad.lo.u32 %addr, %rank, {slot}, %addr;",
             f"@!%lead sub.u32 %addr, %addr, {slot};", "add.u32 %addr, %addr, %off;",
             "@!%lead mapa.shared::cluster.u32 %addr, %addr, 0;",
             f"mov.u32 %bar, fp4ref_cluster_xbuf+{slot * (CLUSTER - 1)};",
             "@!%lead mapa.shared::cluster.u32 %bar, %bar, 0;"]
    for c in range(PACK // 4):
        ins = ", ".join(f"${PACK + 4 * c + j}" for j in range(4))
        lines.append(f"@!%lead st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%addr+{16 * c}], "
                     f"{{{ins}}}, [%bar];")
    lines += [f"mov.b32 ${i}, ${PACK + i};" for i in range(PACK)]
    lines += ["fp4ref_cluster_wait:", "@%lead mbarrier.try_wait.parity.shared::cta.b64 %done, [%bar], 0;",
              "@!%done bra fp4ref_cluster_wait;"]
    for r in range(1, CLUSTER):
        for c in range(PACK // 4):
            xs = ", ".join(f"%x{(r - 1) * PACK + 4 * c + j}" for j in range(4))
            lines.append(f"@%lead ld.shared.v4.f32 {{{xs}}}, [%addr+{(r - 1) * slot + 16 * c}];")
    for r in range(1, CLUSTER):
        lines += [f"@%lead add.rn.f32 ${i}, ${i}, %x{(r - 1) * PACK + i};" for i in range(PACK)]
    lines.append("}")
    return "\n".join(lines)


@gluon.constexpr_function
def _cluster_sum_pack(numel, num_warps):
    """Values per thread of a ``cluster_sum`` tile: a multiple of 4 (whole 16-byte stores)."""
    per_thread = numel // (32 * num_warps)
    if per_thread < 4 or per_thread % 4 or per_thread * 32 * num_warps != numel:
        raise ValueError(f"cluster_sum: {numel} values over {32 * num_warps} threads; expected a multiple of 4 each")
    return per_thread


@gluon.constexpr_function
def _cluster_sum_constraints(PACK):
    return ",".join(["=f"] * PACK + ["f"] * PACK)


@gluon.jit
def cluster_sum_start(BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, CLUSTER: gl.constexpr):
    """Set up ``cluster_sum`` for a [BLOCK_N, BLOCK_M] fp32 tile: call once, at the start of the kernel, in every
    thread (it declares the exchange buffer, ``exchange_bytes``, and arrives on the cluster barrier that
    ``cluster_sum`` waits for)."""
    gl.inline_asm_elementwise(_cluster_start_ptx(4 * BLOCK_N * BLOCK_M * (CLUSTER - 1),
                                                 exchange_bytes(BLOCK_N * BLOCK_M, CLUSTER)),
                              "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def k_slice(AXIS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, CLUSTER: gl.constexpr):
    """This program's K slice: its rank in the cluster when CLUSTER > 1 (then the grid's ids number clusters, and
    ``cluster_sum_start`` runs for the [BLOCK_N, BLOCK_M] tile), else ``gl.program_id(AXIS)``."""
    if CLUSTER > 1:
        pid_k = cluster_rank()
        cluster_sum_start(BLOCK_N, BLOCK_M, CLUSTER)
    else:
        pid_k = gl.program_id(AXIS)
    return pid_k


@gluon.jit
def cluster_sum(part, CLUSTER: gl.constexpr, num_warps: gl.constexpr):
    """The fp32 tile ``part`` summed over the CLUSTER CTAs of this CTA's cluster in rank order ((p0 + p1) + p2)
    + ... (fp32 RN), in rank 0; the other ranks get their own ``part`` back. Call once per kernel, after
    ``cluster_sum_start``, in every CTA of the cluster with the same tile shape and layout, one whose elements each
    sit in exactly one thread (a wgmma accumulator's ``NVMMADistributedLayout``), so that a thread's values in
    every CTA are the same elements. Ranks other than 0 may exit as soon as it returns: ``st.async``'s bytes are
    counted on rank 0's mbarrier, which rank 0 waits for."""
    PACK: gl.constexpr = _cluster_sum_pack(part.numel, num_warps)
    return gl.inline_asm_elementwise(_cluster_sum_ptx(PACK, CLUSTER, 32 * num_warps), _cluster_sum_constraints(PACK),
                                     [part], dtype=gl.float32, is_pure=False, pack=PACK)


@gluon.constexpr_function
def _reduce_cols(BLOCK_N, BLOCK_M, SPLIT_K, num_warps):
    """Columns per reduction chunk: SPLIT_K loaded partial chunks stay within ~64 registers per thread."""
    rc = 8
    while rc * 2 <= BLOCK_M and SPLIT_K * BLOCK_N * rc * 2 <= 64 * 32 * num_warps:
        rc *= 2
    return rc


@gluon.jit
def store_or_reduce(part, c_ptr, ws_ptr, cnt_ptr, M, N, stride_cm, off_n, off_m, m_own, tile, pid_k, scale,
                    BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, SPLIT_K: gl.constexpr, HAS_SCALE: gl.constexpr,
                    num_warps: gl.constexpr, CLUSTER: gl.constexpr = 1):
    """Write the fp32 c^T tile ``part`` [BLOCK_N, BLOCK_M] (``store_layout``) of K slice ``pid_k`` to c[off_m +
    m, off_n + n] (rows m_own <= off_m + m < M, columns n < N; row stride ``stride_cm``): directly when
    SPLIT_K == 1, else through the workspace ``ws_ptr`` (fp32 [tiles, SPLIT_K, BLOCK_M, BLOCK_N],
    ``workspace_elements``) and ``cnt_ptr[tile]`` (module docstring). With HAS_SCALE the full sum is multiplied by
    the fp32 ``scale`` before the one rounding to c's dtype (``scale`` is not read otherwise). Rows outside
    [m_own, M) (padding, or rows another tile stores) are written neither to c nor to the workspace; the
    reduction loads their unwritten workspace rows with the rest of a chunk and drops them. CLUSTER > 1: ``part``
    is a ``cluster_sum`` of the SPLIT_K slices, stored directly (no workspace) by the cluster's rank 0 only."""
    st_layout: gl.constexpr = store_layout(BLOCK_N, BLOCK_M, num_warps, CLUSTER)
    rn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
    rm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    # 64-bit row offsets: M x N may exceed 2^31 elements (nvfp4_linear at large M)
    c_ptrs = c_ptr + gl.expand_dims(rm, 0).to(gl.int64) * stride_cm + gl.expand_dims(off_n + rn, 1)
    c_mask = gl.expand_dims((rm >= m_own) & (rm < M), 0) & gl.expand_dims(off_n + rn < N, 1)
    if CLUSTER > 1:
        c_mask = c_mask & (cluster_rank() == 0)
    if SPLIT_K == 1 or CLUSTER > 1:
        if HAS_SCALE:
            part = part * scale  # fp32 RN
        gl.store(c_ptrs, part.to(c_ptr.dtype.element_ty), mask=c_mask)
    else:
        TILE: gl.constexpr = BLOCK_M * BLOCK_N
        offs_t = gl.expand_dims(rm - off_m, 0) * BLOCK_N + gl.expand_dims(rn, 1)
        ws_tile = ws_ptr + tile * (SPLIT_K * TILE)
        gl.store(ws_tile + pid_k * TILE + offs_t, part, mask=c_mask, cache_modifier=".cg")
        gl.thread_barrier()  # every thread's partial stores precede the release below
        arrived = gl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            # column chunks of RC; within a chunk the SPLIT_K loads are unrolled so that they are all in flight
            RC: gl.constexpr = _reduce_cols(BLOCK_N, BLOCK_M, SPLIT_K, num_warps)
            r_layout: gl.constexpr = store_layout(BLOCK_N, RC, num_warps)
            r_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, r_layout))
            r_c = gl.arange(0, RC, layout=gl.SliceLayout(0, r_layout))
            offs_r = gl.expand_dims(r_c, 0) * BLOCK_N + gl.expand_dims(r_n, 1)
            n_ok = gl.expand_dims(off_n + r_n < N, 1)
            for m0 in range(0, gl.minimum(M - off_m, BLOCK_M), RC):
                src = ws_tile + m0 * BLOCK_N + offs_r
                total = gl.load(src, cache_modifier=".cg")
                for s in gl.static_range(1, SPLIT_K):
                    total = total + gl.load(src + s * TILE, cache_modifier=".cg")
                if HAS_SCALE:
                    total = total * scale  # fp32 RN, after the fixed-order sum
                m_idx = off_m + m0 + r_c
                dst = c_ptr + gl.expand_dims(m_idx, 0).to(gl.int64) * stride_cm + gl.expand_dims(off_n + r_n, 1)
                m_ok = gl.expand_dims((m_idx >= m_own) & (m_idx < M), 0)
                gl.store(dst, total.to(c_ptr.dtype.element_ty), mask=m_ok & n_ok)
            gl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next launch


# ---------------------------------------------------------------------------------------------------------------
# Persistent, warp-specialized GEMMs: grouped tile walk, TMA producer partition, slot release
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit
def grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """(pid_m, pid_n) of linear tile ``tile`` in grouped order: GROUP_M row tiles, then the next N column (row
    tiles that share B's column tiles run close together, so B stays in L2)."""
    num_in_group = GROUP_M * num_pid_n
    first_m = (tile // num_in_group) * GROUP_M
    group_size = gl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (tile % num_in_group) % group_size, (tile % num_in_group) // group_size


@gluon.jit
def ring_barriers(STAGES: gl.constexpr, EMPTY_ARRIVALS: gl.constexpr = 1):
    """The "ready" and "empty" mbarriers of a STAGES-deep TMA ring (count 1, and EMPTY_ARRIVALS: the consumer
    partitions that each release a slot), initialized and fenced."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=EMPTY_ARRIVALS)
    fence_async_shared()
    return ready, empty


@gluon.jit
def invalidate_ring(ready, empty, STAGES: gl.constexpr):
    """Invalidate ``ring_barriers``' barriers once the partitions have joined."""
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))


@gluon.jit
def ws_shared(a_desc, b_desc, c_desc, STAGES: gl.constexpr, EMPTY_ARRIVALS: gl.constexpr = 1):
    """Shared memory of a persistent, warp-specialized C = A @ B^T: STAGES-deep rings of A and B tiles (the
    descriptors' blocks and layouts), the C staging tile, and the ring's "ready" and "empty" barriers
    (``ring_barriers``). Returns (a_bufs, b_bufs, c_smem, ready, empty)."""
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, a_desc.block_shape[0], a_desc.block_shape[1]],
                                       a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, b_desc.block_shape[0], b_desc.block_shape[1]],
                                       b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [c_desc.block_shape[0], c_desc.block_shape[1]], c_desc.layout)
    ready, empty = ring_barriers(STAGES, EMPTY_ARRIVALS)
    return a_bufs, b_bufs, c_smem, ready, empty


@gluon.jit
def tma_ring_producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, num_pid_m, num_pid_n, k_steps,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                      GROUP_M: gl.constexpr, PDL: gl.constexpr):
    """Producer partition (1 warp) of C = A @ B^T: for every K step of every tile this CTA owns (tiles pid, pid +
    programs, ... in ``grouped_tile`` order), wait until its ring slot is empty, then TMA A[off_m:+BLOCK_M,
    k:+BLOCK_K] and B[off_n:+BLOCK_N, k:+BLOCK_K] into it; ``ready`` barriers carry the bytes, the consumers
    arrive on ``empty`` (``release_slot``). The first pass over the ring waits on parity 1 of fresh barriers,
    which counts as complete. PDL: launched after a grid that writes A (programmatic dependent launch), the B
    tiles of the first tile's first min(STAGES, k_steps) steps go out before griddepcontrol.wait, every A tile
    after it."""
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    pid = gl.program_id(0)
    head = 0  # K steps of the first tile already issued
    if PDL:
        pid_m, pid_n = grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M)
        for j in gl.static_range(STAGES):
            mbarrier.expect(ready.index(j), nbytes, pred=j < k_steps)
            tma.async_copy_global_to_shared(b_desc, [pid_n * BLOCK_N, j * BLOCK_K], ready.index(j), b_bufs.index(j),
                                            pred=j < k_steps)
        wait_primary()
        for j in gl.static_range(STAGES):
            tma.async_copy_global_to_shared(a_desc, [pid_m * BLOCK_M, j * BLOCK_K], ready.index(j), a_bufs.index(j),
                                            pred=j < k_steps)
        head = gl.minimum(k_steps, STAGES)
    step = head
    for tile in range(pid, num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        for kk in range(head if tile == pid else 0, k_steps):
            s = step % STAGES
            mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BLOCK_M, kk * BLOCK_K], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [pid_n * BLOCK_N, kk * BLOCK_K], bar, b_bufs.index(s))
            step += 1


@gluon.jit
def release_slot(empty, step, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """Consumer side: hand ring step ``step``'s slot back to ``tma_ring_producer`` once the wgmma reading it
    retired (an mbarrier arrive is one thread's: with two warpgroups, both retire it first)."""
    if num_warps > 4:
        gl.thread_barrier()
    mbarrier.arrive(empty.index(step % STAGES), count=1)


@gluon.jit
def tma_store_tile(tile, c_smem, c_desc, off_m, off_n):
    """Round the fp32 tile [BLOCK_M, BLOCK_N] once to c's dtype (RNE) into ``c_smem`` and TMA-store it at
    c[off_m, off_n] (rows and columns past c's shape are clipped). The caller has waited for the previous store
    from ``c_smem`` (``tma.store_wait`` and a barrier); this store is waited for by the next one, or at the end."""
    c_smem.store(tile.to(c_desc.dtype))
    fence_async_shared()
    gl.thread_barrier()  # every warp's part of the tile is in c_smem before the one-thread TMA store
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
