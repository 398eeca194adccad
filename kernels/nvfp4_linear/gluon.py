"""Gluon path of nvfp4_linear (``GluonConfig``, every M on sm_90): W decoded in registers straight into the wgmma A
operand.

Swap-AB: the MMA computes y^T tile [BN, BM] = W tile [BN, K] @ x^T, N on the wgmma M side (64 rows per
warpgroup, BN 64 or 128), M (padded to BM, 8..256) the wgmma N width. BM is a power of two or the sum of two
(``m_parts``: 48, 80, 96, 160, 192, ...; Triton's tensors and TMA blocks are powers of two): then x comes as two
boxes per copy (the high part's rows, then the low part's) into two buffers, and each decoded A fragment feeds two
wgmmas with an accumulator each, so the tile fits M more closely than the next power of two. Per 256-element K
step:

* TMA loads through a STAGES-deep mbarrier ring: W codes [BN, 128] bytes and block scales [BN, 16] bytes; x
  dequantized to fp16 either rides in the same ring as [BM, 256] tiles (X_STAGES 0, small M) or has its own ring
  of X_STAGES [BM, 64] chunks (256-row tiles, where STAGES whole steps of x would not fit in shared memory). The x
  descriptor spans whole BM-row tiles of the workspace (``padded_rows``; rows past M hold stale values and reach
  only output columns that are not stored), so no x copy crosses the tensor's end;
* each thread decodes ITS OWN part of the wgmma A fragment from shared memory: 32 contiguous code bytes of two
  rows (two 16-byte loads each) and 4 scale bytes, in four 64-K chunks (one 16-element block per chunk and row
  part), by bit placement (an E2M1 code c = s e1 e0 m placed as the fp16 bits s << 15 | (e1 e0 m) << 9 is exactly
  E2M1(c) * 2^-14) and one f16x2 multiply by fp16(block scale) * 2^6: E2M1(c) * scale * 2^-8, exact in fp16 (<= 6
  significant bits, magnitude <= 10.5, >= 2^-18); 15 instructions per word of 8 codes (decode.DECODE_PAIRS_PTX:
  each f16x2 register pairs two codes of the same parity). No shared memory round trip of the decoded W; the
  accumulator is multiplied by 2^8 at the end (exact).
* ``warpgroup_mma`` per chunk with A from registers, B = the chunk's 64 columns of x in shared memory, async, one
  group in flight: chunk c + 1 is decoded while chunk c runs, and only two chunks' A fragments are live (16
  registers each). Ring refills between the chunk wgmmas are predicated TMA issues, not branches, and
  ``gl.assume(k_steps >= 1)`` removes the loop's zero-trip path: either would otherwise make ptxas serialize every
  wgmma (advisories C7513, C7515). Two-warpgroup configs barrier before a ring slot is refilled.

The K permutation. wgmma's A fragment gives lane 4 g + q of a warp the rows g and g + 8 of its 16 and, per k16
instruction i, the logical columns {2q, 2q+1, 2q+8, 2q+9}. Within each 256-element step the kernel computes
with logical k = 16 i + 8 j1 + 2 q + j0 holding the physical (storage) element p = 64 q + 8 (i // 2) + o[4 (i % 2)
+ 2 j1 + j0], o = DECODE_PAIRS_ORDER = (0, 2, 4, 6, 1, 3, 5, 7) (the decode's output order within a word), so that
a thread's 64 elements of a row are the physical bytes [32 q, 32 q + 32): contiguous. x is stored by the quantizer
in the same permuted order (``PERMUTE_K``: p = 64 q + 8 ih + 4 j1 + 2 j0 + il for i = 2 ih + il), so sum_k x[m, k]
W[n, k] is the same sum; only the order of the products in the accumulation changes, which the block-FMA model
does not depend on.

Programmatic dependent launch (``GluonLaunch(pdl=True)``, nvfp4_linear): the quantizer triggers its dependents
when it starts, so this kernel's programs start while x is being quantized; each issues its first STAGES - 1 W
steps, then waits for the quantizer's grid (griddepcontrol.wait) before its first x load. At small M the W read
is most of the time, and the quantizer's runs under it.

Epilogue: kernels/_gluon.py's ``store_or_reduce``, shared with the other swap-AB kernels: with split-K (SPLIT_K
slices of the K steps) fp32 partials summed by the last arriving program of the tile in the fixed order s = 0, 1,
... (fp32 RN), or with CLUSTER in the same order by the first CTA of the thread-block cluster the tile's slices
run in, in its shared memory (``cluster_sum``: the same bits); then acc * fp32(x_gdec * w_gdec)
(fp32 RN) and one RNE rounding to bf16.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .._gluon import (cluster_sum, in_cluster, k_slice, m_parts, part_layouts, store_layout, store_or_reduce,
                      wait_primary, workspace_elements)
from .._runtime import Desc, Launch
from .configs import GluonConfig
from .decode import DECODE_PAIRS_PTX
from .tensorcore import splitk_buffers

__all__ = ["CHUNK_K", "GluonLaunch", "m_parts", "nvfp4_gluon_kernel", "padded_rows", "shared_layouts", "STEP_K",
           "x_block_k"]

STEP_K = 256  # K elements per step: the period of the K permutation (K must be a multiple)
CHUNK_K = 64  # K elements per wgmma group and x TMA chunk


def padded_rows(config: GluonConfig, M: int) -> int:
    """M rounded up to whole BM-row tiles of x: the rows an x descriptor spans so that no TMA box crosses its end."""
    return triton.cdiv(M, config.BM) * config.BM


def x_block_k(config: GluonConfig) -> int:
    """K columns of x one TMA copy moves: a 256-K step (X_STAGES 0, x in the W ring) or a 64-K chunk."""
    return STEP_K if config.X_STAGES == 0 else CHUNK_K


def shared_layouts(config: GluonConfig):
    """The TMA destinations' layouts: W codes (128-byte swizzle or none), block scales (none), x tiles of the
    high and of the low part of BM (``m_parts``; a one-part config's second is its first): the default NVMMA
    layout of an fp16 [rows, x_block_k] tile (128-byte swizzle, the wgmma operand layout). With CLUSTER, W's and
    the scales' take ``in_cluster``'s forms (they are loaded into registers); x's stay (the kernel slices them)."""
    cl = config.cluster_size
    w = in_cluster(gl.NVMMASharedLayout(swizzle_byte_width=128 if config.W_SWIZZLE else 0, element_bitwidth=8,
                                        rank=2), cl)
    s = in_cluster(gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2), cl)
    return w, s, *part_layouts([config.BM, x_block_k(config)], 0)


