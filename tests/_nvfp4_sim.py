"""Independent scalar model of the NVFP4 recipes in exact rational arithmetic (tests only).

Every fp32 operation is modelled as the exact rational result rounded once to binary32 (RNE, subnormals), every
cast to E4M3FN / E2M1 as an exact RNE rounding of the rational value. Written from the recipe descriptions in
fp4ref.blockscale.NVFP4Recipe (which cite the sources), without numpy arithmetic, so that it can check the
vectorised implementation and derive the expected bytes of the cross-recipe tests.
"""
from __future__ import annotations

import math
from fractions import Fraction as Q

FLT_MAX = Q((1 << 24) - 1, 1) * Q(2) ** (127 - 23)


def _floor_log2(q: Q) -> int:
    assert q > 0
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Q(2) ** e > q:
        e -= 1
    return e


def round_rne(q: Q, p: int, emin: int) -> Q:
    """Round |q| to p significant bits with minimum exponent emin (gradual underflow), ties to even; sign kept."""
    if q == 0:
        return Q(0)
    sign = -1 if q < 0 else 1
    a = abs(q)
    e = max(_floor_log2(a), emin)
    quantum = Q(2) ** (e - (p - 1))
    n = a / quantum
    fl = math.floor(n)
    rem = n - fl
    if rem > Q(1, 2) or (rem == Q(1, 2) and fl % 2 == 1):
        fl += 1
    return sign * fl * quantum


def f32(q: Q) -> Q:
    r = round_rne(q, 24, -126)
    if abs(r) > FLT_MAX:
        raise OverflowError("fp32 overflow in the model")
    return r


def mul(a, b):
    return f32(Q(a) * Q(b))


def div(a, b):
    return f32(Q(a) / Q(b))


E4M3_VALUES = {}
for code in range(0x7F):
    e, m = code >> 3, code & 7
    v = Q(m, 8) * Q(2) ** -6 if e == 0 else (1 + Q(m, 8)) * Q(2) ** (e - 7)
    E4M3_VALUES[v] = code
E2M1_MAG = [Q(0), Q(1, 2), Q(1), Q(3, 2), Q(2), Q(3), Q(4), Q(6)]


def e4m3(q: Q) -> int:
    """RNE to E4M3FN of a non-negative value <= 448."""
    assert 0 <= q <= 448
    return E4M3_VALUES[round_rne(q, 4, -6)]


def e4m3_value(code: int) -> Q:
    return {v: k for k, v in E4M3_VALUES.items()}[code]


def e2m1(q: Q, negative: bool) -> int:
    """RNE to E2M1 of |q| <= 6 (saturating), sign bit from ``negative``."""
    mag = min(abs(q), Q(6))
    r = round_rne(mag, 2, 0)
    return E2M1_MAG.index(r) | (8 if negative else 0)


def clamp(q, lo, hi):
    return max(Q(lo), min(Q(hi), Q(q)))


FOUR_OVER_SIX = {"te-4over6": (448, "MAE"), "te-4over6-mse": (448, "MSE"), "te-4over6-256": (256, "MAE"),
                 "te-4over6-mse-256": (256, "MSE")}
TORCHAO = ("torchao", "torchao-single-level", "torchao-0.16", "torchao-0.16-single-level")


def add(a, b):
    return f32(Q(a) + Q(b))


def sub(a, b):
    return f32(Q(a) - Q(b))


def te_element_codes(blk, sv, sd):
    """TE's element step: e2m1(clamp(x * min(1 / (s * S_dec), FLT_MAX), -6, 6)), -0.0 -> 0x0."""
    out = []
    enc = FLT_MAX if sv == 0 else min(div(1, mul(sv, sd)), FLT_MAX)
    for x in blk:
        xq = Q(x)
        y = clamp(mul(xq, enc), -6, 6) if xq else Q(0)
        out.append(0 if y == 0 else e2m1(y, math.copysign(1.0, x) < 0))
    return out


def four_over_six_block(blk, a, A, se, sd, e4m3_max, mode):
    """Both candidates of one block: [(scale byte, codes, fp32 block error) for map-to-4, then map-to-6]."""
    def mul_or_big(p, q):  # an fp32 overflow gives inf, which the clamp to 448 turns into 448
        try:
            return mul(p, q)
        except OverflowError:
            return Q(449)

    base = mul_or_big(div(a, 6), se)
    out = []
    for pre in (mul_or_big(base, Q(3, 2)), base):
        s = e4m3(clamp(pre, 0, 448))
        sv = e4m3_value(s)
        codes = te_element_codes(blk, sv, sd)
        err = Q(0)
        for x, c in zip(blk, codes):
            v = E2M1_MAG[c & 7] * (-1 if c & 8 else 1)
            v = div(mul(mul(v, sv), A), 6 * e4m3_max)
            d = sub(v, Q(x))
            err = add(err, mul(d, d) if mode == "MSE" else abs(d))
        out.append((s, codes, err))
    return out


