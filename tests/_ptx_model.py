"""A CPU model of the PTX instructions the kernels' inline-asm decodes use, to check the decodes' text (which
only the GPU executes) on every input byte."""
from __future__ import annotations

import re

import numpy as np


def run_ptx(ptx: str, operands: dict) -> dict:
    """Execute the straight-line PTX of an inline-asm decode (the instructions the decodes use: mov, and, or, shl, shr,
    prmt, lop3, mul.rn.f16x2) on uint32 numpy arrays; ``operands`` maps $N to arrays or ints (32-bit, or 16-bit for "h"
    operands). Returns every register and $N written. A model of the PTX ISA's semantics for these instructions, so that
    the CPU tests check the decode's text, which only the GPU executes."""
    regs = {k: np.uint32(v & 0xFFFFFFFF) if isinstance(v, int) else v for k, v in operands.items()}

    def val(tok):
        tok = tok.strip()
        if tok.startswith("{"):  # {$a, $b}: two 16-bit halves, low first
            lo, hi = (regs[t.strip()] for t in tok.strip("{}").split(","))
            return (lo.astype(np.uint32) & 0xFFFF) | (hi.astype(np.uint32) << 16)
        if tok.startswith("0x") or tok.lstrip("-").isdigit():
            return np.uint32(int(tok, 0) & 0xFFFFFFFF)
        return regs[tok]

    for line in ptx.splitlines():
        line = line.strip().rstrip(";")
        if not line or line[0] in "{}." or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dst, *src = [a.strip() for a in re.split(r",(?![^{]*})", args)]
        if op == "mov.b32" and dst.startswith("{"):  # split a register into two 16-bit halves
            lo, hi = (t.strip() for t in dst.strip("{}").split(","))
            v = val(src[0]).astype(np.uint32)
            regs[lo], regs[hi] = (v & 0xFFFF).astype(np.uint16), (v >> 16).astype(np.uint16)
            continue
        a = [val(s) for s in src]
        if op == "mov.b32":
            r = np.asarray(a[0], np.uint32)
        elif op == "and.b32":
            r = a[0] & a[1]
        elif op == "or.b32":
            r = a[0] | a[1]
        elif op == "shl.b32":
            r = (a[0].astype(np.uint64) << np.uint64(a[1])).astype(np.uint32)
        elif op == "shr.u32":
            r = a[0] >> a[1]
        elif op == "prmt.b32":  # default mode: selector nibble k picks byte (nibble & 7) of {b, a}; with bit 3 set
            # the byte is that byte's sign bit replicated (0x00 or 0xFF). Any operand may be an array.
            shape = np.broadcast_shapes(*(np.shape(x) for x in a))
            a = [np.broadcast_to(np.asarray(x, np.uint32), shape) for x in a]
            src8 = np.stack([(a[0] >> (8 * i)) & 0xFF for i in range(4)] + [(a[1] >> (8 * i)) & 0xFF for i in range(4)])
            r = np.zeros(shape, np.uint32)
            for k in range(4):
                nib = (a[2] >> (4 * k)) & 0xF
                byte = np.take_along_axis(src8, (nib & 7)[None].astype(np.int64), 0)[0]
                byte = np.where(nib >= 8, np.where(byte >= 0x80, 0xFF, 0x00), byte).astype(np.uint32)
                r |= byte << (8 * k)
        elif op == "lop3.b32":  # r bit = LUT bit at index (a << 2 | b << 1 | c), LUT = immediate
            lut = int(a[3])
            r = np.zeros(np.broadcast_shapes(*(np.shape(x) for x in a[:3])), np.uint32)
            for i in range(8):
                if lut >> i & 1:
                    m = [x if i >> (2 - j) & 1 else ~np.asarray(x, np.uint32) for j, x in enumerate(a[:3])]
                    r |= m[0] & m[1] & m[2]
        elif op == "mul.rn.f16x2":  # IEEE fp16 multiply per half (numpy float16 rounds to nearest even)
            h = [np.stack([(x & 0xFFFF), (x >> 16)]).astype(np.uint16).view(np.float16) for x in a]
            p = (h[0] * h[1]).view(np.uint16).astype(np.uint32)
            r = p[0] | (p[1] << 16)
        else:
            raise AssertionError(f"instruction {op} is not modelled")
        regs[dst] = np.asarray(r, np.uint32)
    return regs
