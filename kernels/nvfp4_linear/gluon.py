"""Gluon path of nvfp4_linear for M <= 256 (``GluonConfig``): W decoded in registers straight into the wgmma A
operand (sm_90 only).

Swap-AB: the MMA computes y^T tile [BN, BM] = W tile [BN, K] @ x^T, N on the wgmma M side (64 rows per
warpgroup), M (padded to BM, 8..128) the wgmma N width. Per 256-element K step:

* TMA loads through a STAGES-deep mbarrier ring: W codes [BN, 128] bytes, block scales [BN, 16] bytes, and
  x dequantized to fp16 [BM, 256] (zero-filled past row M);
* each thread decodes ITS OWN part of the wgmma A fragment from shared memory: 32 contiguous code bytes of two
  rows (two 16-byte loads each) and 4 scale bytes, by bit placement (an E2M1 code c = s e1 e0 m placed as the
  fp16 bits s << 15 | (e1 e0 m) << 9 is exactly E2M1(c) * 2^-14) and one f16x2 multiply by fp16(block scale) *
  2^6: E2M1(c) * scale * 2^-8, exact in fp16 (<= 6 significant bits, magnitude <= 10.5, >= 2^-18). No shared
  memory round trip of the decoded W; the accumulator is multiplied by 2^8 at the end (exact).
* ``warpgroup_mma`` with A from registers, B = the x tile from shared memory, async, one group in flight.

The K permutation. wgmma's A fragment gives lane 4 g + q of a warp the rows g and g + 8 of its 16 and, per k16
instruction i, the logical columns {2q, 2q+1, 2q+8, 2q+9}. Within each 256-element step the kernel computes
with logical k = 16 i + 8 j1 + 2 q + j0 holding the physical (storage) element p = 64 q + 4 i + 2 j1 + j0, so
that a thread's 64 elements of a row are the physical bytes [32 q, 32 q + 32): contiguous. x is stored by the
quantizer in the same permuted order (``PERMUTE_K``), so sum_k x[m, k] W[n, k] is the same sum; only the order
of the products in the accumulation changes, which the block-FMA model does not depend on.

Split-K (SPLIT_K slices of the K steps): fp32 partials, summed by the last arriving program of the tile in the
fixed order s = 0, 1, ... (fp32 RN), then acc * fp32(x_gdec * w_gdec) and one RNE rounding to bf16.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .._runtime import Desc, Launch
from .configs import GluonConfig
from .decode import DECODE_BITS_PTX
from .tensorcore import splitk_buffers

__all__ = ["GluonLaunch", "nvfp4_gluon_fused_kernel", "nvfp4_gluon_kernel", "shared_layouts", "STEP_K"]

STEP_K = 256  # K elements per step: the period of the K permutation (K must be a multiple)


def shared_layouts(config: GluonConfig):
    """The TMA destinations' layouts: W codes (128-byte swizzle or none), block scales (none), x (the default
    NVMMA layout of an fp16 [BM, 256] tile)."""
    w = gl.NVMMASharedLayout(swizzle_byte_width=128 if config.W_SWIZZLE else 0, element_bitwidth=8, rank=2)
    s = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
    x = gl.NVMMASharedLayout.get_default_for([config.BM, STEP_K], gl.float16)
    return w, s, x


@gluon.constexpr_function
def _warp_rows(num_warps):
    """Warp bases of the A fragment: warp w owns rows [16 w, 16 w + 16)."""
    return [[16 << i, 0] for i in range(num_warps.bit_length() - 1)]


@gluon.jit
def _decode_words(words, s16):
    """words int32 (8 codes each, element j in bits 4j..4j+3), s16 fp16 (block scale * 2^6) -> 8 fp16 per word
    in element order along a new trailing axis of 8 (three nested joins take their operands bit-reversed)."""
    e0, e1, e2, e3, e4, e5, e6, e7 = gl.inline_asm_elementwise(
        DECODE_BITS_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [words, s16], dtype=(gl.float16,) * 8, is_pure=True,
        pack=1)
    return gl.join(gl.join(gl.join(e0, e4), gl.join(e2, e6)), gl.join(gl.join(e1, e5), gl.join(e3, e7)))


@gluon.jit
def _issue(w_desc, s_desc, x_desc, w_smem, s_smem, x_smem, bar, off_n, off_m, k, NBYTES: gl.constexpr):
    mbarrier.expect(bar, NBYTES)
    tma.async_copy_global_to_shared(w_desc, [off_n, k // 2], bar, w_smem)
    tma.async_copy_global_to_shared(s_desc, [off_n, k // 16], bar, s_smem)
    if x_desc is not None:  # the fused kernel quantizes x into shared memory itself
        tma.async_copy_global_to_shared(x_desc, [off_m, k], bar, x_smem)


@gluon.jit
def _decode_step(w_stage, s_stage, BN: gl.constexpr, BK: gl.constexpr, W_SWIZZLE: gl.constexpr,
                 acc_layout: gl.constexpr, num_warps: gl.constexpr):
    """One K step's W tile [BN, 256] from the stage's codes and scales, decoded in registers straight into the
    wgmma A fragment (times 2^-8, exact), in the logical (permuted) K order."""
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    # lane 4 g + q of warp w: rows 16 w + g and 16 w + g + 8; code words [8 q, 8 q + 8) (bytes [32 q, 32 q + 32))
    # and scale bytes [4 q, 4 q + 4) of the step: exactly the A fragment after the K permutation
    words_layout: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [8, 0], [0, 2], [0, 4]], lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]],
        warp_bases=_warp_rows(num_warps), block_bases=[], shape=[BN, BK // 8])
    scale_layout: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[8, 0], [0, 1], [0, 2]], lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
        warp_bases=_warp_rows(num_warps), block_bases=[], shape=[BN, BK // 16])
    if W_SWIZZLE:  # the TMA's 128-byte swizzle: 16-byte chunk c of row r stored at chunk c ^ (r % 8)
        words_smem: gl.constexpr = gl.SwizzledSharedLayout(4, 1, 8, [1, 0])
    else:
        words_smem: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    words = w_stage._reinterpret(gl.int32, [BN, BK // 8], words_smem).load(words_layout)
    sb = s_stage.load(scale_layout)
    s16 = (sb & 0x7F).to(gl.float8e4nv, bitcast=True).to(gl.float16) * 64.0  # UE4M3: sign ignored; exact
    s16 = gl.convert_layout(gl.reshape(gl.join(s16, s16), [BN, BK // 8]), words_layout, assert_trivial=True)
    v = gl.reshape(_decode_words(words, s16), [BN, 4, 16, 2, 2])  # physical (q, i, j1, j0)
    a = gl.reshape(gl.permute(v, [0, 2, 3, 1, 4]), [BN, BK])  # logical (i, j1, q, j0)
    return gl.convert_layout(a, a_layout, assert_trivial=True)  # registers only: no data moves


@gluon.jit
def _mainloop(w_desc, s_desc, x_desc, w_smem, s_smem, x_smem, ready, off_n, off_m, k0, k_steps,
              BN: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, W_SWIZZLE: gl.constexpr, NBYTES: gl.constexpr,
              num_warps: gl.constexpr):
    """acc [BN, BM] fp32 = sum over the k_steps 256-element steps of decode(W) @ x^T, one wgmma group in flight;
    the ring's first STAGES - 1 steps were issued by the caller. x_desc None: x_smem holds every step of x
    (``x_smem.index(i)``: step i), otherwise the ring's x stage."""
    BK: gl.constexpr = 256
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BM, 16])
    acc = gl.zeros([BN, BM], gl.float32, acc_layout)
    for i in range(k_steps):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        a = _decode_step(w_smem.index(s), s_smem.index(s), BN, BK, W_SWIZZLE, acc_layout, num_warps)
        if x_desc is None:
            xs = x_smem.index(i)
        else:
            xs = x_smem.index(s)
        acc = warpgroup_mma(a, xs.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        nxt = i + STAGES - 1  # step i - 1's wgmma retired: its slot takes step i + STAGES - 1
        if nxt < k_steps:
            t = nxt % STAGES
            _issue(w_desc, s_desc, x_desc, w_smem.index(t), s_smem.index(t), x_smem.index(t), ready.index(t),
                   off_n, off_m, k0 + nxt * BK, NBYTES)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    return acc * 256.0  # undo the decode's 2^-8 (exact: every product carries the same power of two)


@gluon.jit
def _epilogue(acc, scale, out_ptr, part_ptr, count_ptr, off_n, off_m, pid_m, pid_k, M, N,
              BN: gl.constexpr, BM: gl.constexpr, SPLIT_K: gl.constexpr, num_warps: gl.constexpr):
    """out = RNE_bf16(acc * scale) (fp32 multiply), or with split-K: the fp32 partial, and the tile's last program
    sums the partials in the fixed order s = 0, 1, ... before the same epilogue."""
    out_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [num_warps, 1], [0, 1])
    accb = gl.convert_layout(acc, out_layout)
    offs_n = off_n + gl.arange(0, BN, layout=gl.SliceLayout(1, out_layout))
    offs_m = off_m + gl.arange(0, BM, layout=gl.SliceLayout(0, out_layout))
    idx = gl.expand_dims(offs_m, 0).to(gl.int64) * N + gl.expand_dims(offs_n, 1)
    mask = (gl.expand_dims(offs_m, 0) < M) & (gl.expand_dims(offs_n, 1) < N)
    if SPLIT_K == 1:
        gl.store(out_ptr + idx, (accb * scale).to(gl.bfloat16), mask=mask)  # fp32 RNE, one RNE to bf16
    else:
        MN = N.to(gl.int64) * M  # (M may be the constant 1 after specialisation: no .to on it)
        gl.store(part_ptr + pid_k * MN + idx, accb, mask=mask, cache_modifier=".cg")
        gl.thread_barrier()  # every thread's partial stores precede the (release) arrival
        tile = pid_m * gl.num_programs(0) + gl.program_id(0)
        prev = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if prev == SPLIT_K - 1:  # last to arrive: the fixed-order sum s = 0, 1, ..., SPLIT_K - 1
            tot = gl.load(part_ptr + idx, mask=mask, other=0.0, cache_modifier=".cg")
            for j in gl.static_range(1, SPLIT_K):
                tot += gl.load(part_ptr + j * MN + idx, mask=mask, other=0.0, cache_modifier=".cg")
            gl.store(out_ptr + idx, (tot * scale).to(gl.bfloat16), mask=mask)
            gl.store(count_ptr + tile, 0)  # ready for the next launch


