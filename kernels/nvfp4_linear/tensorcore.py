"""The in-kernel decode path on tensor cores: ``nvfp4_linear_kernel`` (TensorCoreConfig; small and medium M).

C^T tile = W_tile @ X_tile^T ("swap AB": weight rows are the MMA M dimension, so M = 1..64 wastes no tensor-core
work beyond BLOCK_M = 16). W is decoded in registers from 32-bit words of packed codes, either by E2M1 code c ->
E4M3FN byte (c & 7) << 2 | (c & 8) << 4 (exactly E2M1(c) * 2^-6) and cvt.rn.f16x2.e4m3x2, or (DECODE_BITS) by
placing c's bits as the fp16 E2M1(c) * 2^-14 (no conversion instruction); then times fp16(block scale) * 2^6.
Every E2M1 x E4M3 product has <= 6 significant bits and lies in [2^-10, 2688] (or is 0): exact in fp16
(DECODE_BITS: times 2^-8, still exact; the accumulator is multiplied back by 2^8, exactly), so the tensor-core
products are exact; fp32 accumulation (Hopper wgmma). Split-K: each program stores an fp32 partial; the last
program to arrive at an output tile (atomic counter) sums the SPLIT_K partials in the fixed order s = 0, 1, ... .
Epilogue: acc * fp32(x_global_decode * weight_global_decode), one RNE rounding to bf16.

Triton behaviour worked around (docs/kernels.md): ``tl.dot_scaled`` with E4M3FN scales crashes the sm_90 compiler
in Triton 3.6, so the operands are decoded here and fed to ``tl.dot``; the CPU interpreter cannot run inline PTX
(DECODE_PTX=False there: decode.decode_word_portable / decode_bits_portable).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._runtime import Launch, interpreting, split_scratch
from .configs import TensorCoreConfig, block_k_for
from .decode import DECODE_BITS_PTX, DECODE_WORD_PTX, decode_bits_portable, decode_word_portable

__all__ = ["COUNTERS_WORKSPACE", "PARTIALS_WORKSPACE", "TensorCoreLaunch", "nvfp4_linear_kernel",
           "splitk_buffers", "splitk_last_arrival"]

# _runtime.workspace names of the split-K scratch (shared with the GEMV path): int32 arrival counters per output
# tile (zeroed once; every kernel leaves them at zero) and the fp32 partials [SPLIT_K, M, N]
COUNTERS_WORKSPACE = "nvfp4_linear.splitk_counters"
PARTIALS_WORKSPACE = "nvfp4_linear.splitk_partials"


@triton.jit
def splitk_last_arrival(count_ptr, tile, part_ptr, out_ptr, out_offs, out_mask, MN, pre, g, SPLIT_K: tl.constexpr):
    """Split-K without a second launch: after storing its partial (and a CTA barrier), each program bumps the
    tile's counter (atomic, acq_rel, gpu scope); the LAST to arrive sums the SPLIT_K partials in the fixed order
    s = 0, 1, ... in fp32 (bitwise deterministic whoever arrives last), stores bf16((tot * pre) * g) (one RNE;
    ``pre`` a power of two, exact) and resets the counter for the next call on this stream."""
    if tl.atomic_add(count_ptr + tile, 1) == SPLIT_K - 1:
        tot = tl.load(part_ptr + out_offs, mask=out_mask, other=0.0, cache_modifier=".cg")
        for sk in tl.static_range(1, SPLIT_K):
            tot += tl.load(part_ptr + sk * MN + out_offs, mask=out_mask, other=0.0, cache_modifier=".cg")
        tl.store(out_ptr + out_offs, ((tot * pre) * g).to(tl.bfloat16), mask=out_mask)
        tl.store(count_ptr + tile, 0)


@triton.jit
def nvfp4_linear_kernel(
    w_ptr,  # *i32 [N, K/8] packed E2M1 weight codes, 8 per word (element 2i in bits 3:0 of byte i)
    ws_ptr,  # *u8 [N, K/16] E4M3FN block-scale bytes (sign ignored: UE4M3); *i32 [N, K/64] with SCALE_WORDS
    a_ptr,  # *fp16 [M, K] dequantized x (code * block scale, exact)
    xgdec_ptr,  # *fp32 [1] x global decode scale (written by the quantize kernel)
    out_ptr,  # *bf16 [M, N]
    part_ptr,  # *fp32 [SPLIT_K, M, N] partial sums (SPLIT_K > 1)
    count_ptr,  # *i32 [tiles] arrivals per output tile (SPLIT_K > 1; 0 on entry, reset by the last arrival)
    w_gdec,  # fp32 weight global decode scale
    M,
    N,
    K,  # multiple of BLOCK_K (the host picks BLOCK_K so)
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DECODE_PTX: tl.constexpr,  # True on the GPU; False in the CPU interpreter (no inline PTX there)
    DECODE_BITS: tl.constexpr = False,  # decode by bit placement + one f16x2 multiply (DECODE_BITS_PTX)
    SCALE_WORDS: tl.constexpr = False,  # load block scales as int32 words (4 per word; cp.async-eligible).
    # Needs K % 64 == 0 and BLOCK_K % 64 == 0. Byte loads (False) are not pipelined by Triton (cp.async needs
    # >= 4 bytes), so each K step waits for them. PREPARED, NOT YET GPU-VERIFIED: no default config uses it.
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)

    # Rows past N or M are clamped (not masked) on load, so loads stay unmasked and vectorised; stores are masked.
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_n = tl.minimum(offs_n, N - 1)
    rows_m = tl.minimum(offs_m, M - 1)
    offs_kw = tl.arange(0, BLOCK_K // 8)  # weight words
    if SCALE_WORDS:
        offs_ks = tl.arange(0, BLOCK_K // 64)  # block-scale words (4 bytes each)
    else:
        offs_ks = tl.arange(0, BLOCK_K // 16)  # block-scale bytes
    offs_k = tl.arange(0, BLOCK_K)

    # this program's K range: whole BLOCK_K steps, split evenly (the last split may be shorter or empty)
    k_steps = K // BLOCK_K
    steps_per_split = tl.cdiv(k_steps, SPLIT_K)
    step_lo = pid_k * steps_per_split
    step_hi = tl.minimum(step_lo + steps_per_split, k_steps)

    w_rows = w_ptr + rows_n[:, None].to(tl.int64) * (K // 8)
    if SCALE_WORDS:
        s_rows = ws_ptr + rows_n[:, None].to(tl.int64) * (K // 64)
    else:
        s_rows = ws_ptr + rows_n[:, None].to(tl.int64) * (K // 16)
    a_rows = a_ptr + rows_m[:, None].to(tl.int64) * K

    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for step in range(step_lo, step_hi):
        w = tl.load(w_rows + (step * (BLOCK_K // 8) + offs_kw)[None, :])  # [BLOCK_N, BLOCK_K/8] int32
        if SCALE_WORDS:
            sw = tl.load(s_rows + (step * (BLOCK_K // 64) + offs_ks)[None, :]).to(tl.uint32, bitcast=True)
            # byte t of word i is block 4i + t: [i, a, c] holds byte 2a + c
            sb = tl.join(tl.join(sw & 0xFF, (sw >> 16) & 0xFF), tl.join((sw >> 8) & 0xFF, sw >> 24))
            sb = sb.reshape(BLOCK_N, BLOCK_K // 16).to(tl.uint8)  # [BLOCK_N, BLOCK_K/16] scale bytes
        else:
            sb = tl.load(s_rows + (step * (BLOCK_K // 16) + offs_ks)[None, :])  # [BLOCK_N, BLOCK_K/16] uint8
        a = tl.load(a_rows + (step * BLOCK_K + offs_k)[None, :])  # [BLOCK_M, BLOCK_K] fp16
        s16 = (sb & 0x7F).to(tl.float8e4nv, bitcast=True).to(tl.float16) * 64.0  # block scale * 2^6, exact
        s16 = tl.join(s16, s16).reshape(BLOCK_N, BLOCK_K // 8)  # one scale per word (2 words per block)
        if DECODE_BITS:
            if DECODE_PTX:
                v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
                    DECODE_BITS_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, s16],
                    dtype=(tl.float16,) * 8, is_pure=True, pack=1)
            else:
                v0, v1, v2, v3, v4, v5, v6, v7 = decode_bits_portable(w, s16)
        elif DECODE_PTX:
            v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
                DECODE_WORD_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, s16],
                dtype=(tl.float16,) * 8, is_pure=True, pack=1)
        else:
            v0, v1, v2, v3, v4, v5, v6, v7 = decode_word_portable(w, s16)
        # element 8j + 4a + 2b + c at [j, a, b, c]
        even = tl.join(tl.join(v0, v4), tl.join(v2, v6))
        odd = tl.join(tl.join(v1, v5), tl.join(v3, v7))
        wv = tl.join(even, odd).reshape(BLOCK_N, BLOCK_K)  # E2M1 value * block scale, fp16, exact
        acc = tl.dot(wv, tl.trans(a), acc)  # exact products, fp32 accumulation

    out_mask = (offs_n[:, None] < N) & (offs_m[None, :] < M)
    out_offs = offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
    g = tl.load(xgdec_ptr) * w_gdec  # fp32 RNE
    if DECODE_BITS:
        acc = acc * 256.0  # undo the decode's 2^-8: exact (see DECODE_BITS_PTX)
    if SPLIT_K == 1:
        tl.store(out_ptr + out_offs, (acc * g).to(tl.bfloat16), mask=out_mask)  # fp32 RNE, one RNE to bf16
    else:
        # Split-K without a second launch: store this partial; the LAST program to arrive at the tile sums all
        # SPLIT_K partials in the fixed order s = 0, 1, ... (bitwise deterministic whoever arrives last).
        MN = N.to(tl.int64) * M  # (M may be the constant 1 after specialisation: no .to on it)
        tl.store(part_ptr + pid_k * MN + out_offs, acc, mask=out_mask)
        tl.debug_barrier()  # all threads' partial stores precede the (release) arrival
        splitk_last_arrival(count_ptr, pid_m * tl.num_programs(0) + pid_n, part_ptr, out_ptr, out_offs, out_mask,
                             MN, 1.0, g, SPLIT_K)



def splitk_buffers(device: torch.device, stream: int, split_k: int, partials: int, tiles: int):
    """(partials, counters) for a launch with ``tiles`` output tiles and ``partials`` fp32 partial elements (the
    layout is the kernel's): the per-(device, stream) workspaces when split_k > 1, else ``unused_scratch`` (the
    kernels do not touch them)."""
    return split_scratch(device, stream, PARTIALS_WORKSPACE, partials if split_k > 1 else 0, COUNTERS_WORKSPACE,
                         max(tiles, 4096))


class TensorCoreLaunch:
    """``nvfp4_linear_kernel`` for x [M, K] times W [N, K] with ``config``; BLOCK_K narrowed to a power of two
    dividing K (no K masks), block scales as words only where K % 64 == 0 and BLOCK_K % 64 == 0.

    ``run(stream, device, weight_fp4, weight_scales, deq, gdec, out, w_gdec)``: ``deq`` fp16 [>= M K] dequantized
    x, ``gdec`` fp32 [2] from the quantizer, ``out`` bf16 [M, N] contiguous."""

    __slots__ = ("launch", "split_k", "scale_words", "tiles", "M", "N", "K")

    def __init__(self, config: TensorCoreConfig, M: int, N: int, K: int):
        block_k = block_k_for(K, config.BLOCK_K)
        grid = (triton.cdiv(N, config.BLOCK_N), triton.cdiv(M, config.BLOCK_M), config.SPLIT_K)
        self.M, self.N, self.K, self.split_k, self.tiles = M, N, K, config.SPLIT_K, grid[0] * grid[1]
        self.scale_words = bool(config.SCALE_WORDS) and K % 64 == 0 and block_k % 64 == 0
        self.launch = Launch(
            nvfp4_linear_kernel, grid,
            dict(BLOCK_N=config.BLOCK_N, BLOCK_M=config.BLOCK_M, BLOCK_K=block_k, SPLIT_K=config.SPLIT_K,
                 DECODE_PTX=not interpreting(), DECODE_BITS=bool(config.DECODE_BITS), SCALE_WORDS=self.scale_words),
            num_warps=config.num_warps, num_stages=config.num_stages)

    def run(self, stream: int, device, weight_fp4, weight_scales, deq, gdec, out, w_gdec: float) -> None:
        w = weight_fp4.view(torch.int32)  # [N, K/8]: 8 codes per word (K % 16 == 0)
        ws = weight_scales.view(torch.int32 if self.scale_words else torch.uint8)  # [N, K/64] or [N, K/16]
        part, cnt = splitk_buffers(device, stream, self.split_k, self.split_k * self.M * self.N, self.tiles)
        self.launch.launch(stream, w, ws, deq, gdec, out, part, cnt, w_gdec, self.M, self.N, self.K)
