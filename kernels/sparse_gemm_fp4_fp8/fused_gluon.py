"""The fused Gluon kernel of sparse_gemm_fp4_fp8 (``FusedWSConfig``, sm_90, opt-in): one persistent,
warp-specialized launch that decodes A from (vals, meta) per tile into shared memory, with no dense copy of A in
global memory.

    c[M, N] (bf16) = decode(vals, meta)[M, K] @ b[N, K]^T, promoted into fp32 every 128 K-elements, one RNE rounding

* persistent: ``num_programs`` CTAs walk the c tiles [BLOCK_M, BLOCK_N] in grouped order (GROUP_M row tiles
  share b tiles in L2), every CTA the same walk from its own start.
* three partitions per CTA and two rings:
  - a 1-warp TMA producer: for each 128-K step of each tile, the A bytes (vals and meta [BLOCK_M, 32]; their own
    "raw ready" barrier, so they land first) and the b tile [BLOCK_N, 128] ("b ready") into a slot of the SB-deep
    b ring ("empty" hands the slot back);
  - a 4-warp decoder: as soon as a step's A bytes land, they become the dense E4M3FN tile [BLOCK_M, 128], in the
    wgmma's 128-byte swizzled layout, in a slot of the SA-deep decoded-A ring ("decoded"; "a empty" hands it
    back). Every group of 4 K-columns becomes the word of its four E4M3FN bytes (v0 at idx0 plus v1 at idx1, a
    duplicate index holding the exact sum, zeros +0) by ~23 packed integer / f16x2 instructions (``_group_ptx``);
  - the default partition (BLOCK_N / 128 warpgroups side by side along BLOCK_N, sharing the step's A tile): waits,
    issues wgmma and promotes. One decoded A tile serves all BLOCK_N columns: A is decoded N / BLOCK_N times.
* promotion that overlaps the tensor cores (as expand_gluon.py): each step's wgmma goes into a fresh accumulator;
  after the NEXT step's wgmma is issued, ``warpgroup_mma_wait(1)`` retires this one, its result is added into the
  fp32 accumulator and its slots are handed back. The fresh accumulators alternate between two register sets.
* epilogue: the fp32 tile rounded once to bf16 (RNE); with TMA_STORE into shared memory and out by TMA (rows >= M
  and columns >= N clipped by the descriptor), overlapping the next tile's main loop, else stored from registers.
* NaN policy (package docstring): a dense MMA makes a NaN byte of b poison its whole column, read or not. A tile
  whose fp32 accumulator holds a NaN is recomputed on CUDA cores from the selected positions only (gluon.py's
  ``_selected_sum``) and stored directly.

Numerics: ``hopper_fp8_wgmma_promote(128)``, as every fp8 path of the package; the same bits as the expand path.
Speed: below the table's paths on the H200 (the decoder sets the pace; docs/benchmarks.md). There is no CPU
interpreter for Gluon: CPU tests build every config for sm_90 (kernels/_sm90.py), GPU tests run it.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma

from .._gluon import grouped_tile
from .expand_gluon import expand_gluon_layouts, promoted_tiles
from .gluon import shared_layouts

__all__ = ["BG", "BK", "fused_ws_constexprs", "fused_ws_layouts", "sparse_fused_ws_kernel"]

BK = gl.constexpr(128)  # K per ring step = the promotion interval
BG = gl.constexpr(32)  # groups of 4 K-columns per step
DECODER_WARPS = gl.constexpr(4)
DECODER_REGS = gl.constexpr(64)  # registers per decoder thread (setmaxnreg); the producer warp takes 24


def fused_ws_layouts(config):
    """Shared-memory layouts: the b [block_n, 128] and decoded A [block_m, 128] E4M3FN tiles (128-byte swizzle,
    the wgmma operand layout), the vals / meta byte tiles [block_m, 32] (no swizzle) and the c tile [block_m,
    block_n] bf16 (the TMA store's source)."""
    fp8, raw = shared_layouts()  # the swap-AB kernel's operand and byte-tile layouts
    _, c = expand_gluon_layouts(config)  # the expand GEMM's c tile layout (block_m x block_n bf16)
    return fp8, raw, c


def fused_ws_constexprs(config) -> dict:
    """``sparse_fused_ws_kernel``'s constexpr arguments for ``config``, in parameter order."""
    return dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, SB=config.b_stages, SA=config.a_stages,
                GROUP_M=config.group_m, TMA_STORE=config.tma_store, num_warps=config.num_warps)