@gluon.jit
def nvfp4_gluon_kernel(
    # TMA descriptors: W codes uint8 [N, K/2], block scales uint8 [N, K/16], x dequantized fp16 [M, K] (permuted)
    w_desc, s_desc, x_desc,
    # fp32 [2] from the quantizer ([1] = fp32(x_gdec * w_gdec)); out bf16 [M, N]; split-K partials fp32
    # [SPLIT_K, M, N] and per-tile arrival counters (int32, 0 between launches)
    gdec_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K,
    BN: gl.constexpr, BM: gl.constexpr, SPLIT_K: gl.constexpr, STAGES: gl.constexpr, W_SWIZZLE: gl.constexpr,
    num_warps: gl.constexpr,
):
    BK: gl.constexpr = 256
    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    pid_k = gl.program_id(2)
    off_n = pid_n * BN
    off_m = pid_m * BM
    k_steps = K // BK // SPLIT_K  # the host launches SPLIT_K dividing K / 256
    k0 = pid_k * k_steps * BK

    w_smem = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, BK // 2], w_desc.layout)
    s_smem = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, BK // 16], s_desc.layout)
    x_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BM, BK], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    NBYTES: gl.constexpr = BN * BK // 2 + BN * BK // 16 + BM * BK * 2
    for i in gl.static_range(STAGES - 1):
        if i < k_steps:
            _issue(w_desc, s_desc, x_desc, w_smem.index(i), s_smem.index(i), x_smem.index(i), ready.index(i),
                   off_n, off_m, k0 + i * BK, NBYTES)
    acc = _mainloop(w_desc, s_desc, x_desc, w_smem, s_smem, x_smem, ready, off_n, off_m, k0, k_steps, BN, BM,
                    STAGES, W_SWIZZLE, NBYTES, num_warps)
    scale = gl.load(gdec_ptr + 1)
    _epilogue(acc, scale, out_ptr, part_ptr, count_ptr, off_n, off_m, pid_m, pid_k, M, N, BN, BM, SPLIT_K,
              num_warps)


