"""DP4A path of nvfp4_linear (``Dp4aConfig``, a few rows of x on sm_90): integer dot products of E2M1 codes on
the CUDA cores, one fp32 term per 16-element block.

At M <= 8 the call streams W (0.56 byte per weight) and does a few multiply-adds per weight byte. The tensor-core
path (gluon.py) decodes each W code to fp16 for wgmma, and at M = 1 that decode -> wgmma -> wait chain costs
~6 us over the bare read of W (docs/benchmarks.md). This path never leaves the integers until a whole NVFP4
block is summed:

* every E2M1 code, of W and of x, is an integer once doubled: 2 E2M1(c) in {0, +-1, +-2, +-3, +-4, +-6, +-8,
  +-12}. x comes from the quantizer as such bytes (``INT8_CODES``, one per element); W's packed codes are turned
  into them in registers, 11 instructions per word of 8 codes (``DECODE_INT8_PTX``: two ``prmt`` table lookups,
  positive and negative, a ``prmt`` that spreads the 4 sign bits into byte masks, a ``lop3`` select);
* ``dp4a.s32.s32`` multiplies 4 byte pairs and adds them to an int32: the 16-element block's dot product
  sum (2 c_w)(2 c_x) = 4 sum c_w c_x is an exact integer, |.| <= 16 * 144 = 2304;
* per block, in fp32: dot * (s_w * s_x) with the E4M3 block scales of W and x (<= 4 significant bits each; the
  product is exact, >= 2^-18) has <= 20 significant bits: EXACT, 4 x the block's dot product of the dequantized
  values (without the global scales). Only the K/16 block terms are added with rounding (fp32 RN), the same
  model as the GEMV path: ``splitk(fp32_rn_block16, C)`` (configs.accumulation_model);
* the accumulator is multiplied by 1/4 at the end (exact), then kernels/_gluon.py's epilogue: the fixed-order
  split-K sum, acc * fp32(x_gdec * w_gdec) (fp32 RN) and one RNE rounding to bf16.

Data movement, warp-specialized: a 1-warp producer fills a TMA ring of STAGES 256-element K steps ("ready"
mbarriers), each slot holding W codes [BN, 128] bytes, W block scales [BN, 16], x codes [BM, 256] (signed bytes)
and x block scales (rows of x past M are zero-filled: their products are 0 and never stored); the num_warps
consumer warps read a slot into registers and hand it back ("empty" mbarriers), then compute from registers. (A
loop in which the consumers issue the copies themselves pays a CTA barrier before every copy in Gluon 3.6.) A
consumer thread owns 16 contiguous W code bytes (two NVFP4 blocks) of BN / (4 num_warps) rows per step and the
matching 32 x bytes of every row of x, so one decoded W word feeds BM dp4a. Under nvfp4_linear the kernel starts
under the quantizer (programmatic dependent launch): the producer issues the W part of its first STAGES steps,
then waits for the quantizer's grid (griddepcontrol.wait) before it loads x; the consumers wait too before they
read the epilogue scale.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .._gluon import (invalidate_ring, ring_barriers, store_layout, store_or_reduce, wait_primary,
                      workspace_elements)
from .._runtime import Desc, Launch
from .configs import Dp4aConfig
from .tensorcore import splitk_buffers

__all__ = ["DECODE_INT8_PTX", "Dp4aLaunch", "E2M1_X2", "EPILOGUE_M", "STEP_K", "nvfp4_dp4a_kernel", "shared_layouts"]

STEP_K = 256  # K elements per ring slot
EPILOGUE_M = 8  # the c^T tile width of the shared epilogue (columns past BM are masked)

# One word of 8 packed E2M1 codes (element j in bits 4j+3:4j) -> two words of 4 signed bytes 2 E2M1(c) (byte i =
# element i of codes 0-3, then 4-7). prmt's selector nibble: bits 2:0 pick a byte of {b, a}; bit 3 replicates
# that byte's sign bit instead. With the sign bits cleared (idx) the two table lookups give |2 E2M1| and -|2 E2M1|
# for four codes at once; the mask lookup picks, from {w << 4, w}, the byte whose top bit is element i's sign
# (elements 0, 2, 4, 6: bit 3 + 8 i' of w, moved to a byte's top by the shift; 1, 3, 5, 7: already there) in
# replicate mode, giving 0xFF / 0x00 per byte; lop3 0xD8 = (pos & ~mask) | (neg & mask).
DECODE_INT8_PTX = gl.constexpr("""
{
.reg .b32 w, idx, idh, sh, p, n, m;
mov.b32 w, $2;
and.b32 idx, w, 0x77777777;
shr.u32 idh, idx, 16;
shl.b32 sh, w, 4;
prmt.b32 p, $3, $4, idx;
prmt.b32 n, $5, $6, idx;
prmt.b32 m, sh, w, 0xD9C8;
lop3.b32 $0, p, n, m, 0xD8;
prmt.b32 p, $3, $4, idh;
prmt.b32 n, $5, $6, idh;
prmt.b32 m, sh, w, 0xFBEA;
lop3.b32 $1, p, n, m, 0xD8;
}
""")


def _table_words(values) -> tuple[int, int]:
    """Eight table bytes (index 0-7) as prmt's two source words, signed int32."""
    b = bytes(v & 0xFF for v in values)
    return int.from_bytes(b[:4], "little", signed=True), int.from_bytes(b[4:], "little", signed=True)


