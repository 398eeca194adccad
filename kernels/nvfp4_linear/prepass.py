"""The large-M path (PrepassConfig): W decoded per call to an fp16 workspace, then gemm_fp16's persistent TMA GEMM.

``nvfp4_decode_weight_kernel`` ("fp32" mode) or ``nvfp4_decode_weight_words_kernel`` ("cvt" mode) writes the
exact decoded weight (E2M1 value * block scale) to a per-(device, stream) fp16 workspace [N, K] (2 N K bytes:
128 MiB at N = K = 8192; ``_runtime.clear_workspaces()`` frees it); x is dequantized to fp16 by the quantizer
(exact); ``gemm_fp16.gemm_tma`` multiplies them with the device-side epilogue scale fp32(x_gdec * w_gdec) and
rounds once to bf16.

fp16, not bf16: every E2M1 x E4M3 product (<= 6 significant bits, in [2^-10, 2688]) is exact in either, wgmma runs
both at the same rate, and Triton 3.6's CPU interpreter computes ``tl.dot`` of bf16 operands wrongly (it multiplies
their storage bits), so CPU CI could not check a bf16 path.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._runtime import Launch, current_stream, interpreting, workspace
from ..gemm_fp16 import gemm_tma
from .configs import PREPASS_MODES, PrepassConfig, block_k_for
from .decode import DECODE_WORD_PTX, decode_word_portable, e4m3_byte_to_fp32

__all__ = ["WEIGHT_WORKSPACE", "PrepassLaunch", "decode_weight", "decode_weight_launch",
           "nvfp4_decode_weight_kernel", "nvfp4_decode_weight_words_kernel"]

WEIGHT_WORKSPACE = "nvfp4_linear.prepass_weight"  # _runtime.workspace name of the decoded weight (fp16, N K)


@triton.jit
def nvfp4_decode_weight_kernel(
    w_ptr,  # *u8 [N, K/2] packed E2M1 codes (element 2i in bits 3:0)
    ws_ptr,  # *u8 [N, K/16] E4M3FN block-scale bytes (sign ignored: UE4M3)
    out_ptr,  # *bf16|fp16 [N, K]: E2M1 value * block scale (exact)
    N,
    K,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,  # multiple of 32
):
    """The large-M pre-pass: the NVFP4 weight decoded to a 16-bit workspace for a plain TMA GEMM.

    fp32 value of the code (E2M1 c = s e1 e0 m: |v| = m / 2 when e1 e0 = 0, else the fp32 bits
    (e1 e0 m + 252) << 22), times the exact fp32 block scale, converted to the workspace dtype: every product has
    <= 6 significant bits and lies in [2^-10, 2688] (or is 0), so each step is exact (bf16 and fp16 alike).
    """
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows[:, None] < N
    pcols = pid_c * (BLOCK_C // 2) + tl.arange(0, BLOCK_C // 2)
    packed = tl.load(w_ptr + rows[:, None].to(tl.int64) * (K // 2) + pcols[None, :],
                     mask=rmask & (pcols[None, :] < K // 2), other=0).to(tl.int32)
    bcols = pid_c * (BLOCK_C // 16) + tl.arange(0, BLOCK_C // 16)
    sb = tl.load(ws_ptr + rows[:, None].to(tl.int64) * (K // 16) + bcols[None, :],
                 mask=rmask & (bcols[None, :] < K // 16), other=0).to(tl.int32) & 0x7F
    sval = e4m3_byte_to_fp32(sb)  # [BLOCK_R, BLOCK_C/16]
    c = tl.join(packed & 0xF, packed >> 4).reshape(BLOCK_R, BLOCK_C // 16, 16)  # element 2i: low nibble
    m3 = c & 7
    mag = tl.where(m3 >= 2, ((m3 + 252) << 22).to(tl.float32, bitcast=True), m3.to(tl.float32) * 0.5)
    v = tl.where((c & 8) != 0, -mag, mag) * sval[:, :, None]  # -0.0 for code 8 (value 0 either way)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
             v.reshape(BLOCK_R, BLOCK_C).to(out_ptr.dtype.element_ty), mask=rmask & (cols[None, :] < K))


@triton.jit
def nvfp4_decode_weight_words_kernel(
    w_ptr,  # *i32 [N, K/8] packed E2M1 codes, 8 per word (element 8j + i in bits 4i+3:4i of word j)
    ws_ptr,  # *u8 [N, K/16] E4M3FN block-scale bytes (sign ignored: UE4M3)
    out_ptr,  # *fp16 [N, K]: E2M1 value * block scale (exact)
    N,
    K,  # multiple of BLOCK_C (the host picks BLOCK_C so)
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,  # power of two >= 16
    DECODE_PTX: tl.constexpr,  # True on the GPU; False in the CPU interpreter (no inline PTX there)
):
    """The large-M pre-pass, word decode: the in-kernel path's decode (DECODE_WORD_PTX: E2M1 code -> E4M3 byte
    E2M1(c) * 2^-6, cvt.rn.f16x2.e4m3x2, times fp16(block scale) * 2^6, all exact: products have <= 6
    significant bits in [2^-10, 2688] or are 0) on [BLOCK_R, BLOCK_C / 8] code words; a word's 8 values are
    8 consecutive fp16 of a row (one 16-byte store). Rows past N are clamped on load and masked on store."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    rows_c = tl.minimum(rows, N - 1)
    w = tl.load(w_ptr + rows_c[:, None].to(tl.int64) * (K // 8) + (pid_c * (BLOCK_C // 8)
                                                                    + tl.arange(0, BLOCK_C // 8))[None, :])
    sb = tl.load(ws_ptr + rows_c[:, None].to(tl.int64) * (K // 16) + (pid_c * (BLOCK_C // 16)
                                                                       + tl.arange(0, BLOCK_C // 16))[None, :])
    s16 = (sb & 0x7F).to(tl.float8e4nv, bitcast=True).to(tl.float16) * 64.0  # block scale * 2^6, exact
    s16 = tl.join(s16, s16).reshape(BLOCK_R, BLOCK_C // 8)  # one scale per word (2 words per block)
    if DECODE_PTX:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            DECODE_WORD_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, s16], dtype=(tl.float16,) * 8, is_pure=True,
            pack=1)
    else:
        v0, v1, v2, v3, v4, v5, v6, v7 = decode_word_portable(w, s16)
    even = tl.join(tl.join(v0, v4), tl.join(v2, v6))  # element 8j + 4a + 2b + c at [j, a, b, c]
    odd = tl.join(tl.join(v1, v5), tl.join(v3, v7))
    v = tl.join(even, odd).reshape(BLOCK_R, BLOCK_C)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], v, mask=rows[:, None] < N)



def decode_weight_launch(N: int, K: int, *, BLOCK_R: int, BLOCK_C: int, num_warps: int, mode: str) -> Launch:
    """The weight pre-pass launch for W [N, K]. Its runtime arguments: the codes (uint8 [N, K/2] for "fp32",
    int32 [N, K/8] for "cvt"), the scale bytes uint8 [N, K/16], the output [N, K] (bf16 / fp16; "cvt": fp16), N,
    K. Raises ValueError for an unknown mode."""
    if mode == "cvt":
        bc = block_k_for(K, BLOCK_C)  # divides K: no column masks
        return Launch(nvfp4_decode_weight_words_kernel, (triton.cdiv(N, BLOCK_R), K // bc),
                      dict(BLOCK_R=BLOCK_R, BLOCK_C=bc, DECODE_PTX=not interpreting()), num_warps=num_warps)
    if mode == "fp32":
        return Launch(nvfp4_decode_weight_kernel, (triton.cdiv(N, BLOCK_R), triton.cdiv(K, BLOCK_C)),
                      dict(BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C), num_warps=num_warps)
    raise ValueError(f"mode={mode!r}: expected one of {PREPASS_MODES}")


def decode_weight(weight_fp4: torch.Tensor, weight_scales: torch.Tensor, out: torch.Tensor, *, BLOCK_R: int = 16,
                  BLOCK_C: int = 512, num_warps: int = 4, mode: str = "fp32") -> torch.Tensor:
    """The pre-pass alone: ``out`` [N, K] (bf16 / fp16; "cvt" mode: fp16 only) = the decoded NVFP4 weight
    (E2M1 value * block scale, exact). ``weight_fp4`` uint8 [N, K/2], ``weight_scales`` uint8 / float8_e4m3fn
    [N, K/16], on out's device. Returns out. Raises ValueError for an unknown mode or a "cvt" out not fp16."""
    N, K = out.shape
    if mode == "cvt" and out.dtype != torch.float16:
        raise ValueError(f"out.dtype={out.dtype}: the 'cvt' pre-pass writes float16")
    launch = decode_weight_launch(N, K, BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, num_warps=num_warps, mode=mode)
    w = weight_fp4.view(torch.int32 if mode == "cvt" else torch.uint8)
    launch.launch(current_stream(out.device), w, weight_scales.view(torch.uint8), out, N, K)
    return out


class PrepassLaunch:
    """The large-M path for x [M, K] times W [N, K] with ``config``.

    ``run(stream, device, weight_fp4, weight_scales, deq, gdec, out, w_gdec)``: ``deq`` fp16 [>= M K] dequantized
    x, ``gdec`` fp32 [2] from the quantizer (gdec[1] = fp32(x_gdec * w_gdec), the GEMM's epilogue scale), ``out``
    bf16 [..., N] contiguous (a copy through an aligned buffer where its base is not 16-byte aligned: TMA stores
    need it)."""

    __slots__ = ("decode", "gemm", "words", "M", "N", "K")

    def __init__(self, config: PrepassConfig, M: int, N: int, K: int):
        self.M, self.N, self.K, self.gemm, self.words = M, N, K, config.gemm, config.mode == "cvt"
        self.decode = decode_weight_launch(N, K, BLOCK_R=config.BLOCK_R, BLOCK_C=config.BLOCK_C,
                                           num_warps=config.num_warps, mode=config.mode)

    def run(self, stream: int, device, weight_fp4, weight_scales, deq, gdec, out, w_gdec: float) -> None:
        M, N, K = self.M, self.N, self.K
        wdq = workspace(device, stream, WEIGHT_WORKSPACE, N * K, torch.float16)[:N * K].view(N, K)
        self.decode.launch(stream, weight_fp4.view(torch.int32 if self.words else torch.uint8),
                           weight_scales.view(torch.uint8), wdq, N, K)
        a = deq[:M * K].view(M, K)
        if out.data_ptr() % 16 == 0:
            gemm_tma(a, wdq, out.view(M, N), scale=gdec[1:], config=self.gemm)
        else:
            tmp = torch.empty((M, N), dtype=torch.bfloat16, device=device)
            gemm_tma(a, wdq, tmp, scale=gdec[1:], config=self.gemm)
            out.view(M, N).copy_(tmp)