# ---------------------------------------------------------------------------------------------------------------
# The fused kernel: x quantized in the kernel (recipe "sol", the quantizer's arithmetic op for op)
# ---------------------------------------------------------------------------------------------------------------
FLT_MAX = gl.constexpr(3.4028234663852886e38)  # float.fromhex("0x1.fffffep127")


@gluon.jit
def _widen_to_fp32(x):
    """Exact fp32 value of x (fp32 / bf16 / fp16); bf16 by its bits (quantize._widen_to_fp32)."""
    if x.dtype == gl.bfloat16:
        return (x.to(gl.uint16, bitcast=True).to(gl.uint32) << 16).to(gl.float32, bitcast=True)
    else:
        return x.to(gl.float32)


@gluon.jit
def _e4m3_rne_byte(s):
    """E4M3FN byte (RNE) of s, fp32 in [0, 448], by integer arithmetic (quantize._e4m3_rne_byte, op for op)."""
    sb = s.to(gl.int32, bitcast=True)
    e = sb >> 23
    mant = (sb & 0x7FFFFF) | gl.where(e > 0, 0x800000, 0)
    e = gl.maximum(e, 1)
    shift = gl.minimum(gl.where(e >= 121, 20, 141 - e), 30)
    q = mant >> shift
    rem = mant & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(gl.int32)  # ties to even
    return gl.where(e >= 121, ((e - 120) << 3) + q - 8, q)