# 2 E2M1(m) for the magnitude index m = 0..7 (E2M1 0, 0.5, 1, 1.5, 2, 3, 4, 6), and its negation
E2M1_X2 = (0, 1, 2, 3, 4, 6, 8, 12)
TABLE_WORDS = gl.constexpr(_table_words(E2M1_X2) + _table_words([-v for v in E2M1_X2]))


def shared_layouts():
    """The TMA destinations' layouts: W codes, W scales, x codes and x scales, all unswizzled bytes (the threads
    read 16-byte pieces of whole 128- or 256-byte rows: no bank conflicts)."""
    return (gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2),) * 4


@gluon.jit
def _decode_int8(words, tables):
    """int32 words of 8 E2M1 codes -> (codes 0-3, codes 4-7) as words of 4 signed bytes 2 E2M1(c); ``tables``:
    the four TABLE_WORDS as int32 scalars."""
    t0, t1, t2, t3 = tables
    return gl.inline_asm_elementwise(DECODE_INT8_PTX, "=r,=r,r,r,r,r,r", [words, t0, t1, t2, t3],
                                     dtype=(gl.int32, gl.int32), is_pure=True, pack=1)


@gluon.jit
def _dp4a(a, b, c):
    """c + the dot product of a's and b's 4 signed bytes (int32, exact)."""
    return gl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _zero_pad_cols(t, BN: gl.constexpr, W: gl.constexpr):
    """[BN, W] -> [BN, 2 W]: t, then W columns of zeros."""
    return gl.reshape(gl.permute(gl.join(t, gl.zeros_like(t)), [0, 2, 1]), [BN, 2 * W])


