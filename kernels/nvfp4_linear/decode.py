"""Decode helpers shared by the nvfp4_linear paths: E4M3FN block-scale bytes and words of packed E2M1 codes to
exact fp32 / fp16 values, as Triton functions and as inline PTX (sm_90).

Exactness: an E2M1 value times an E4M3FN block scale has <= 6 significant bits and lies in [2^-10, 2688] (or is
0), so every decode below is exact in fp32 and in fp16. The PTX decodes run on the GPU only; the CPU interpreter
takes the ``*_portable`` twins (the same arithmetic in Triton ops; the GPU tests check the PTX bit for bit against
fp4ref).
"""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["DECODE_BITS_PTX", "DECODE_PAIRS_PTX", "DECODE_PAIRS_ORDER", "DECODE_WORD_PTX", "decode_bits_portable",
           "decode_word_portable", "e4m3_byte_to_fp32"]


@triton.jit
def e4m3_byte_to_fp32(b):
    """Exact fp32 value of an E4M3FN byte (sign bit clear, not 0x7F)."""
    be = b >> 3
    m = b & 7
    normal = (((be + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    return tl.where(be == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal: m * 2^-9 (exact)



# PTX for one 32-bit word of packed weights (8 E2M1 codes, element 8j+i in bits 4i+3:4i) and its block scale
# (fp16, already times 2^6): 8 fp16 outputs, element order. E2M1 code c -> E4M3FN byte (c & 7) << 2 | (c & 8) << 4,
# done on four bytes at once; cvt.rn.f16x2.e4m3x2 converts two bytes (low byte -> low half); then times the scale.
# Every step is exact (see the module docstring). The CPU interpreter cannot run PTX: it takes decode_word_portable,
# the same arithmetic in Triton ops (the GPU tests check this path bit for bit against fp4ref).
DECODE_WORD_PTX = tl.constexpr("""
{
.reg .b32 w, lo, hi, t, p0, p1, s2, f0, f1, f2, f3;
.reg .b16 q0, q1, q2, q3;
mov.b32 w, $8;
and.b32 lo, w, 0x07070707;
shl.b32 lo, lo, 2;
and.b32 t, w, 0x08080808;
shl.b32 t, t, 4;
or.b32 lo, lo, t;
shr.u32 hi, w, 2;
and.b32 hi, hi, 0x1C1C1C1C;
and.b32 t, w, 0x80808080;
or.b32 hi, hi, t;
prmt.b32 p0, lo, hi, 0x5140;
prmt.b32 p1, lo, hi, 0x7362;
mov.b32 {q0, q1}, p0;
mov.b32 {q2, q3}, p1;
cvt.rn.f16x2.e4m3x2 f0, q0;
cvt.rn.f16x2.e4m3x2 f1, q1;
cvt.rn.f16x2.e4m3x2 f2, q2;
cvt.rn.f16x2.e4m3x2 f3, q3;
mov.b32 s2, {$9, $9};
mul.rn.f16x2 f0, f0, s2;
mul.rn.f16x2 f1, f1, s2;
mul.rn.f16x2 f2, f2, s2;
mul.rn.f16x2 f3, f3, s2;
mov.b32 {$0, $1}, f0;
mov.b32 {$2, $3}, f1;
mov.b32 {$4, $5}, f2;
mov.b32 {$6, $7}, f3;
}
""")


# The cheaper decode (DECODE_BITS): no conversion instruction. E2M1 code c = s e1 e0 m placed as the fp16 bits
# s << 15 | (e1 e0 m) << 9 is exactly E2M1(c) * 2^-14 (e1 e0 = 0: the fp16 subnormal m * 2^-15 = 0.5 m * 2^-14).
# Elements 2i, 2i+1 (byte i of the word) go to one f16x2 register, in element order (the order the tile is
# joined in, so no repacking follows): prmt puts byte i of (w << 4) (its high nibble = element 2i) in byte 1 and
# byte i of w (high nibble = element 2i+1) in byte 3, so both codes sit at bits 12..15 of their half; then
# ((t >> 3) & 0x0E000E00) | (t & 0x80008000). Times fp16(block scale) * 2^6 (mul.rn.f16x2, subnormals kept):
# E2M1(c) * scale * 2^-8, a multiple of 2^-18 with <= 6 significant bits and magnitude <= 10.5: exact in fp16.
# The kernel multiplies the fp32 accumulator by 2^8 before the epilogue scale: exact, because every product is
# scaled by the same power of two and stays >= 2^-28 in magnitude (far above fp32's subnormals), so the
# accumulator (hardware or interpreter) is exactly 2^-8 times the unscaled one, and 2^8 times it is the unscaled
# accumulator itself (finite whenever that is).
DECODE_BITS_PTX = tl.constexpr(
    "\n{\n.reg .b32 w, u, t, f0, f1, f2, f3, s2;\nmov.b32 w, $8;\nmov.b32 s2, {$9, $9};\nshl.b32 u, w, 4;\n"
    # f{i}: byte i of (w << 4) -> byte 1 and byte i of w -> byte 3 of t, then the code bits placed as above
    + "".join(f"prmt.b32 t, w, u, 0x{i}{i}{i + 4}{i + 4};\nshr.u32 f{i}, t, 3;\nand.b32 f{i}, f{i}, 0x0E000E00;\n"
              f"and.b32 t, t, 0x80008000;\nor.b32 f{i}, f{i}, t;\n" for i in range(4))
    + "".join(f"mul.rn.f16x2 f{i}, f{i}, s2;\n" for i in range(4))
    + "".join(f"mov.b32 {{${2 * i}, ${2 * i + 1}}}, f{i};\n" for i in range(4))
    + "}\n")

# The Gluon path's decode (same bit placement, same exactness), with fewer instructions: 15 per word instead of 21.
# Per word, hi = the odd codes at the top of their bytes (w & 0xF0F0F0F0), lo = the even codes there ((w << 4) &
# 0xF0F0F0F0); (x | x >> 3) & 0x8E8E8E8E turns each byte into the fp16 HIGH byte of its code (sign at bit 7, e1 e0 m
# at bits 3..1; the shift cannot carry between bytes: their low nibbles are zero). Then one prmt per f16x2 register
# puts two such bytes of the same word into bytes 1 and 3 beside zero bytes, and one f16x2 multiply by the scale.
# The registers pair codes of the same parity, so the 8 outputs come in the order DECODE_PAIRS_ORDER (output e =
# code DECODE_PAIRS_ORDER[e] of the word): the kernel's K permutation absorbs it (gluon.py, quantize PERMUTE_K).
DECODE_PAIRS_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
DECODE_PAIRS_PTX = tl.constexpr(
    "\n{\n.reg .b32 w, hi, lo, t, z, f0, f1, f2, f3, s2;\nmov.b32 w, $8;\nmov.b32 s2, {$9, $9};\nmov.b32 z, 0;\n"
    "and.b32 hi, w, 0xF0F0F0F0;\nshr.u32 t, hi, 3;\nor.b32 hi, hi, t;\nand.b32 hi, hi, 0x8E8E8E8E;\n"
    "shl.b32 lo, w, 4;\nand.b32 lo, lo, 0xF0F0F0F0;\nshr.u32 t, lo, 3;\nor.b32 lo, lo, t;\n"
    "and.b32 lo, lo, 0x8E8E8E8E;\n"
    # f0 = (code 0, code 2), f1 = (4, 6), f2 = (1, 3), f3 = (5, 7): bytes 0/1 or 2/3 of lo / hi into bytes 1 and 3
    "prmt.b32 f0, lo, z, 0x1404;\nprmt.b32 f1, lo, z, 0x3424;\nprmt.b32 f2, hi, z, 0x1404;\n"
    "prmt.b32 f3, hi, z, 0x3424;\n"
    + "".join(f"mul.rn.f16x2 f{i}, f{i}, s2;\n" for i in range(4))
    + "".join(f"mov.b32 {{${2 * i}, ${2 * i + 1}}}, f{i};\n" for i in range(4))
    + "}\n")


@triton.jit
def _bits_to_fp16(w, j: tl.constexpr):
    """Code j (bits 4j..4j+3 of each uint32 of w) as the fp16 E2M1(c) * 2^-14 (see DECODE_BITS_PTX)."""
    c = (w >> (4 * j)) & 0xF
    return (((c & 7) << 9) | ((c & 8) << 12)).to(tl.uint16).to(tl.float16, bitcast=True)


@triton.jit
def decode_bits_portable(w, s16):
    w = w.to(tl.uint32, bitcast=True)
    return (_bits_to_fp16(w, 0) * s16, _bits_to_fp16(w, 1) * s16, _bits_to_fp16(w, 2) * s16,
            _bits_to_fp16(w, 3) * s16, _bits_to_fp16(w, 4) * s16, _bits_to_fp16(w, 5) * s16,
            _bits_to_fp16(w, 6) * s16, _bits_to_fp16(w, 7) * s16)


@triton.jit
def _byte_to_fp16(bits, t: tl.constexpr):
    """Byte t of each int32 of ``bits`` read as an E4M3FN value, widened to fp16 (exact)."""
    return ((bits >> (8 * t)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def decode_word_portable(w, s16):
    w = w.to(tl.uint32, bitcast=True)
    lo = ((w & 0x07070707) << 2) | ((w & 0x08080808) << 4)  # E4M3 bytes of the even elements 0, 2, 4, 6
    hi = ((w >> 2) & 0x1C1C1C1C) | (w & 0x80808080)  # odd elements 1, 3, 5, 7
    return (_byte_to_fp16(lo, 0) * s16, _byte_to_fp16(hi, 0) * s16, _byte_to_fp16(lo, 1) * s16,
            _byte_to_fp16(hi, 1) * s16, _byte_to_fp16(lo, 2) * s16, _byte_to_fp16(hi, 2) * s16,
            _byte_to_fp16(lo, 3) * s16, _byte_to_fp16(hi, 3) * s16)