@gluon.jit
def _e4m3_byte_to_fp32(b):
    """Exact fp32 value of an E4M3FN byte (sign bit clear, not 0x7F) (decode.e4m3_byte_to_fp32)."""
    be = b >> 3
    m = b & 7
    normal = (((be + 120) << 23) | (m << 20)).to(gl.float32, bitcast=True)
    return gl.where(be == 0, m.to(gl.float32) * 0.001953125, normal)  # subnormal: m * 2^-9 (exact)


@gluon.jit
def _quantize_blocks(x, genc, gdec):
    """x [R, 16 * B] (physical K order, fp32 / bf16 / fp16) -> code value * block scale, fp16 (exact), by the
    "sol" recipe with global encode / decode scales genc, gdec: nvfp4_quantize_kernel's WRITE_DEQUANT values,
    the same fp32 operations in the same order."""
    R: gl.constexpr = x.shape[0]
    NB: gl.constexpr = x.shape[1] // 16
    x = gl.reshape(_widen_to_fp32(x), [R, NB, 16])
    # block amax (exact, via bits), block scale = (block_amax / 6) * global_encode, clamp 448, E4M3 RNE
    bamax = gl.max(x.to(gl.int32, bitcast=True) & 0x7FFFFFFF, axis=2).to(gl.float32, bitcast=True)
    s = gl.div_rn(bamax, gl.full_like(bamax, 6.0)) * genc
    s = gl.minimum(s, 448.0)
    sval = _e4m3_byte_to_fp32(_e4m3_rne_byte(s))
    # element encode = min(1 / (float(block_scale) * global_decode), fp32 max); element = x * encode
    enc = gl.minimum(gl.div_rn(gl.full_like(sval, 1.0), sval * gdec), FLT_MAX)
    y = x * gl.expand_dims(enc, 2)
    # E2M1 RNE of clamp(y, -6, 6) by the magic add (quantize.py): r = (a + C) - C, C = 2^(e + 22)
    a = gl.minimum(gl.abs(y), 6.0)
    cb = (gl.maximum(a, 1.0).to(gl.int32, bitcast=True) & 0x7F800000) + (22 << 23)
    c = cb.to(gl.float32, bitcast=True)
    r = (a + c) - c
    v = gl.where(y < 0.0, -r, r) * gl.expand_dims(sval, 2)  # exact in fp32 and in fp16
    return gl.reshape(v, [R, NB * 16]).to(gl.float16)