# ---------------------------------------------------------------------------------------------------------------
# Decode: one group (vals byte v, meta nibble t) -> the word of its four E4M3FN bytes
# ---------------------------------------------------------------------------------------------------------------
def _group_ptx(j: int) -> str:
    """PTX for group j of 4 packed in $4 (vals bytes) and $5 (meta bytes) -> word $j.

    E2M1 -> f16 for both codes at once: the bits s e1 e0 m go to f16 bits 15 and 11:9, and the product with
    2^14 (the exponent biases differ by 14) is exact, the subnormal 0.5 included; the fma's + 0 turns -0 into +0.
    One packed conversion gives [e4m3(v0), e4m3(v1)]; the sum v0 + v1 (exact in f16 and in E4M3FN) goes through
    the upper half of a second one as [0, e4m3(v0 + v1)]. A byte permute then picks byte 0 (v0) for position
    idx0, byte 1 (v1) for idx1 and a zero elsewhere; when idx0 == idx1 its selector nibble comes out as 5, which
    picks the sum (selector = 0x4444 ^ (4 << 4 idx0) ^ (5 << 4 idx1))."""
    return f"""{{
    .reg .b32 v, t, u, a, b, x, h, q, r, e, w, i0, i1, s0, s1, k;
    .reg .b16 e16, q16;
    bfe.u32 v, $4, {8 * j}, 8;
    bfe.u32 t, $5, {8 * j}, 4;
    mul.lo.u32 u, v, 4097;
    shl.b32 a, u, 9;
    shl.b32 b, u, 12;
    and.b32 a, a, 0x0E000E00;
    and.b32 b, b, 0x80008000;
    or.b32 x, a, b;
    mov.b32 k, 0x74007400;
    mov.b32 q, 0;
    fma.rn.f16x2 h, x, k, q;
    cvt.rn.satfinite.e4m3x2.f16x2 e16, h;
    shl.b32 q, h, 16;
    and.b32 r, h, 0xFFFF0000;
    add.rn.f16x2 q, q, r;
    cvt.rn.satfinite.e4m3x2.f16x2 q16, q;
    shl.b32 i0, t, 2;
    and.b32 i0, i0, 12;
    and.b32 i1, t, 12;
    mov.b32 s0, 4;
    mov.b32 s1, 5;
    shl.b32 s0, s0, i0;
    shl.b32 s1, s1, i1;
    xor.b32 k, s0, s1;
    xor.b32 k, k, 0x4444;
    cvt.u32.u16 e, e16;
    cvt.u32.u16 w, q16;
    prmt.b32 ${j}, e, w, k;
}}"""


_WORDS_PTX = gl.constexpr("\n".join(_group_ptx(j) for j in range(4)))


@gluon.jit
def _words_ptx(v, t):
    """int32 words of int8 vals / meta byte tensors (4 consecutive groups per thread: pack=4)."""
    return gl.inline_asm_elementwise(_WORDS_PTX, "=r,=r,=r,=r,r,r", [v, t], dtype=gl.int32, is_pure=True, pack=4)


