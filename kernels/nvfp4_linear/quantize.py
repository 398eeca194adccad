"""The NVFP4 quantizer of x, recipe "sol" bit for bit: ``amax_kernel`` + ``nvfp4_quantize_kernel``.

Inputs of at most ``ONE_LAUNCH_MAX_ELEMENTS`` take one launch: ``nvfp4_quantize_kernel`` alone, one program whose
tile is all of x, the global amax taken from the tile it has loaded (M = 1 at K = 8192, where each launch costs
~1.5 us of GPU time against a few hundred ns of work). Larger inputs take the first one-launch form that fits
(the package's ``QUANTIZE_FORMS``): on sm_90, x padded to at most 16 tiles of 8192 elements (M <= 16 at K = 8192)
takes one launch of CLUSTER_CTAS programs that form one thread-block cluster and exchange their tile maxima
through distributed shared memory (AMAX "cluster", ``_cluster_max``: no global-memory barrier); then, on any
device, an x of at most ``READ_ALL_MAX_ELEMENTS`` elements (M <= 8) takes several programs, each of which reads
all of x for the amax and quantizes its own tile (AMAX "read_all"); then, on a GPU, tiles that fit one wave of
programs (no more than the SM count: M <= 256 at K = 8192 on an H200) take one cooperative launch (AMAX
"grid_sync"): each program loads its tile, and the programs meet at a grid barrier (``_grid_max``) for the
global amax before they quantize it. Larger inputs, and under the CPU interpreter those above the read-all size,
take two (AMAX "launch"):

1. ``amax_kernel``: per program, max |x| over a grid-stride slice as fp32 bit patterns (int32 max of the
   sign-cleared bits: exact), one partial per program (no atomics; max is order-free: deterministic).
2. ``nvfp4_quantize_kernel``: every program reduces the partials to the global amax, derives the global
   encode/decode scales and quantizes its [BLOCK_R, BLOCK_C] tile, 16-element blocks along K, with the "sol"
   recipe (fp4ref.blockscale, recipe "sol": SOL-ExecBench nvfp4_linear_layer's quantizer): IEEE divisions (div.rn,
   no FTZ), the E4M3 rounding in integer arithmetic, the E2M1 rounding by an exact magic add. Writes packed E2M1
   codes + E4M3FN block-scale bytes (``nvfp4_quantize``) or, for the linear layer, the dequantized values
   code * block scale (fp16 or fp32, exact) and the epilogue scale.

Triton behaviour worked around (docs/kernels.md): the CPU interpreter's fp32 -> fp8 conversion and bf16 -> fp32
widening of subnormals are wrong, so the codes come from integer arithmetic and bf16 is widened by its bits; fp32
division is not correctly rounded by default, so the recipe's divisions are tl.math.div_rn.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .._runtime import Launch, interpreting
from .configs import CLUSTER_CTAS, READ_ALL_MAX_ELEMENTS, QuantizeConfig
from .decode import e4m3_byte_to_fp32

__all__ = ["AMAX_BLOCK", "AMAX_MAX_PROGRAMS", "BARRIER_WORDS", "ONE_LAUNCH_MAX_ELEMENTS", "QuantizeLaunches",
           "amax_kernel", "nvfp4_quantize_kernel", "one_launch_tile"]

AMAX_BLOCK = 8192  # elements per program per amax step (32 per thread: 4 x 16-byte loads in flight)
AMAX_MAX_PROGRAMS = 512  # partials (power of two; the quantize kernel reduces them all)
BARRIER_WORDS = 2  # the grid-barrier form's words (arrival count, generation), after the partials
# Largest x (next_power_of_2(M) x next_power_of_2(K) elements) quantized by one launch of one program: 8 elements
# (one 16-byte load of bf16) per thread at 32 warps. H200, CUPTI, L2 flushed, K = 8192: M = 1 one launch 2.6-2.7 us
# against 3.2 for two; M = 2 and 4 one launch 4.0 and 5.8 us against 3.3 and 3.9 (one SM's latency chain grows
# with x; programs that each read all of x for the amax and quantize a 2048-column tile: 3.3 and 4.4 us)
ONE_LAUNCH_MAX_ELEMENTS = 8192


def one_launch_tile(M: int, K: int):
    """(BLOCK_R, BLOCK_C, num_warps) of the one-launch quantizer for x [M, K]: the whole of x padded to powers of
    two (at least 256 columns), 8 elements per thread (the launch is latency-bound: as many warps as that gives, up
    to 32; no thread without elements); None when that tile exceeds ONE_LAUNCH_MAX_ELEMENTS."""
    block_r, block_c = triton.next_power_of_2(M), max(triton.next_power_of_2(K), 256)
    if block_r * block_c > ONE_LAUNCH_MAX_ELEMENTS:
        return None
    return block_r, block_c, min(32, block_r * block_c // 256)


@triton.jit
def _widen_to_fp32(x):
    """Exact fp32 value of x (fp32 / bf16 / fp16). bf16 by its bits (<< 16): exact for every input, also where
    the CPU interpreter's bf16 -> fp32 conversion is wrong (it maps bf16 subnormals to 2^-127)."""
    if x.dtype == tl.bfloat16:
        # zero-extended (uint16 -> uint32), not sign-extended: one instruction on sm_90 instead of three
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def amax_kernel(
    x_ptr,  # *fp32|bf16|fp16, numel contiguous elements
    part_ptr,  # *i32 [>= num_programs]: this program's max |x| as fp32 bits, at part_ptr[program id]
    numel,
    ITERS,  # grid-stride steps per program
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    best = tl.zeros([BLOCK], dtype=tl.int32)
    for it in range(0, ITERS):
        idx = (it * nprog + pid).to(tl.int64) * BLOCK + offs
        x = _widen_to_fp32(tl.load(x_ptr + idx, mask=idx < numel, other=0.0))
        # |x| as bits: clearing the sign bit orders non-negative floats like integers (NaN bits exceed +inf)
        best = tl.maximum(best, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
    # one partial per program, no atomics and nothing to reset: the quantize kernel takes the max of all partials
    # (max is order-free: deterministic)
    tl.store(part_ptr + pid, tl.max(best, axis=0))


@triton.jit
def _e4m3_rne_byte(s):
    """E4M3FN byte (RNE) of s, fp32 in [0, 448]; integer arithmetic on the fp32 bits (exact, FTZ-free)."""
    sb = s.to(tl.int32, bitcast=True)
    e = sb >> 23  # biased fp32 exponent (s >= 0)
    mant = (sb & 0x7FFFFF) | tl.where(e > 0, 0x800000, 0)  # 24-bit significand; s = mant * 2^(max(e,1) - 150)
    e = tl.maximum(e, 1)
    # E4M3 grid step: 2^(max(E, -6) - 3) for s in [2^E, 2^(E+1)); in units of the fp32 significand LSB that is
    # 2^shift with shift = 20 (normal E4M3, e >= 121) or 141 - e (E4M3 subnormals, step 2^-9). Capped at 30:
    # mant < 2^24 < 2^29 = half-step, so the result is 0 either way.
    shift = tl.minimum(tl.where(e >= 121, 20, 141 - e), 30)
    q = mant >> shift
    rem = mant & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)  # ties to even
    # normal: ((e - 120) << 3) + (q - 8); a carry q = 16 bumps the exponent naturally. Subnormal: q (q = 8 -> 2^-6).
    return tl.where(e >= 121, ((e - 120) << 3) + q - 8, q)



@triton.jit
def _grid_max(part_ptr, bits, me, nprog, AMAX_PARTS: tl.constexpr):
    """The max over the grid of every program's ``bits`` (int32 >= 0), by a barrier every program of the launch
    meets. The launch must be cooperative (all programs resident at once), or the waiting programs may keep the
    others from starting. part_ptr[me] takes this program's value; part_ptr[AMAX_PARTS] counts arrivals and
    part_ptr[AMAX_PARTS + 1] is the barrier's generation: both start at 0 (a zeroed workspace). The last to arrive
    sets the count back to 0 and then bumps the generation (release); the others wait for the bump (acquire), so
    every partial is visible to every program and the words are ready for the next launch of any grid size."""
    tl.store(part_ptr + me, bits, cache_modifier=".cg")
    # the generation before this program arrives: the bump that releases it comes after its own arrival
    gen = tl.atomic_add(part_ptr + AMAX_PARTS + 1, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()  # the partial's store (whichever thread made it) precedes the arrival
    arrived = tl.atomic_add(part_ptr + AMAX_PARTS, 1, sem="acq_rel", scope="gpu")
    if arrived == nprog - 1:
        tl.atomic_xchg(part_ptr + AMAX_PARTS, 0, sem="relaxed", scope="gpu")
        tl.atomic_add(part_ptr + AMAX_PARTS + 1, 1, sem="release", scope="gpu")
    else:
        cur = tl.atomic_add(part_ptr + AMAX_PARTS + 1, 0, sem="acquire", scope="gpu")
        while cur == gen:
            cur = tl.atomic_add(part_ptr + AMAX_PARTS + 1, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
    idx = tl.arange(0, AMAX_PARTS)
    # L2 reads (.cg): this SM's L1 may hold an earlier launch's partials
    return tl.max(tl.load(part_ptr + idx, mask=idx < nprog, other=0, cache_modifier=".cg"), axis=0)


@triton.jit
def _cluster_arrive(C: tl.constexpr):
    """The cluster form's start (every thread): declare the C amax slots (static shared memory, at the same
    address in every CTA) and arrive on the cluster barrier (relaxed) that ``_cluster_max`` waits for before it
    writes into the other CTAs' slots (their shared memory exists only once they run)."""
    tl.inline_asm_elementwise(f".shared .align 16 .b32 fp4ref_amax_slots[{C}];\n"
                              "barrier.cluster.arrive.relaxed.aligned;\nmov.u32 $0, 0;",
                              "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.constexpr_function
def _cluster_max_ptx(C):
    """``_cluster_max``'s PTX: wait for every CTA of the cluster to run; thread t < C stores this CTA's value
    ($1) into slot [rank] of CTA t (st.shared::cluster); a release / acquire cluster barrier; the max of the
    C local slots (unsigned: the values are sign-cleared fp32 bits) into $0."""
    lines = ["{", ".reg .u32 %t, %a, %r;", f".reg .u32 %v<{C}>;", ".reg .pred %p;",
             "barrier.cluster.wait.aligned;",
             "mov.u32 %t, %tid.x;", f"setp.lt.u32 %p, %t, {C};", "mov.u32 %r, %cluster_ctarank;",
             "mov.u32 %a, fp4ref_amax_slots;", "mad.lo.u32 %a, %r, 4, %a;",
             "@%p mapa.shared::cluster.u32 %a, %a, %t;", "@%p st.shared::cluster.u32 [%a], $1;",
             "barrier.cluster.arrive.release.aligned;", "barrier.cluster.wait.acquire.aligned;",
             "mov.u32 %a, fp4ref_amax_slots;"]
    lines += [f"ld.shared.u32 %v{i}, [%a+{4 * i}];" for i in range(C)]
    lines += ["mov.u32 $0, %v0;"] + [f"max.u32 $0, $0, %v{i};" for i in range(1, C)] + ["}"]
    return "\n".join(lines)


@triton.jit
def _cluster_max(bits, C: tl.constexpr):
    """The max over the C CTAs of this CTA's cluster of every CTA's ``bits`` (int32 >= 0), through distributed
    shared memory (after ``_cluster_arrive``). No global memory: no grid barrier, no workspace words."""
    return tl.inline_asm_elementwise(_cluster_max_ptx(C), "=r,r", [bits], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def nvfp4_quantize_kernel(
    x_ptr,  # *fp32|bf16|fp16 [M, K] row-major (contiguous)
    amax_ptr,  # *i32 [n_amax] per-program max |x| (fp32 bits) from amax_kernel
    q_ptr,  # *u8 [M, K/2] packed E2M1 codes (element 2i in bits 3:0)         (WRITE_PACKED)
    s_ptr,  # *u8 [M, K/16] E4M3FN block-scale bytes                          (WRITE_PACKED)
    deq_ptr,  # *fp16|bf16 [M, K] code value * block scale (exact in both)     (WRITE_DEQUANT)
    gdec_ptr,  # *fp32 [2]: [0] global decode scale, [1] fp32(global decode * w_gdec) (the GEMM epilogue scale)
    w_gdec,  # fp32 weight global decode scale (for gdec_ptr[1]; 1.0 for nvfp4_quantize)
    M,
    K,
    stride_xm,
    n_amax,  # number of amax partials (<= AMAX_PARTS)
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,  # multiple of 16
    WRITE_PACKED: tl.constexpr,
    WRITE_DEQUANT: tl.constexpr,
    AMAX_PARTS: tl.constexpr = 512,
    # WRITE_DEQUANT in the Gluon path's K order: within each 256-element chunk, physical element
    # p = 64 q + 8 ih + 4 j1 + 2 j0 + il goes to column 32 ih + 16 il + 8 j1 + 2 q + j0 (gluon.py; BLOCK_C % 256
    # == 0)
    PERMUTE_K: tl.constexpr = False,
    # one-launch form (small x): one program whose tile is all of x takes the global amax from that tile (no
    # amax_kernel launch; amax_ptr and n_amax unused)
    SELF_AMAX: tl.constexpr = False,
    # grid-barrier form (x up to a grid of one wave): each program's tile max goes to amax_ptr[program], the programs
    # meet at a grid barrier (a cooperative launch: all resident; the barrier's words follow the partials), then
    # each takes the max of all partials. Not under the CPU interpreter (it runs programs one after another).
    GRID_SYNC: tl.constexpr = False,
    # let the next kernel, launched with programmatic dependent launch (the Gluon GEMM), start: 1 first thing (it
    # loads W while this kernel runs), 2 after this program's stores (it launches as this grid drains); it waits
    # for this grid's completion (griddepcontrol.wait) before it reads x or gdec. 0: no trigger.
    TRIGGER_DEPENDENTS: tl.constexpr = 0,
    # WRITE_PACKED with the codes as one signed byte per element, 2 x E2M1 value (-12..12, exact; -0 -> 0), in
    # q_ptr [M, K] instead of two codes per byte: the DP4A path's integer operand (dp4a.py)
    INT8_CODES: tl.constexpr = False,
    # read-all form (small x): every program loads all of x, padded to READ_ALL_R x READ_ALL_C (powers of two), for
    # the global amax, then quantizes its own tile (no barrier, no amax_kernel launch; amax_ptr and n_amax unused).
    # 0: another form
    READ_ALL_R: tl.constexpr = 0,
    READ_ALL_C: tl.constexpr = 0,
    # cluster form: the grid is one thread-block cluster of CLUSTER_CTAS programs (one grid dimension, numbered
    # row-major over [row tiles, column tiles]) that exchange their tile maxima through distributed shared memory
    # (``_cluster_max``); needs sm_90 and a launch with that cluster size (``Launch(cluster=...)``). 0: another form
    CLUSTER_CTAS: tl.constexpr = 0,
):
    if TRIGGER_DEPENDENTS == 1:
        tl.extra.cuda.gdc_launch_dependents()
    if CLUSTER_CTAS > 0:
        _cluster_arrive(CLUSTER_CTAS)
        n_c = tl.cdiv(K, BLOCK_C)
        pid_r = tl.program_id(0) // n_c
        pid_c = tl.program_id(0) % n_c
    else:
        pid_r = tl.program_id(0)
        pid_c = tl.program_id(1)
    NB: tl.constexpr = BLOCK_C // 16
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < M) & (cols[None, :] < K)  # K % 16 == 0: a block is all in or all out
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=mask, other=0.0)
    x = _widen_to_fp32(x).reshape(BLOCK_R, NB, 16)
    # block amax as |x| bits (exact; NaN bits exceed +inf, as in amax_kernel)
    bbits = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2)

    # --- global scales (the recipe, fp32, IEEE division) -------------------------------------------------------
    if SELF_AMAX:  # this program's tile is all of x
        amax = tl.max(tl.max(bbits, axis=1), axis=0).to(tl.float32, bitcast=True)
    elif READ_ALL_R > 0:  # every program reads all of x (small: mostly L2 hits) for the amax
        ar = tl.arange(0, READ_ALL_R)
        ac = tl.arange(0, READ_ALL_C)
        xa = tl.load(x_ptr + ar[:, None].to(tl.int64) * stride_xm + ac[None, :],
                     mask=(ar[:, None] < M) & (ac[None, :] < K), other=0.0)
        abits = _widen_to_fp32(xa).to(tl.int32, bitcast=True) & 0x7FFFFFFF
        amax = tl.max(tl.max(abits, axis=1), axis=0).to(tl.float32, bitcast=True)
    elif CLUSTER_CTAS > 0:  # one cluster: every CTA is resident, and the maxima meet in shared memory
        amax = _cluster_max(tl.max(tl.max(bbits, axis=1), axis=0), CLUSTER_CTAS).to(tl.float32, bitcast=True)
    elif GRID_SYNC:  # every program is resident (cooperative launch): they meet at a grid barrier
        amax = _grid_max(amax_ptr, tl.max(tl.max(bbits, axis=1), axis=0), pid_r * tl.num_programs(1) + pid_c,
                         tl.num_programs(0) * tl.num_programs(1), AMAX_PARTS).to(tl.float32, bitcast=True)
    else:
        parts = tl.load(amax_ptr + tl.arange(0, AMAX_PARTS), mask=tl.arange(0, AMAX_PARTS) < n_amax, other=0)
        amax = tl.max(parts, axis=0).to(tl.float32, bitcast=True)  # integer max of the sign-cleared bits: exact
    genc = tl.math.div_rn(tl.full([], 2688.0, tl.float32), amax)  # (448 * 6) / amax; amax = 0 -> +inf
    genc = tl.minimum(genc, 3.4028234663852886e38)  # clamp to the fp32 max
    genc = tl.where(genc == 0.0, 1.0, genc)  # amax = +inf -> 0 -> 1 (TransformerEngine's rule)
    gdec = tl.math.div_rn(tl.full([], 1.0, tl.float32), genc)
    if (pid_r == 0) & (pid_c == 0):
        tl.store(gdec_ptr, gdec)
        tl.store(gdec_ptr + 1, gdec * w_gdec)  # fp32 RNE (no FMA contraction: enable_fp_fusion=False)

    # --- the tile: block scale = (block_amax / 6) * global_encode, clamp 448, E4M3 RNE ----------------------------
    bamax = bbits.to(tl.float32, bitcast=True)
    s = tl.math.div_rn(bamax, tl.full([BLOCK_R, NB], 6.0, tl.float32)) * genc
    s = tl.minimum(s, 448.0)  # s >= 0; the -448 side of the clamp never applies
    sbyte = _e4m3_rne_byte(s)
    sval = e4m3_byte_to_fp32(sbyte)

    # element encode = min(1 / (float(block_scale) * global_decode), fp32 max); element = x * encode
    enc = tl.minimum(tl.math.div_rn(tl.full([BLOCK_R, NB], 1.0, tl.float32), sval * gdec), 3.4028234663852886e38)
    y = x * enc[:, :, None]

    # E2M1 RNE of clamp(y, -6, 6), on a = |y| clamped (8 instructions per element on sm_90):
    #   the E2M1 grid step in a's binade is 2^(e-1), e = max(exponent of a, 0) (0.5 below 2, 1 in [2, 4), 2 in
    #   [4, 6]); C = 2^(e+22) has that ulp, so r = (a + C) - C is a rounded to the grid, ties to even (an even
    #   multiple of the step is an even code: 2.5 -> 2, 3.5 -> 4, 5 -> 4, 0.25 -> 0, 0.75 -> 1, 1.25 -> 1), and
    #   the subtraction is exact. r in {0, 0.5, 1, 1.5, 2, 3, 4, 6}; r * 2^-126 is exactly the fp32 whose bits
    #   >> 22 are the E2M1 magnitude code (0.5 -> the subnormal 2^-127 = 0x00400000 -> 1; 1 -> 2^-126 -> 2; ...;
    #   6 -> 1.5 * 2^-124 -> 7). Needs IEEE adds (no reassociation: no fast-math in Triton) and no FTZ on the
    #   multiply (the kernel is built with enable_reflect_ftz=False; the sm_90 compile test checks the PTX).
    # Sign bit iff y < 0: [-0.25, 0) -> code 8, -0.0 -> 0 (the recipe's comparison cast). NaN: outside the contract.
    a = tl.minimum(tl.abs(y), 6.0)
    cb = (tl.maximum(a, 1.0).to(tl.int32, bitcast=True) & 0x7F800000) + (22 << 23)
    c = cb.to(tl.float32, bitcast=True)
    r = (a + c) - c
    mag = (r * 1.1754943508222875e-38).to(tl.int32, bitcast=True) >> 22  # r * 2^-126
    neg = y < 0.0
    code = mag | tl.where(neg, 8, 0)

    if WRITE_PACKED and INT8_CODES:
        v2 = (r * 2.0).to(tl.int32)  # 2 x the E2M1 magnitude: an integer 0..12
        v8 = tl.where(neg, -v2, v2).to(tl.int8)
        tl.store(q_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], v8.reshape(BLOCK_R, BLOCK_C), mask=mask)
    if WRITE_PACKED and not INT8_CODES:
        code2 = code.reshape(BLOCK_R, BLOCK_C // 2, 2)
        lo, hi = tl.split(code2)
        packed = (lo | (hi << 4)).to(tl.uint8)
        pcols = pid_c * (BLOCK_C // 2) + tl.arange(0, BLOCK_C // 2)
        pmask = (rows[:, None] < M) & (pcols[None, :] < K // 2)
        tl.store(q_ptr + rows[:, None].to(tl.int64) * (K // 2) + pcols[None, :], packed, mask=pmask)
    if WRITE_PACKED:
        bcols = pid_c * NB + tl.arange(0, NB)
        bmask = (rows[:, None] < M) & (bcols[None, :] < K // 16)
        tl.store(s_ptr + rows[:, None].to(tl.int64) * (K // 16) + bcols[None, :], sbyte.to(tl.uint8), mask=bmask)
    if WRITE_DEQUANT:
        # E2M1 value of the code (the rounded |y|), sign, times the block scale: exact in fp32 and in fp16
        v = (tl.where(neg, -r, r) * sval[:, :, None]).to(deq_ptr.dtype.element_ty)
        if PERMUTE_K:
            # within each 256 chunk p = 64 q + 8 ih + 4 j1 + 2 j0 + il -> column 32 ih + 16 il + 8 j1 + 2 q + j0 (the
            # Gluon kernel's decode pairs codes of the same parity, gluon.py): axes (q, ih, j1, j0, il)
            # -> (i, j1, q, j0), reordered in registers so that the store stays contiguous (wide stores)
            v = v.reshape(BLOCK_R, BLOCK_C // 256, 4, 8, 2, 2, 2).permute(0, 1, 3, 6, 4, 2, 5)
        tl.store(deq_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], v.reshape(BLOCK_R, BLOCK_C), mask=mask)
    if TRIGGER_DEPENDENTS == 2:
        tl.extra.cuda.gdc_launch_dependents()



class QuantizeLaunches:
    """The launches that quantize x [M, K] (contiguous), by ``config.AMAX``: "launch", ``amax_kernel`` +
    ``nvfp4_quantize_kernel`` with ``config``'s tile; "grid_sync", ``nvfp4_quantize_kernel`` alone, one cooperative
    launch; "read_all", ``nvfp4_quantize_kernel`` alone, every program reading all of x for the amax; "cluster",
    ``nvfp4_quantize_kernel`` alone, CLUSTER_CTAS programs launched as one thread-block cluster (sm_90); or
    (``config`` None and ``one_launch_tile(M, K)`` not None) ``nvfp4_quantize_kernel`` alone with one program over
    all of x.

    ``write_packed``: codes + scale bytes (``nvfp4_quantize``); ``write_dequant``: code * block scale into
    ``deq`` (the linear paths); ``int8_codes`` (with ``write_packed``): the codes as one signed byte per element, 2 x
    E2M1 value, into ``q`` [M, K] (the DP4A path); ``permute_k``: ``deq`` in the Gluon path's K order (K and BLOCK_C
    multiples of 256; ValueError otherwise); ``trigger_dependents``: the quantize launch lets a following kernel
    launched with programmatic dependent launch start when each program starts (1) or after its stores (2); 0 never (GPU
    only: the interpreter has no griddepcontrol). ``run(stream, x, parts, q, s, deq, gdec, w_gdec)``: ``parts`` int32
    [>= AMAX_MAX_PROGRAMS + BARRIER_WORDS] amax partials and, after them, the grid barrier's words (zero before the
    first launch; every launch leaves the count at zero); ``gdec`` fp32 [2] receives [x global decode,
    fp32(x global decode * w_gdec)]; unused outputs may be any tensor (``gdec``). Every form writes the same
    bytes.

    Raises:
        ValueError: ``config`` None where x is too large for one launch; ``permute_k`` with K or BLOCK_C not a
            multiple of 256; ``trigger_dependents`` not 0, 1 or 2; ``int8_codes`` without ``write_packed``;
            AMAX "grid_sync" under the CPU interpreter (its programs run one after another: the barrier would never
            open) or with a grid of more than ``max_programs`` programs; AMAX "read_all" for an x of more than
            ``READ_ALL_MAX_ELEMENTS`` elements padded to powers of two; AMAX "cluster" under the CPU interpreter or
            with more tiles than CLUSTER_CTAS.
    """

    __slots__ = ("amax", "quant", "numel", "iters", "nprog", "M", "K")

    def __init__(self, M: int, K: int, config: QuantizeConfig | None, write_packed: bool, write_dequant: bool,
                 permute_k: bool = False, trigger_dependents: int = 0, int8_codes: bool = False,
                 max_programs: int | None = None):
        if config is None:
            tile = one_launch_tile(M, K)
            if tile is None:
                raise ValueError(f"M={M}, K={K}: more than {ONE_LAUNCH_MAX_ELEMENTS} elements (padded) for one "
                                 "launch; pass a QuantizeConfig")
            block_r, block_c, num_warps = tile
        else:
            block_r, block_c, num_warps = config.BLOCK_R, config.BLOCK_C, config.num_warps
        if trigger_dependents not in (0, 1, 2) or isinstance(trigger_dependents, bool):
            raise ValueError(f"trigger_dependents={trigger_dependents!r}: expected 0, 1 or 2")
        if int8_codes and not write_packed:
            raise ValueError("int8_codes=True: the int8 codes replace the packed codes; it needs write_packed=True")
        if permute_k and (K % 256 or block_c % 256):
            raise ValueError(f"K={K}, BLOCK_C={block_c}: the permuted K order needs both multiples of 256")
        self.M, self.K, self.numel = M, K, M * K
        grid = (triton.cdiv(M, block_r), triton.cdiv(K, block_c))
        form = "one" if config is None else config.AMAX
        grid_sync = form == "grid_sync"
        if form in ("grid_sync", "cluster") and interpreting():
            raise ValueError(f"AMAX={form!r}: the CPU interpreter runs programs one after another, so a "
                             f"{'grid barrier' if grid_sync else 'cluster exchange'} never completes; use the "
                             "'launch' or 'read_all' form")
        cluster = CLUSTER_CTAS if form == "cluster" else 0
        if cluster and grid[0] * grid[1] > cluster:
            raise ValueError(f"AMAX='cluster': a grid of {grid[0] * grid[1]} programs for x [{M}, {K}] exceeds "
                             f"the cluster of CLUSTER_CTAS = {cluster} (see cluster_config)")
        cap = min(AMAX_MAX_PROGRAMS, max_programs or AMAX_MAX_PROGRAMS)
        if grid_sync and grid[0] * grid[1] > cap:
            raise ValueError(f"AMAX='grid_sync': a grid of {grid[0] * grid[1]} programs for x [{M}, {K}] exceeds "
                             f"{cap} (the SM count or AMAX_MAX_PROGRAMS): a cooperative launch needs every program "
                             "resident")
        read_all = (triton.next_power_of_2(M), triton.next_power_of_2(K)) if form == "read_all" else (0, 0)
        if read_all[0] * read_all[1] > READ_ALL_MAX_ELEMENTS:
            raise ValueError(f"AMAX='read_all': x [{M}, {K}] pads to {read_all[0] * read_all[1]} elements, more "
                             f"than READ_ALL_MAX_ELEMENTS = {READ_ALL_MAX_ELEMENTS} (each program holds all of x)")
        self.nprog = min(triton.cdiv(self.numel, AMAX_BLOCK), AMAX_MAX_PROGRAMS)
        self.iters = triton.cdiv(self.numel, self.nprog * AMAX_BLOCK)
        self.amax = None if form != "launch" else Launch(amax_kernel, (self.nprog,), {"BLOCK": AMAX_BLOCK},
                                                          num_warps=8)
        options = {"launch_cooperative_grid": True} if grid_sync else {"cluster": cluster} if cluster else {}
        self.quant = Launch(
            nvfp4_quantize_kernel, (cluster,) if cluster else grid,
            dict(BLOCK_R=block_r, BLOCK_C=block_c, WRITE_PACKED=write_packed, WRITE_DEQUANT=write_dequant,
                 AMAX_PARTS=AMAX_MAX_PROGRAMS, PERMUTE_K=permute_k, SELF_AMAX=form == "one", GRID_SYNC=grid_sync,
                 TRIGGER_DEPENDENTS=trigger_dependents, INT8_CODES=int8_codes, READ_ALL_R=read_all[0],
                 READ_ALL_C=read_all[1], CLUSTER_CTAS=cluster),
            num_warps=num_warps, enable_fp_fusion=False, enable_reflect_ftz=False, **options)

    @property
    def launches(self) -> int:
        """Kernel launches per ``run``: 1 or 2."""
        return 1 if self.amax is None else 2

    def run(self, stream: int, x, parts, q, s, deq, gdec, w_gdec: float) -> None:
        if self.amax is not None:
            self.run_amax(stream, x, parts)
        self.run_quant(stream, x, parts, self.nprog, q, s, deq, gdec, w_gdec)

    def run_amax(self, stream: int, x, parts) -> None:
        """The amax launch alone: ``self.nprog`` partials of max |x| over all of x into ``parts``."""
        self.amax.launch(stream, x, parts, self.numel, self.iters)

    def run_quant(self, stream: int, x, parts, n_amax: int, q, s, deq, gdec, w_gdec: float) -> None:
        """The quantize launch alone, its global amax the max of ``parts[:n_amax]``: with the partials of a larger
        tensor, ``x`` may be a block of its rows (nvfp4_linear's row chunks)."""
        self.quant.launch(stream, x, parts, q, s, deq, gdec, w_gdec, self.M, self.K, self.K, n_amax)