@gluon.constexpr_function
def _warp_rows(num_warps):
    """Warp bases of the A fragment: warp w owns rows [16 w, 16 w + 16)."""
    return [[16 << i, 0] for i in range(num_warps.bit_length() - 1)]


@gluon.jit
def _decode_words(words, s16):
    """words int32 (8 codes each, element j in bits 4j..4j+3), s16 fp16 (block scale * 2^6) -> 8 fp16 per word
    in element order along a new trailing axis of 8 (three nested joins take their operands bit-reversed)."""
    e0, e1, e2, e3, e4, e5, e6, e7 = gl.inline_asm_elementwise(
        DECODE_PAIRS_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [words, s16], dtype=(gl.float16,) * 8, is_pure=True,
        pack=1)
    return gl.join(gl.join(gl.join(e0, e4), gl.join(e2, e6)), gl.join(gl.join(e1, e5), gl.join(e3, e7)))


@gluon.jit
def _chunks(t, order: gl.constexpr):
    """The four 64-K chunks of a thread's registers: ``t`` [BN, 4 (q), 2 (chi), 2 (clo), ...] permuted by
    ``order`` so that chi, clo are the two trailing axes, split into chunk c = 2 chi + clo (register renames)."""
    t = gl.permute(t, order)
    lo, hi = gl.split(t)  # clo = 0, 1
    c0, c2 = gl.split(lo)  # chi = 0, 1
    c1, c3 = gl.split(hi)
    return c0, c1, c2, c3


@gluon.jit
def _chunk_a(w, s16, BN: gl.constexpr, a_layout: gl.constexpr):
    """Decode chunk c (w: int32 [BN, 4 (q), 2 (t)] code words, s16: fp16 [BN, 4 (q)] scales * 2^6) into the
    wgmma A fragment [BN, 64] (registers)."""
    w = gl.reshape(w, [BN, 8])
    s = gl.convert_layout(gl.reshape(gl.join(s16, s16), [BN, 8]), w.type.layout, assert_trivial=True)
    v = gl.reshape(_decode_words(w, s), [BN, 4, 2, 2, 2, 2])  # physical (q, t, e_hi, j1, j0): i = 4c + 2t + e_hi
    a = gl.reshape(gl.permute(v, [0, 2, 3, 4, 1, 5]), [BN, 64])  # logical (t, e_hi, j1, q, j0)
    return gl.convert_layout(a, a_layout, assert_trivial=True)  # registers only: no data moves