# ---------------------------------------------------------------------------------------------------------------
# Partitions
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit
def _producer(v_desc, t_desc, b_desc, v_bufs, t_bufs, b_bufs, raw_ready, b_ready, empty, num_pid_m, num_pid_n,
              k_steps, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SB: gl.constexpr, GROUP_M: gl.constexpr):
    """1 warp: for every step of every tile of this CTA, wait for its slot of the b ring to be empty, then TMA
    the A bytes (``raw_ready``, small: they land first) and the b tile (``b_ready``) into it. The first pass
    waits on parity 1 of fresh barriers, which counts as complete."""
    raw_bytes: gl.constexpr = 2 * v_desc.block_type.nbytes
    step = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        for kk in range(k_steps):
            s = step % SB
            mbarrier.wait(empty.index(s), ((step // SB) & 1) ^ 1)
            mbarrier.expect(raw_ready.index(s), raw_bytes)
            tma.async_copy_global_to_shared(v_desc, [pid_m * BLOCK_M, kk * BG], raw_ready.index(s), v_bufs.index(s))
            tma.async_copy_global_to_shared(t_desc, [pid_m * BLOCK_M, kk * BG], raw_ready.index(s), t_bufs.index(s))
            mbarrier.expect(b_ready.index(s), b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(b_desc, [pid_n * BLOCK_N, kk * BK], b_ready.index(s), b_bufs.index(s))
            step += 1


@gluon.jit
def _decoder(v_bufs, t_bufs, a_bufs, raw_ready, decoded, a_empty, num_pid_m, num_pid_n, k_steps,
             BLOCK_M: gl.constexpr, SB: gl.constexpr, SA: gl.constexpr):
    """4 warps: each step's A bytes (``raw_ready``; the b tile of the step may still be landing) into a free
    slot of the decoded-A ring (``a_empty``), then ``decoded``. The decode is off the b ring's critical path:
    it overlaps the b tile's TMA and the wgmma of earlier steps."""
    # a thread decodes 4 consecutive groups of a row: 4-byte shared loads, one 16-byte store of 16 E4M3FN bytes
    dec_layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [DECODER_WARPS, 1], [1, 0])
    # the tile as int32 words [BLOCK_M, 32]: the 128-byte swizzle puts 16-byte chunk c of row r at c ^ (r % 8)
    words_smem: gl.constexpr = gl.SwizzledSharedLayout(4, 1, 8, [1, 0])
    n_tiles = gl.cdiv(num_pid_m * num_pid_n - gl.program_id(0), gl.num_programs(0))
    for step in range(n_tiles * k_steps):
        s = step % SB
        j = step % SA
        mbarrier.wait(raw_ready.index(s), (step // SB) & 1)
        v = v_bufs.index(s).load(dec_layout)
        t = t_bufs.index(s).load(dec_layout)
        words = _words_ptx(v, t)
        mbarrier.wait(a_empty.index(j), ((step // SA) & 1) ^ 1)
        a_bufs.index(j)._reinterpret(gl.int32, [BLOCK_M, BG], words_smem).store(words)
        fence_async_shared()  # the generic-proxy stores before the async-proxy (wgmma) reads
        gl.thread_barrier()  # every decoder warp's rows are stored before the one-thread arrive
        mbarrier.arrive(decoded.index(j), count=1)


@gluon.jit
def _issue(ring, step, into):
    """Wait for step ``step`` (b landed, A decoded) and issue its wgmma into ``into``'s registers."""
    a_bufs, b_bufs, b_ready, decoded, empty, a_empty, SB, SA = ring
    s = step % SB
    j = step % SA
    mbarrier.wait(b_ready.index(s), (step // SB) & 1)
    mbarrier.wait(decoded.index(j), (step // SA) & 1)
    return warpgroup_mma(a_bufs.index(j), b_bufs.index(s).permute((1, 0)), into, use_acc=False, is_async=True)


@gluon.jit
def _release(ring, step, num_warps: gl.constexpr):
    """Step ``step``'s wgmma retired (in every consumer warpgroup): hand its b slot (with its A bytes) to the
    producer and its decoded-A slot to the decoder."""
    a_bufs, b_bufs, b_ready, decoded, empty, a_empty, SB, SA = ring
    if num_warps > 4:
        gl.thread_barrier()
    mbarrier.arrive(empty.index(step % SB), count=1)
    mbarrier.arrive(a_empty.index(step % SA), count=1)


@gluon.jit
def _consumer(a_bufs, b_bufs, b_ready, decoded, empty, a_empty, c_smem, c_desc, b_ptr, vals_ptr, meta_ptr, c_ptr,
              M, N, num_pid_m, num_pid_n, k_steps, stride_bn, stride_am, stride_cm,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SB: gl.constexpr, SA: gl.constexpr,
              GROUP_M: gl.constexpr, TMA_STORE: gl.constexpr, num_warps: gl.constexpr):
    """Default partition: the promoted wgmma chain of each tile of this CTA (expand_gluon.py's), its NaN check,
    its epilogue."""
    WN: gl.constexpr = num_warps // 4  # warpgroups side by side along BLOCK_N
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, WN], instr_shape=[16, BLOCK_N // WN, 32])
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    ring = (a_bufs, b_bufs, b_ready, decoded, empty, a_empty, SB, SA)
    promoted_tiles(_issue, _release, ring, zero, c_smem, c_desc, b_ptr, vals_ptr, meta_ptr, c_ptr, M, N, num_pid_m,
                   num_pid_n, k_steps, stride_bn, stride_am, stride_cm, GROUP_M, TMA_STORE, num_warps)


# ---------------------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------------------
@gluon.jit(do_not_specialize=["M"])  # one build for every M of a config
def sparse_fused_ws_kernel(
    # TMA descriptors: vals and meta [M, K/4] int8 (block [BLOCK_M, 32]), b [N, K] E4M3FN (block [BLOCK_N, 128]),
    # c [M, N] bf16 (block [BLOCK_M, BLOCK_N]; read only with TMA_STORE)
    v_desc, t_desc, b_desc, c_desc,
    # the operands as pointers for the NaN recompute and c
    b_ptr, vals_ptr, meta_ptr, c_ptr,
    # sizes and strides (elements): K steps of 128 in all
    M, N, k_steps, stride_bn, stride_am, stride_cm,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SB: gl.constexpr, SA: gl.constexpr, GROUP_M: gl.constexpr,
    TMA_STORE: gl.constexpr, num_warps: gl.constexpr,
):
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    v_bufs = gl.allocate_shared_memory(gl.int8, [SB, BLOCK_M, BG], v_desc.layout)
    t_bufs = gl.allocate_shared_memory(gl.int8, [SB, BLOCK_M, BG], t_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.float8e4nv, [SB, BLOCK_N, BK], b_desc.layout)
    a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [SA, BLOCK_M, BK], b_desc.layout)
    if TMA_STORE:
        c_smem = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_M, BLOCK_N], c_desc.layout)
    else:
        c_smem = a_bufs  # not used
    raw_ready = gl.allocate_shared_memory(gl.int64, [SB, 1], mbarrier.MBarrierLayout())
    b_ready = gl.allocate_shared_memory(gl.int64, [SB, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [SB, 1], mbarrier.MBarrierLayout())
    decoded = gl.allocate_shared_memory(gl.int64, [SA, 1], mbarrier.MBarrierLayout())
    a_empty = gl.allocate_shared_memory(gl.int64, [SA, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(SB):
        mbarrier.init(raw_ready.index(i), count=1)
        mbarrier.init(b_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(SA):
        mbarrier.init(decoded.index(i), count=1)
        mbarrier.init(a_empty.index(i), count=1)
    fence_async_shared()
    gl.warp_specialize(
        [(_consumer, (a_bufs, b_bufs, b_ready, decoded, empty, a_empty, c_smem, c_desc, b_ptr, vals_ptr, meta_ptr,
                      c_ptr, M, N, num_pid_m, num_pid_n, k_steps, stride_bn, stride_am, stride_cm, BLOCK_M,
                      BLOCK_N, SB, SA, GROUP_M, TMA_STORE, num_warps)),
         (_decoder, (v_bufs, t_bufs, a_bufs, raw_ready, decoded, a_empty, num_pid_m, num_pid_n, k_steps, BLOCK_M,
                     SB, SA)),
         (_producer, (v_desc, t_desc, b_desc, v_bufs, t_bufs, b_bufs, raw_ready, b_ready, empty, num_pid_m,
                      num_pid_n, k_steps, BLOCK_M, BLOCK_N, SB, GROUP_M))],
        [DECODER_WARPS, 1], [DECODER_REGS, 24])
    for i in gl.static_range(SB):
        mbarrier.invalidate(raw_ready.index(i))
        mbarrier.invalidate(b_ready.index(i))
        mbarrier.invalidate(empty.index(i))
    for i in gl.static_range(SA):
        mbarrier.invalidate(decoded.index(i))
        mbarrier.invalidate(a_empty.index(i))