@gluon.jit
def _issue_step(w_desc, s_desc, x_desc, xs_desc, w_smem, s_smem, x_smem, xs_smem, bar, off_n, off_m, k, pred,
                WITH_X: gl.constexpr):
    """TMA (when ``pred``): W codes and block scales of the 256-K step at k into one ring slot, and with
    ``WITH_X`` its x codes and x block scales (the slot's barrier always counts all four; without ``WITH_X`` the
    caller issues x later, ``_issue_step_x``)."""
    nbytes: gl.constexpr = (w_desc.block_type.nbytes + s_desc.block_type.nbytes + x_desc.block_type.nbytes
                            + xs_desc.block_type.nbytes)
    mbarrier.expect(bar, nbytes, pred=pred)
    tma.async_copy_global_to_shared(w_desc, [off_n, k // 2], bar, w_smem, pred=pred)
    tma.async_copy_global_to_shared(s_desc, [off_n, k // 16], bar, s_smem, pred=pred)
    if WITH_X:
        _issue_step_x(x_desc, xs_desc, x_smem, xs_smem, bar, off_m, k, pred)


@gluon.jit
def _issue_step_x(x_desc, xs_desc, x_smem, xs_smem, bar, off_m, k, pred):
    """TMA (when ``pred``): x codes [BM, 256] and x block scales [BM, 16] of the step at k into a slot whose
    barrier already expects them."""
    tma.async_copy_global_to_shared(x_desc, [off_m, k], bar, x_smem, pred=pred)
    tma.async_copy_global_to_shared(xs_desc, [off_m, k // 16], bar, xs_smem, pred=pred)


@gluon.jit
def _producer(w_desc, s_desc, x_desc, xs_desc, w_smem, s_smem, x_smem, xs_smem, ready, empty, off_n, off_m, k0,
              k_steps, BM: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr):
    """Producer partition (1 warp): the ring's TMA loads. The first STAGES steps go out at once (PDL: their W part
    before griddepcontrol.wait, x after it); step j >= STAGES waits until the consumers have read step j -
    STAGES from its slot."""
    BK: gl.constexpr = 256
    for i in gl.static_range(STAGES):
        _issue_step(w_desc, s_desc, x_desc, xs_desc, w_smem.index(i), s_smem.index(i), x_smem.index(i),
                    xs_smem.index(i).slice(0, BM), ready.index(i), off_n, off_m, k0 + i * BK, i < k_steps, not PDL)
    if PDL:
        wait_primary()
        for i in gl.static_range(STAGES):
            _issue_step_x(x_desc, xs_desc, x_smem.index(i), xs_smem.index(i).slice(0, BM), ready.index(i), off_m,
                          k0 + i * BK, i < k_steps)
    for j in range(STAGES, k_steps):
        s = j % STAGES
        mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)
        _issue_step(w_desc, s_desc, x_desc, xs_desc, w_smem.index(s), s_smem.index(s), x_smem.index(s),
                    xs_smem.index(s).slice(0, BM), ready.index(s), off_n, off_m, k0 + j * BK, True, True)


@gluon.jit
def _consumer(w_smem, s_smem, x_smem, xs_smem, ready, empty, k_steps, BN: gl.constexpr, BM: gl.constexpr,
              STAGES: gl.constexpr, num_warps: gl.constexpr):
    """Consumer partition (num_warps warps): per step, read the slot into registers and hand it back, then the
    decode, dp4a and the block terms. Returns the accumulator [BN, BM, 16] (a tuple, as warp_specialize wants)."""
    BK: gl.constexpr = 256
    # L4 over [BN, BM, 16 blocks, 4 words of a block]: a thread owns 2 blocks of BN / (4 num_warps) weight rows
    # and every row of x (one decoded W word feeds BM dp4a)
    L4: gl.constexpr = gl.BlockedLayout([1, BM, 2, 4], [4, 1, 8, 1], [num_warps, 1, 1, 1], [3, 2, 1, 0])
    S3: gl.constexpr = gl.SliceLayout(3, L4)  # [BN, BM, 16]: the block terms and the accumulator
    W2: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])  # [BN, 32] code words
    plain2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    plain3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    acc = gl.zeros([BN, BM, BK // 16], gl.float32, S3)
    # the prmt tables as values the compiler cannot see through (k_steps >> 30 is 0): ptxas keeps them in four
    # registers instead of rematerializing each constant at every use (one extra instruction per lookup)
    opaque = k_steps >> 30
    tables = (opaque + TABLE_WORDS[0], opaque + TABLE_WORDS[1], opaque + TABLE_WORDS[2], opaque + TABLE_WORDS[3])
    for i in range(k_steps):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        words = w_smem.index(s)._reinterpret(gl.int32, [BN, BK // 8], plain2).load(W2)
        sb = s_smem.index(s).load(gl.SliceLayout(1, S3))
        xv = x_smem.index(s)._reinterpret(gl.int32, [BM, BK // 16, 4], plain3).load(gl.SliceLayout(0, L4))
        xsb = xs_smem.index(s).slice(0, BM).load(gl.SliceLayout(0, S3))
        gl.thread_barrier()  # every consumer thread has read slot s (an mbarrier arrive is one thread's)
        mbarrier.arrive(empty.index(s), count=1)

        lo, hi = _decode_int8(gl.reshape(words, [BN, BK // 16, 2]), tables)  # (block, word of the block)
        wv = gl.reshape(gl.join(lo, hi), [BN, BK // 16, 4])  # word j = 2 (word of the block) + (lo / hi)
        wv = gl.convert_layout(wv, gl.SliceLayout(1, L4), assert_trivial=True)  # registers only
        w4, x4 = gl.broadcast(gl.expand_dims(wv, 1), gl.expand_dims(xv, 0))
        dot = gl.sum(_dp4a(w4, x4, gl.zeros_like(w4)), axis=3)  # [BN, BM, 16]: 4 x the block dot products
        sw = (sb & 0x7F).to(gl.float8e4nv, bitcast=True).to(gl.float32)  # UE4M3: sign ignored; exact
        sx = (xsb & 0x7F).to(gl.float8e4nv, bitcast=True).to(gl.float32)
        acc += dot.to(gl.float32) * (gl.expand_dims(sw, 1) * gl.expand_dims(sx, 0))  # exact term, one RN add
    return (acc, )


@gluon.jit
def nvfp4_dp4a_kernel(
    # TMA descriptors: W codes uint8 [N, K/2], W block scales uint8 [N, K/16], x codes int8 [M, K] (2 E2M1 each),
    # x block scales uint8 [M, K/16]
    w_desc, s_desc, x_desc, xs_desc,
    # fp32 [2] from the quantizer ([1] = fp32(x_gdec * w_gdec)); out bf16 [M, N]; split-K partials fp32
    # [tiles, SPLIT_K, EPILOGUE_M, BN] and per-tile arrival counters (int32, 0 between launches): kernels/_gluon.py
    gdec_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K,
    BN: gl.constexpr, BM: gl.constexpr, SPLIT_K: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
    PDL: gl.constexpr = False,
):
    BK: gl.constexpr = 256
    EM: gl.constexpr = 8  # EPILOGUE_M
    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    pid_k = gl.program_id(2)
    off_n = pid_n * BN
    off_m = pid_m * BM
    k_steps = K // BK // SPLIT_K  # the host launches SPLIT_K dividing K / 256
    k0 = pid_k * k_steps * BK

    # ---- the ring: STAGES 256-K steps of W codes + scales and x codes + scales; "ready" barriers carry the TMA
    # bytes, the consumers arrive on "empty" once they have read a slot (x scales: 8 rows per slot whatever BM, so
    # that every slot starts 128-byte aligned, as TMA needs)
    w_smem = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, BK // 2], w_desc.layout)
    s_smem = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, BK // 16], s_desc.layout)
    x_smem = gl.allocate_shared_memory(gl.int8, [STAGES, BM, BK], x_desc.layout)
    xs_smem = gl.allocate_shared_memory(gl.uint8, [STAGES, 8, BK // 16], xs_desc.layout)
    ready, empty = ring_barriers(STAGES)
    acc = gl.warp_specialize(
        [(_consumer, (w_smem, s_smem, x_smem, xs_smem, ready, empty, k_steps, BN, BM, STAGES, num_warps)),
         (_producer, (w_desc, s_desc, x_desc, xs_desc, w_smem, s_smem, x_smem, xs_smem, ready, empty, off_n, off_m,
                      k0, k_steps, BM, STAGES, PDL))],
        [1], [40])[0]
    invalidate_ring(ready, empty, STAGES)
    if PDL:
        wait_primary()  # gdec is the quantizer's, and the wait is per thread

    # ---- epilogue: the fixed tree over the 16 block slots, 1/4 (exact), padded to EM columns for _gluon.py ----
    res = gl.sum(acc, axis=2) * 0.25  # [BN, BM]
    if BM == 1:
        res = _zero_pad_cols(res, BN, 1)
    if BM <= 2:
        res = _zero_pad_cols(res, BN, 2)
    if BM <= 4:
        res = _zero_pad_cols(res, BN, 4)
    res = gl.convert_layout(res, store_layout(BN, EM, num_warps))
    store_or_reduce(res, out_ptr, part_ptr, count_ptr, gl.minimum(M, off_m + BM), N, N, off_n, off_m, off_m,
                    pid_m * gl.num_programs(0) + pid_n, pid_k, gl.load(gdec_ptr + 1), BN, EM, SPLIT_K, True,
                    num_warps)


class Dp4aLaunch:
    """``nvfp4_dp4a_kernel`` for x [M, K] (quantized by the quantizer into int8 codes and scale bytes) times
    W [N, K] with ``config`` (``Dp4aConfig.fits(N, K)``); ``pdl`` as ``gluon.GluonLaunch``.

    ``run(stream, device, weight_fp4, weight_scales, xq, gdec, out, w_gdec)``: ``xq`` uint8 [>= M K + M K / 16]:
    x's int8 codes [M, K], then its block-scale bytes [M, K / 16] (``x_views``: the quantizer writes them)."""

    __slots__ = ("launch", "split_k", "tiles", "config", "M", "N", "K", "_views")

    def __init__(self, config: Dp4aConfig, M: int, N: int, K: int, pdl: bool = False):
        self._views = (None, None, None, None)  # (workspace, codes, scale bytes, codes as int8): see x_views
        grid = (triton.cdiv(N, config.BN), triton.cdiv(M, config.BM), config.SPLIT_K)
        self.M, self.N, self.K, self.config = M, N, K, config
        self.split_k, self.tiles = config.SPLIT_K, grid[0] * grid[1]
        # TMA descriptors: W codes and scale bytes (viewed as uint8), x's int8 codes and scale bytes (x_views)
        wl, sl, xl, xsl = shared_layouts()
        descs = (Desc((N, K // 2), (K // 2, 1), (config.BN, STEP_K // 2), wl, torch.uint8),
                 Desc((N, K // 16), (K // 16, 1), (config.BN, STEP_K // 16), sl, torch.uint8),
                 Desc((M, K), (K, 1), (config.BM, STEP_K), xl),
                 Desc((M, K // 16), (K // 16, 1), (config.BM, STEP_K // 16), xsl))
        self.launch = Launch(
            nvfp4_dp4a_kernel, grid,
            dict(BN=config.BN, BM=config.BM, SPLIT_K=config.SPLIT_K, STAGES=config.STAGES,
                 num_warps=config.num_warps, PDL=pdl), descs=descs, launch_pdl=pdl)

    def x_views(self, buf):
        """(codes [M * K], scale bytes [M * K / 16], codes viewed as int8) of x in the uint8 workspace ``buf``
        (codes first): the quantizer's outputs and this kernel's operands. Slicing costs host time, so the views
        are kept while ``buf`` is the same tensor (from call to call, until the workspace grows)."""
        held, codes, scales, codes_i8 = self._views
        if held is not buf:
            M, K = self.M, self.K
            codes, scales = buf[:M * K], buf[M * K:M * K + M * K // 16]
            codes_i8 = codes.view(torch.int8)
            self._views = (buf, codes, scales, codes_i8)
        return codes, scales, codes_i8

    def run(self, stream: int, device, weight_fp4, weight_scales, xq, gdec, out, w_gdec: float) -> None:
        M, N, K, cfg = self.M, self.N, self.K, self.config
        part, cnt = splitk_buffers(device, stream, self.split_k,
                                   workspace_elements(self.tiles, self.split_k, cfg.BN, EPILOGUE_M), self.tiles)
        _, scales, codes = self.x_views(xq)
        self.launch.launch(stream, weight_fp4, weight_scales, codes, scales, gdec, out, part, cnt, M, N, K)