@gluon.jit
def _global_scales(x_ptr, numel, num_warps: gl.constexpr):
    """(global encode, global decode) of x (numel elements) by the recipe, every program alike: amax = the int32
    max of the sign-cleared fp32 bits (amax_kernel's rule: exact, order-free), 16-byte loads, the next chunk's
    loads issued before the current chunk's max."""
    VEC: gl.constexpr = 8  # elements per 16-byte load at 2 bytes (2 loads at 4)
    CHUNK: gl.constexpr = VEC * 32 * num_warps * 4  # 4 loads in flight per thread (8 with the prefetch)
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [num_warps], [0])
    offs = gl.arange(0, CHUNK, layout=layout)
    xv = gl.load(x_ptr + offs, mask=offs < numel, other=0.0)
    best = gl.zeros([CHUNK], gl.int32, layout)
    for start in range(CHUNK, numel, CHUNK):
        nxt = gl.load(x_ptr + start + offs, mask=start + offs < numel, other=0.0)
        best = gl.maximum(best, _widen_to_fp32(xv).to(gl.int32, bitcast=True) & 0x7FFFFFFF)
        xv = nxt
    best = gl.maximum(best, _widen_to_fp32(xv).to(gl.int32, bitcast=True) & 0x7FFFFFFF)
    amax = gl.max(best, axis=0).to(gl.float32, bitcast=True)
    genc = gl.div_rn(2688.0, amax)  # (448 * 6) / amax; amax = 0 -> +inf
    genc = gl.minimum(genc, FLT_MAX)
    genc = gl.where(genc == 0.0, 1.0, genc)  # amax = +inf -> 0 -> 1 (TransformerEngine's rule)
    gdec = gl.div_rn(1.0, genc)
    return genc, gdec


@gluon.constexpr_function
def _row_layout(X_STEPS, num_warps):
    """[X_STEPS, 256] physical x of one row: a thread holds one 16-element block (two 16-byte loads at 2 bytes);
    16 lanes span a step, 2 lanes x the warps span the steps."""
    return gl.BlockedLayout([1, 16], [2, 16], [num_warps, 1], [1, 0])