@gluon.jit
def _copy_x(x_desc, x2_desc, x_smem, x2_smem, bar, off_m, k, pred):
    """TMA (when ``pred``): x rows [off_m, + high part) at column k into ``x_smem`` and, for a two-part BM, the low
    part's rows after them into ``x2_smem``."""
    tma.async_copy_global_to_shared(x_desc, [off_m, k], bar, x_smem, pred=pred)
    if x2_desc is not None:
        tma.async_copy_global_to_shared(x2_desc, [off_m + x_desc.block_type.shape[0], k], bar, x2_smem, pred=pred)


@gluon.jit
def _issue_w(w_desc, s_desc, x_desc, x2_desc, w_smem, s_smem, x_smem, x2_smem, bar, off_n, off_m, k, pred,
             X_STAGES: gl.constexpr, WITH_X: gl.constexpr = True):
    """TMA (when ``pred``): W codes and block scales of the 256-K step at k into one W ring slot, and with
    X_STAGES == 0 the step's x tile [BM, 256] as well (its bytes always counted in the slot's barrier; with
    ``WITH_X`` False the caller issues the x copies later, ``_copy_x``)."""
    # the x copy's bytes: the high part's box, and the low part's when there is one
    XB: gl.constexpr = 0 if X_STAGES > 0 else x_desc.block_type.nbytes + (
        0 if x2_desc is None else x2_desc.block_type.nbytes)
    mbarrier.expect(bar, w_desc.block_type.nbytes + s_desc.block_type.nbytes + XB, pred=pred)
    tma.async_copy_global_to_shared(w_desc, [off_n, k // 2], bar, w_smem, pred=pred)
    tma.async_copy_global_to_shared(s_desc, [off_n, k // 16], bar, s_smem, pred=pred)
    if X_STAGES == 0 and WITH_X:
        _copy_x(x_desc, x2_desc, x_smem, x2_smem, bar, off_m, k, pred)


@gluon.jit
def _issue_x(x_desc, x2_desc, x_smem, x2_smem, bar, off_m, k, pred):
    """TMA (when ``pred``): the x chunk [BM, 64] at (permuted) column k into one slot of the x ring."""
    XB: gl.constexpr = x_desc.block_type.nbytes + (0 if x2_desc is None else x2_desc.block_type.nbytes)
    mbarrier.expect(bar, XB, pred=pred)
    _copy_x(x_desc, x2_desc, x_smem, x2_smem, bar, off_m, k, pred)


@gluon.jit
def nvfp4_gluon_kernel(
    # TMA descriptors: W codes uint8 [N, K/2], block scales uint8 [N, K/16], x dequantized fp16 [M, K] (permuted)
    # with the high part's rows per box, and x again with the low part's (unused when X_LO is 0)
    w_desc, s_desc, x_desc, x2_desc,
    # fp32 [2] from the quantizer ([1] = fp32(x_gdec * w_gdec)); out bf16 [M, N]; split-K partials fp32
    # [tiles, SPLIT_K, BM, BN] and per-tile arrival counters (int32, 0 between launches): kernels/_gluon.py
    gdec_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K,
    BN: gl.constexpr, BM: gl.constexpr, SPLIT_K: gl.constexpr, STAGES: gl.constexpr, X_STAGES: gl.constexpr,
    W_SWIZZLE: gl.constexpr, num_warps: gl.constexpr, PDL: gl.constexpr = False, X_LO: gl.constexpr = 0,
    CLUSTER: gl.constexpr = 1,
):
    BK: gl.constexpr = 256
    XH: gl.constexpr = BM - X_LO  # the high part of BM (all of it when X_LO is 0; GluonConfig, m_parts)
    pid_n = gl.program_id(0)  # with CLUSTER > 1 the ids number clusters: a cluster's CTAs are the K slices
    pid_m = gl.program_id(1)
    pid_k = k_slice(2, BN, XH, CLUSTER)
    off_n = pid_n * BN
    off_m = pid_m * BM
    k_steps = K // BK // SPLIT_K  # the host launches SPLIT_K dividing K / 256
    gl.assume(k_steps >= 1)  # K >= 256: no zero-trip path (it would serialize the wgmmas, ptxas C7515)
    k0 = pid_k * k_steps * BK

    # the W ring (STAGES 256-K steps); x rides in it (X_STAGES == 0: [BM, 256] per step) or has its own ring of
    # X_STAGES 64-K chunks (large tiles, where STAGES steps of x would not fit)
    w_smem = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, BK // 2], w_desc.layout)
    s_smem = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, BK // 16], s_desc.layout)
    bar_layout: gl.constexpr = in_cluster(mbarrier.MBarrierLayout(), CLUSTER)
    w_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    for i in gl.static_range(STAGES):
        mbarrier.init(w_ready.index(i), count=1)
    XN: gl.constexpr = STAGES if X_STAGES == 0 else X_STAGES
    XK: gl.constexpr = BK if X_STAGES == 0 else BK // 4
    x_smem = gl.allocate_shared_memory(gl.float16, [XN, XH, XK], x_desc.layout)
    if X_LO > 0:
        x2_smem = gl.allocate_shared_memory(gl.float16, [XN, X_LO, XK], x2_desc.layout)
    else:
        x2_desc = None
        x2_smem = x_smem  # never written or read
    if X_STAGES > 0:
        x_ready = gl.allocate_shared_memory(gl.int64, [X_STAGES, 1], bar_layout)
        for i in gl.static_range(X_STAGES):
            mbarrier.init(x_ready.index(i), count=1)
    fence_async_shared()
    n_chunks = 4 * k_steps
    # PDL: the W prologue goes out before griddepcontrol.wait (W does not depend on the quantizer, which runs
    # meanwhile); x and gdec are read only after it
    for i in gl.static_range(STAGES - 1):
        xi = i if X_STAGES == 0 else 0
        _issue_w(w_desc, s_desc, x_desc, x2_desc, w_smem.index(i), s_smem.index(i), x_smem.index(xi),
                 x2_smem.index(xi), w_ready.index(i), off_n, off_m, k0 + i * BK, i < k_steps, X_STAGES, not PDL)
    if PDL:
        wait_primary()
        if X_STAGES == 0:  # the step's x copies, which the W prologue's barriers already expect
            for i in gl.static_range(STAGES - 1):
                _copy_x(x_desc, x2_desc, x_smem.index(i), x2_smem.index(i), w_ready.index(i), off_m, k0 + i * BK,
                        i < k_steps)
    if X_STAGES > 0:
        for jx in gl.static_range(X_STAGES - 1):
            _issue_x(x_desc, x2_desc, x_smem.index(jx), x2_smem.index(jx), x_ready.index(jx), off_m, k0 + jx * 64,
                     jx < n_chunks)

    acc_layout: gl.constexpr = in_cluster(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                                    instr_shape=[16, XH, 16]), CLUSTER)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    # lane 4 g + q of warp w: rows 16 w + g and 16 w + g + 8; code words [8 q, 8 q + 8) (bytes [32 q, 32 q + 32))
    # and scale bytes [4 q, 4 q + 4) of the step: exactly the A fragment after the K permutation
    words_layout: gl.constexpr = in_cluster(gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [8, 0], [0, 2], [0, 4]], lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]],
        warp_bases=_warp_rows(num_warps), block_bases=[], shape=[BN, BK // 8]), CLUSTER)
    scale_layout: gl.constexpr = in_cluster(gl.DistributedLinearLayout(
        reg_bases=[[8, 0], [0, 1], [0, 2]], lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
        warp_bases=_warp_rows(num_warps), block_bases=[], shape=[BN, BK // 16]), CLUSTER)
    if W_SWIZZLE:  # the TMA's 128-byte swizzle: 16-byte chunk c of row r stored at chunk c ^ (r % 8)
        words_smem: gl.constexpr = in_cluster(gl.SwizzledSharedLayout(4, 1, 8, [1, 0]), CLUSTER)
    else:
        words_smem: gl.constexpr = in_cluster(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]), CLUSTER)
    acc = gl.zeros([BN, XH], gl.float32, acc_layout)
    if X_LO > 0:  # the low part's accumulator: the same A fragments, its own wgmma N width
        acc2 = gl.zeros([BN, X_LO], gl.float32, gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, X_LO, 16]))
    for i in range(k_steps):
        s = i % STAGES
        mbarrier.wait(w_ready.index(s), (i // STAGES) & 1)
        words = w_smem.index(s)._reinterpret(gl.int32, [BN, BK // 8], words_smem).load(words_layout)
        sb = s_smem.index(s).load(scale_layout)
        s16 = (sb & 0x7F).to(gl.float8e4nv, bitcast=True).to(gl.float16) * 64.0  # UE4M3: sign ignored; exact
        # chunk c (k16 instructions 4c..4c+3) of a thread: words 2c, 2c+1 and scale byte c of its row parts
        w_c = _chunks(gl.reshape(words, [BN, 4, 2, 2, 2]), [0, 1, 4, 2, 3])  # (q, chi, clo, t) -> (q, t)
        s_c = _chunks(gl.reshape(s16, [BN, 4, 2, 2]), [0, 1, 2, 3])  # (q, chi, clo) -> (q)
        for c in gl.static_range(4):
            if X_STAGES == 0:
                x_s = x_smem.index(s).slice(64 * c, 64, dim=1)
                x2_s = x2_smem.index(s).slice(64 * c, 64, dim=1)
            else:
                j = 4 * i + c
                xs = j % X_STAGES
                mbarrier.wait(x_ready.index(xs), (j // X_STAGES) & 1)
                x_s = x_smem.index(xs)
                x2_s = x2_smem.index(xs)
            a = _chunk_a(w_c[c], s_c[c], BN, a_layout)
            acc = warpgroup_mma(a, x_s.permute((1, 0)), acc, is_async=True)
            if X_LO > 0:  # chunk c - 1's two groups retire here
                acc2 = warpgroup_mma(a, x2_s.permute((1, 0)), acc2, is_async=True)
                acc, acc2 = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc2))
            else:
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            if X_STAGES > 0:
                if num_warps > 4:
                    gl.thread_barrier()  # both warpgroups retired chunk j - 1 (and read step i - 1's W words)
                # chunk j - 1 retired: its x slot takes chunk j - 1 + X_STAGES; after chunk 4 i - 1 (c = 0), step
                # i - 1's W slot takes step i + STAGES - 1 (predicated, not branched: a branch between the wgmmas
                # makes ptxas serialize them, advisory C7513)
                nx = j + X_STAGES - 1
                _issue_x(x_desc, x2_desc, x_smem.index(nx % X_STAGES), x2_smem.index(nx % X_STAGES),
                         x_ready.index(nx % X_STAGES), off_m, k0 + nx * 64, nx < n_chunks)
                if c == 0:
                    nw = i + STAGES - 1
                    _issue_w(w_desc, s_desc, x_desc, x2_desc, w_smem.index(nw % STAGES), s_smem.index(nw % STAGES),
                             x_s, x2_s, w_ready.index(nw % STAGES), off_n, off_m, k0 + nw * BK, nw < k_steps,
                             X_STAGES)
        if X_STAGES == 0:
            if num_warps > 4:
                gl.thread_barrier()  # both warpgroups retired step i - 1
            nw = i + STAGES - 1  # step i - 1's wgmmas retired: its slot takes step i + STAGES - 1
            _issue_w(w_desc, s_desc, x_desc, x2_desc, w_smem.index(nw % STAGES), s_smem.index(nw % STAGES),
                     x_smem.index(nw % STAGES), x2_smem.index(nw % STAGES), w_ready.index(nw % STAGES), off_n, off_m,
                     k0 + nw * BK, nw < k_steps, X_STAGES)
    if X_LO > 0:
        acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2))
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    acc = acc * 256.0  # undo the decode's 2^-8 (exact: every product carries the same power of two)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(w_ready.index(i))
    if X_STAGES > 0:
        for i in gl.static_range(X_STAGES):
            mbarrier.invalidate(x_ready.index(i))

    # the shared epilogue (kernels/_gluon.py): 16-byte stores, or the fixed-order split-K sum; then the epilogue
    # scale fp32(x_gdec * w_gdec) (fp32 RN) and one RNE rounding to bf16
    gdec = gl.load(gdec_ptr + 1)
    if CLUSTER > 1:  # the slices' sum in rank order, in rank 0 (which alone stores)
        acc = cluster_sum(acc, CLUSTER, num_warps)
    accb = gl.convert_layout(acc, store_layout(BN, XH, num_warps, CLUSTER))
    store_or_reduce(accb, out_ptr, part_ptr, count_ptr, M, N, N, off_n, off_m, off_m,
                    pid_m * gl.num_programs(0) + pid_n, pid_k, gdec, BN, XH, SPLIT_K, True, num_warps, CLUSTER)
    if X_LO > 0:  # (a two-part BM has SPLIT_K 1: GluonConfig)
        accb = gl.convert_layout(acc2 * 256.0, store_layout(BN, X_LO, num_warps))
        store_or_reduce(accb, out_ptr, part_ptr, count_ptr, M, N, N, off_n, off_m + XH, off_m, 0, 0, gdec, BN,
                        X_LO, 1, True, num_warps)


class GluonLaunch:
    """``nvfp4_gluon_kernel`` for x [M, K] (dequantized to fp16 by the quantizer in the permuted K order) times
    W [N, K] with ``config`` (K % 256 == 0, (K / 256) % SPLIT_K == 0: ``GluonConfig.fits``).

    ``pdl``: launched with programmatic dependent launch after a quantize launch that triggers its dependents
    (``QuantizeLaunches(trigger_dependents=1 or 2)``): the kernel loads its first W steps while the quantizer runs
    and waits for it (griddepcontrol.wait) before it reads x and gdec. Correct after any kernel (the wait then
    returns once the previous grid has completed), but only a triggering one lets it start early.

    ``x_rows``: the rows of ``deq`` the x descriptor spans (default M; at most the rows ``deq`` holds). Rows M ..
    x_rows - 1 hold whatever the workspace held (each output column m reads only row m of x, so they reach no
    stored element); spanning whole BM-row tiles (``padded_rows``) keeps every x copy inside the tensor: a TMA box
    partly past the last row is slow (docs/benchmarks.md, "x rows padded to the tile").

    ``run(stream, device, weight_fp4, weight_scales, deq, gdec, out, w_gdec)`` as the other paths."""

    __slots__ = ("launch", "split_k", "tiles", "config", "M", "N", "K", "x_rows")

    def __init__(self, config: GluonConfig, M: int, N: int, K: int, pdl: bool = False, x_rows: int | None = None):
        # CLUSTER: each program is a cluster of the tile's SPLIT_K slices (grid dimension x counts clusters)
        cluster = config.cluster_size
        grid = (triton.cdiv(N, config.BN), triton.cdiv(M, config.BM), config.SPLIT_K // cluster)
        self.M, self.N, self.K, self.config = M, N, K, config
        self.x_rows = M if x_rows is None else x_rows
        if self.x_rows < M:
            raise ValueError(f"x_rows={x_rows}: expected >= M={M}")
        # the workspace reduction's slices (1 in a cluster: no workspace)
        self.split_k, self.tiles = grid[2], grid[0] * grid[1]
        # TMA descriptors: W codes and scale bytes (viewed as uint8), x in its (high, low) row parts
        wl, sl, xl, x2l = shared_layouts(config)
        descs = (Desc((N, K // 2), (K // 2, 1), (config.BN, STEP_K // 2), wl, torch.uint8),
                 Desc((N, K // 16), (K // 16, 1), (config.BN, STEP_K // 16), sl, torch.uint8),
                 *Desc.parts((self.x_rows, K), (K, 1), (config.BM, x_block_k(config)), 0, (xl, x2l)))
        self.launch = Launch(
            nvfp4_gluon_kernel, grid,
            dict(BN=config.BN, BM=config.BM, SPLIT_K=config.SPLIT_K, STAGES=config.STAGES, X_STAGES=config.X_STAGES,
                 W_SWIZZLE=config.W_SWIZZLE, num_warps=config.num_warps, PDL=pdl, X_LO=m_parts(config.BM)[1],
                 CLUSTER=cluster),
            descs=descs, launch_pdl=pdl, num_ctas=cluster)

    def run(self, stream: int, device, weight_fp4, weight_scales, deq, gdec, out, w_gdec: float) -> None:
        M, N, K, cfg = self.M, self.N, self.K, self.config
        # store_or_reduce's tile-major split-K workspace and the per-tile arrival counters
        part, cnt = splitk_buffers(device, stream, self.split_k,
                                   workspace_elements(self.tiles, self.split_k, cfg.BN, cfg.BM), self.tiles)
        self.launch.launch(stream, weight_fp4, weight_scales, deq, deq, gdec, out, part, cnt, M, N, K)