def quantize_row(xs: list[float], recipe: str, *, A=None, block_amax=None,
                 pick4=None) -> tuple[list[int], list[int], Q]:
    """(scale bytes, unpacked codes, global decode scale) of one row of fp32 values (python floats), block 16.

    ``A`` overrides the global amax; ``block_amax`` (a list, one per block) overrides the block amaxes (2-D tiles);
    ``pick4`` (a list of bools, one per block) overrides the 4over6 choice (2-D tiles choose per tile).
    """
    A = max(Q(abs(x)) for x in xs) if A is None else Q(A)
    scales, codes = [], []
    if recipe in ("te", "sol") or recipe in FOUR_OVER_SIX:
        n = 6 * FOUR_OVER_SIX[recipe][0] if recipe in FOUR_OVER_SIX else 2688
        try:
            se = min(div(n, A), FLT_MAX) if A else FLT_MAX
        except OverflowError:  # n / A = inf in fp32
            se = FLT_MAX
        if se == 0:
            se = Q(1)
        sd = div(1, se)
        g = sd
    elif recipe in ("torchao-single-level", "torchao-0.16-single-level"):
        g = Q(1)
    else:
        g = div(A, 2688)
        if g == 0:
            g = Q(1)
    for b in range(0, len(xs), 16):
        blk = xs[b:b + 16]
        a = max(Q(abs(x)) for x in blk) if block_amax is None else Q(block_amax[b // 16])
        if recipe in FOUR_OVER_SIX:
            c4, c6 = four_over_six_block(blk, a, A, se, sd, *FOUR_OVER_SIX[recipe])
            take4 = c4[2] < c6[2] if pick4 is None else pick4[b // 16]
            s, cs, _ = c4 if take4 else c6
            scales.append(s)
            codes.extend(cs)
            continue
        if recipe == "te":
            s = e4m3(clamp(min(mul(a, mul(se, div(1, 6))), FLT_MAX), 0, 448))
        elif recipe == "sol":
            s = e4m3(clamp(min(mul(div(a, 6), se), FLT_MAX), 0, 448))
        elif recipe in ("torchao", "torchao-0.16"):
            s = e4m3(clamp(div(div(a, 6), g), Q(1, 64), 448))
        elif recipe in ("torchao-single-level", "torchao-0.16-single-level"):
            s = e4m3(clamp(div(a, 6), Q(1, 64), 448))
        elif recipe == "modelopt":
            p = div(a, mul(6, g))
            if p == 0:
                p = Q(1)
            s = e4m3(clamp(p, Q(1, 512), 448))
        elif recipe == "exact":
            s = e4m3(min(a / (6 * g), Q(448)))
        else:
            raise ValueError(recipe)
        sv = e4m3_value(s)
        scales.append(s)
        for x in blk:
            neg = math.copysign(1.0, x) < 0
            xq = Q(x)
            if recipe in ("te", "sol"):
                enc = FLT_MAX if sv == 0 else min(div(1, mul(sv, sd)), FLT_MAX)
                y = clamp(mul(xq, enc), -6, 6) if xq else Q(0)
                codes.append(0 if y == 0 else e2m1(y, neg))
            elif recipe in ("torchao", "torchao-single-level"):
                try:
                    r = div(div(1, g), sv)  # (1/pts)/s, or 1/s (g = 1)
                except OverflowError:  # 1/pts = inf: x * inf = +-inf -> +-6; 0 * inf = NaN -> fp4ref: zero code
                    codes.append((7 if xq else 0) | (8 if neg else 0))
                    continue
                codes.append(e2m1(clamp(mul(xq, r), -6, 6), neg))
            elif recipe in ("torchao-0.16", "torchao-0.16-single-level"):
                y = clamp(div(xq, mul(g, sv)), -6, 6)
                codes.append(e2m1(y, neg))
            elif recipe == "modelopt":
                y = div(xq, mul(sv, g))
                codes.append(0 if y == 0 else e2m1(y, neg))
            else:
                codes.append(0 if sv == 0 else e2m1(xq / (sv * g), neg))
    return scales, codes, g