@gluon.jit
def _quantize_x_to_smem(x_ptr, x_smem, M, K, off_m, k0, BM: gl.constexpr, X_STEPS: gl.constexpr,
                        num_warps: gl.constexpr):
    """x_smem [X_STEPS, BM, 256] fp16 (the wgmma B layout) <- this program's x slice, rows off_m.., columns
    k0 + [0, 256 X_STEPS), quantized by the recipe and dequantized, in the logical (permuted) K order; rows >= M
    zero. Rows are quantized one at a time (only the M real rows cost arithmetic) into a plain row-major view of
    the same bytes (a single row of the swizzled layout cannot be addressed), then each step's tile is moved into
    the swizzled layout in place."""
    BK: gl.constexpr = 256
    KS: gl.constexpr = X_STEPS * BK
    rl: gl.constexpr = _row_layout(X_STEPS, num_warps)
    offs = (gl.expand_dims(gl.arange(0, X_STEPS, layout=gl.SliceLayout(1, rl)), 1) * BK
            + gl.expand_dims(gl.arange(0, BK, layout=gl.SliceLayout(0, rl)), 0))
    m_rows = gl.minimum(M - off_m, BM)
    row_ptr = x_ptr + k0 + offs
    xv = gl.load(row_ptr + off_m * K)  # row 0 (m_rows >= 1): in flight during the amax pass
    genc, gdec = _global_scales(x_ptr, M * K, num_warps)
    plain3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    rows3 = x_smem._reinterpret(gl.float16, [X_STEPS, BM, BK], plain3)
    for r in range(m_rows):
        nxt = gl.load(row_ptr + (off_m + r + 1) * K, mask=(offs < KS) & (r + 1 < m_rows), other=0.0)
        v = _quantize_blocks(xv, genc, gdec)  # [X_STEPS, 256] physical p = 64 q + 4 i + 2 j1 + j0
        v = gl.permute(gl.reshape(v, [X_STEPS, 4, 16, 2, 2]), [0, 2, 3, 1, 4])  # logical (i, j1, q, j0)
        v = gl.reshape(v, [X_STEPS, 1, BK])
        for rr in gl.static_range(BM):  # row r of every step (a static row: a runtime one cannot slice)
            if r == rr:
                rows3.slice(rr, 1, dim=1).store(v)
        xv = nxt
    gl.thread_barrier()  # every row written before any step is moved
    plain2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    steps = x_smem._reinterpret(gl.float16, [X_STEPS, BM, BK], plain2)
    tl_: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    rows = gl.expand_dims(gl.arange(0, BM, layout=gl.SliceLayout(1, tl_)), 1)
    for i in range(X_STEPS):
        t = steps.index(i).load(tl_)
        t = gl.where(rows < m_rows, t, 0.0)  # rows past M: +0 (as the TMA's zero fill)
        gl.thread_barrier()  # every thread holds step i before any overwrites its bytes
        x_smem.index(i).store(t)
    fence_async_shared()  # the generic-proxy stores, visible to wgmma (async proxy)
    gl.thread_barrier()
    return gdec


@gluon.jit
def nvfp4_gluon_fused_kernel(
    # TMA descriptors: W codes uint8 [N, K/2], block scales uint8 [N, K/16]
    w_desc, s_desc,
    # x fp32 / bf16 / fp16 [M, K] row-major; w_gdec fp32; out bf16 [M, N]; split-K partials fp32 [SPLIT_K, M, N]
    # and per-tile arrival counters (int32, 0 between launches)
    x_ptr, w_gdec, out_ptr, part_ptr, count_ptr,
    M, N, K,
    BN: gl.constexpr, BM: gl.constexpr, SPLIT_K: gl.constexpr, STAGES: gl.constexpr, W_SWIZZLE: gl.constexpr,
    X_STEPS: gl.constexpr,  # K / 256 / SPLIT_K: the steps of one program, all of its x slice in shared memory
    num_warps: gl.constexpr,
):
    BK: gl.constexpr = 256
    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    pid_k = gl.program_id(2)
    off_n = pid_n * BN
    off_m = pid_m * BM
    k0 = pid_k * X_STEPS * BK

    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.float16)
    w_smem = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, BK // 2], w_desc.layout)
    s_smem = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, BK // 16], s_desc.layout)
    x_smem = gl.allocate_shared_memory(gl.float16, [X_STEPS, BM, BK], x_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    NBYTES: gl.constexpr = BN * BK // 2 + BN * BK // 16
    for i in gl.static_range(STAGES - 1):  # W streams in while x is quantized
        if i < X_STEPS:
            _issue(w_desc, s_desc, None, w_smem.index(i), s_smem.index(i), x_smem, ready.index(i),
                   off_n, off_m, k0 + i * BK, NBYTES)
    # x: global scales from all of x (every program alike), this program's [BM, 256 X_STEPS] slice quantized
    # into x_smem; the epilogue scale fp32(x_gdec * w_gdec) as the quantizer computes it
    gdec = _quantize_x_to_smem(x_ptr, x_smem, M, K, off_m, k0, BM, X_STEPS, num_warps)
    acc = _mainloop(w_desc, s_desc, None, w_smem, s_smem, x_smem, ready, off_n, off_m, k0, X_STEPS, BN, BM,
                    STAGES, W_SWIZZLE, NBYTES, num_warps)
    _epilogue(acc, gdec * w_gdec, out_ptr, part_ptr, count_ptr, off_n, off_m, pid_m, pid_k, M, N, BN, BM,
              SPLIT_K, num_warps)


class GluonLaunch:
    """``nvfp4_gluon_kernel`` for x [M, K] (dequantized to fp16 by the quantizer in the permuted K order) times
    W [N, K] with ``config`` (``GluonConfig.fits(N, K)``); with ``config.FUSED_QUANT`` ``nvfp4_gluon_fused_kernel``
    on x itself (no quantizer launch).

    ``run(stream, device, weight_fp4, weight_scales, x_or_deq, gdec, out, w_gdec)`` as the other paths: ``x_or_deq``
    is x when fused (``gdec`` unused), the quantizer's fp16 output otherwise."""

    __slots__ = ("launch", "split_k", "tiles", "layouts", "config", "M", "N", "K", "fused")

    def __init__(self, config: GluonConfig, M: int, N: int, K: int):
        grid = (triton.cdiv(N, config.BN), triton.cdiv(M, config.BM), config.SPLIT_K)
        self.M, self.N, self.K, self.config, self.fused = M, N, K, config, config.FUSED_QUANT
        self.split_k, self.tiles, self.layouts = config.SPLIT_K, grid[0] * grid[1], shared_layouts(config)
        meta = dict(BN=config.BN, BM=config.BM, SPLIT_K=config.SPLIT_K, STAGES=config.STAGES,
                    W_SWIZZLE=config.W_SWIZZLE)
        if self.fused:
            # the quantizer's compile options: IEEE divisions and multiplies without FTZ, no FMA contraction
            self.launch = Launch(nvfp4_gluon_fused_kernel, grid,
                                 dict(meta, X_STEPS=K // STEP_K // config.SPLIT_K, num_warps=config.num_warps),
                                 n_desc=2, enable_fp_fusion=False, enable_reflect_ftz=False)
        else:
            self.launch = Launch(nvfp4_gluon_kernel, grid, dict(meta, num_warps=config.num_warps), n_desc=3)

    def run(self, stream: int, device, weight_fp4, weight_scales, x_or_deq, gdec, out, w_gdec: float) -> None:
        M, N, K, cfg = self.M, self.N, self.K, self.config
        wl, sl, xl = self.layouts
        part, cnt = splitk_buffers(device, stream, self.split_k, M, N, self.tiles, out)
        w = Desc(weight_fp4.view(torch.uint8), (N, K // 2), (K // 2, 1), (cfg.BN, STEP_K // 2), wl)
        s = Desc(weight_scales.view(torch.uint8), (N, K // 16), (K // 16, 1), (cfg.BN, STEP_K // 16), sl)
        if self.fused:
            self.launch.launch(stream, w, s, x_or_deq, w_gdec, out, part, cnt, M, N, K)
        else:
            self.launch.launch(stream, w, s, Desc(x_or_deq, (M, K), (K, 1), (cfg.BM, STEP_K), xl), gdec, out, part,
                               cnt, M, N, K)
