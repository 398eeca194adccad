"""Independent references for the element-format codec tests (no fp4ref code is used here).

Everything is derived from hand-written format parameters (``SPECS``), literal value tables (``HAND_POSITIVE``)
and exact arithmetic:

* ``ref_value(code, spec)``: decode by integer bit-field arithmetic, returning a ``Fraction`` (or "nan"/"+inf"/
  "-inf").
* ``ref_encode_scalar(x, spec, ...)``: the policy of the SPEC (RNE/RZ/RU/RD, saturation per IEEE 754 §7.4, NaN and
  zero policies, UE8M0 rules) evaluated with ``fractions.Fraction`` and ``bisect`` over the sorted representable
  values. Slow; used on constructed vectors and a few thousand random values.
* ``ref_encode_array(x, spec, ...)``: the same policy vectorized with ``np.searchsorted``. It is exact because every
  format value, every midpoint of two neighbours and every float16/bfloat16/float32/float64 input is a float64
  (comparisons of float64 are exact). It is itself cross-checked against ``ref_encode_scalar`` in the tests.

The ``float64 is exact`` argument: format values have <= 4 significant bits and exponents in [-127, 128], so the
values and the midpoints (<= 5 bits) are float64 numbers; inputs are converted to float64 exactly.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from fractions import Fraction

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class Spec:
    """Hand-written description of a format (independent of fp4ref.formats.FloatFormat)."""

    name: str
    ebits: int
    mbits: int
    bias: int
    signed: bool
    nbits: int
    has_inf: bool
    has_nan: bool
    has_subnormals: bool
    max: Fraction
    min_normal: Fraction
    min_subnormal: Fraction
    nan_codes: tuple
    inf_codes: tuple
    # Unbounded-exponent successor of max (IEEE 754 §7.4: overflow is decided on the value rounded as if the
    # exponent range were unbounded) and whether RNE resolves the tie at (max + next)/2 to max.
    next_above_max: Fraction
    tie_at_max_goes_to_max: bool
    default_saturate: bool
    default_nan: str
    canonical_nan_pos: int | None  # code encode gives for +NaN under nan="nan"
    canonical_nan_neg: int | None
    ml_dtype: object = field(default=None, compare=False)

    @property
    def sign_bit(self) -> int:
        return 1 << (self.nbits - 1) if self.signed else 0

    @property
    def ncodes(self) -> int:
        return 1 << self.nbits

    @property
    def max_code(self) -> int:
        return POS_CODE[self.name][self.max]


F = Fraction
SPECS = {
    # OCP MX v1.0 §5.3.3: E2M1, bias 1, no inf/NaN, max 6 = 0b0111.
    "e2m1": Spec("e2m1", 2, 1, 1, True, 4, False, False, True, F(6), F(1), F(1, 2), (), (),
                 F(8), False, True, "raise", None, None, ml_dtypes.float4_e2m1fn),
    # OCP FP8 (OFP8) spec / PTX: E4M3FN bias 7, max 448 = 0x7E, NaN 0x7F/0xFF, no inf.
    "e4m3fn": Spec("e4m3fn", 4, 3, 7, True, 8, False, True, True, F(448), F(1, 64), F(1, 512),
                   (0x7F, 0xFF), (), F(480), True, True, "nan", 0x7F, 0xFF, ml_dtypes.float8_e4m3fn),
    # IEEE-like E5M2: bias 15, max 57344 = 0x7B, inf 0x7C/0xFC, NaN 0x7D-0x7F / 0xFD-0xFF.
    "e5m2": Spec("e5m2", 5, 2, 15, True, 8, True, True, True, F(57344), F(1, 2**14), F(1, 2**16),
                 (0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF), (0x7C, 0xFC), F(65536), False, True, "nan", 0x7E, 0xFE,
                 ml_dtypes.float8_e5m2),
    # OCP MX v1.0 §5.4.1: E8M0 scale, 2^(b-127), 255 = NaN, no zero/sign/inf.
    "ue8m0": Spec("ue8m0", 8, 0, 127, False, 8, False, True, False, F(2) ** 127, F(1, 2**127), F(1, 2**127),
                  (0xFF,), (), F(2) ** 128, True, False, "nan", 0xFF, 0xFF, ml_dtypes.float8_e8m0fnu),
    # OCP MX v1.0 §5.3.2: FP6 E2M3 bias 1 max 7.5; E3M2 bias 3 max 28. No inf/NaN.
    "e2m3": Spec("e2m3", 2, 3, 1, True, 6, False, False, True, F(15, 2), F(1), F(1, 8), (), (),
                 F(8), False, True, "raise", None, None, ml_dtypes.float6_e2m3fn),
    "e3m2": Spec("e3m2", 3, 2, 3, True, 6, False, False, True, F(28), F(1, 4), F(1, 16), (), (),
                 F(32), False, True, "raise", None, None, ml_dtypes.float6_e3m2fn),
}
NAMES = tuple(SPECS)

# Literal hand tables: the non-negative values of codes 0, 1, 2, ... (positive half of the code space).
HAND_POSITIVE = {
    "e2m1": [0, 0.5, 1, 1.5, 2, 3, 4, 6],
    "e2m3": [0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875,
             1, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875,
             2, 2.25, 2.5, 2.75, 3, 3.25, 3.5, 3.75,
             4, 4.5, 5, 5.5, 6, 6.5, 7, 7.5],
    "e3m2": [0, 0.0625, 0.125, 0.1875, 0.25, 0.3125, 0.375, 0.4375,
             0.5, 0.625, 0.75, 0.875, 1, 1.25, 1.5, 1.75,
             2, 2.5, 3, 3.5, 4, 5, 6, 7,
             8, 10, 12, 14, 16, 20, 24, 28],
}
# Spot values for the 8-bit formats (code -> value), written by hand from the specs.
HAND_SPOT = {
    "e4m3fn": {0x00: 0.0, 0x01: 2.0**-9, 0x07: 7 * 2.0**-9, 0x08: 2.0**-6, 0x38: 1.0, 0x39: 1.125, 0x3F: 1.875,
               0x40: 2.0, 0x44: 3.0, 0x48: 4.0, 0x50: 8.0, 0x78: 256.0, 0x7E: 448.0, 0x80: -0.0, 0x81: -(2.0**-9),
               0xB8: -1.0, 0xFE: -448.0, 0x7F: "nan", 0xFF: "nan"},
    "e5m2": {0x00: 0.0, 0x01: 2.0**-16, 0x03: 3 * 2.0**-16, 0x04: 2.0**-14, 0x3C: 1.0, 0x3D: 1.25, 0x3E: 1.5,
             0x3F: 1.75, 0x40: 2.0, 0x48: 8.0, 0x49: 10.0, 0x7B: 57344.0, 0x7C: "+inf", 0x7D: "nan", 0x7E: "nan",
             0x7F: "nan", 0x80: -0.0, 0xBC: -1.0, 0xFB: -57344.0, 0xFC: "-inf", 0xFD: "nan", 0xFF: "nan"},
    "ue8m0": {0x00: 2.0**-127, 0x01: 2.0**-126, 0x7E: 0.5, 0x7F: 1.0, 0x80: 2.0, 0x81: 4.0, 0xFE: 2.0**127,
              0xFF: "nan"},
}


def ref_value(code: int, spec: Spec):
    """Decode one code by bit-field arithmetic: a Fraction, or "nan", "+inf", "-inf"; -0 is ("-0")."""
    if not 0 <= code < spec.ncodes:
        raise ValueError(code)
    neg = bool(spec.signed and code & spec.sign_bit)
    mag = code & (spec.sign_bit - 1) if spec.signed else code
    e = mag >> spec.mbits
    m = mag & ((1 << spec.mbits) - 1)
    emax_field = (1 << spec.ebits) - 1
    if spec.name == "e4m3fn" and e == emax_field and m == (1 << spec.mbits) - 1:
        return "nan"
    if spec.name == "e5m2" and e == emax_field:
        return "nan" if m else ("-inf" if neg else "+inf")
    if spec.name == "ue8m0" and e == emax_field:
        return "nan"
    if e == 0 and spec.has_subnormals:
        v = F(m, 1 << spec.mbits) * F(2) ** (1 - spec.bias)
    else:
        v = (1 + F(m, 1 << spec.mbits)) * F(2) ** (e - spec.bias)
    if neg:
        return "-0" if v == 0 else -v
    return v


def value_as_float(v) -> float:
    if v == "nan":
        return math.nan
    if v == "+inf":
        return math.inf
    if v == "-inf":
        return -math.inf
    if v == "-0":
        return -0.0
    return float(v)


def _build_grid():
    pos_vals, pos_code = {}, {}
    for name, spec in SPECS.items():
        vals = {}
        for c in range(spec.ncodes):
            v = ref_value(c, spec)
            if isinstance(v, Fraction) and v >= 0:
                assert v not in vals, (name, c)
                vals[v] = c
        pos_vals[name] = sorted(vals)
        pos_code[name] = vals
    return pos_vals, pos_code


POS_VALS, POS_CODE = _build_grid()
POS_VALS_F64 = {n: np.array([float(v) for v in vs], dtype=np.float64) for n, vs in POS_VALS.items()}
POS_CODES_ARR = {n: np.array([POS_CODE[n][v] for v in vs], dtype=np.int64) for n, vs in POS_VALS.items()}

DIRECTED = ("rne", "rna", "rz", "ru", "rd")


class RefRaise(Exception):
    """The SPEC says encode raises ValueError for this input."""


def resolve_policy(spec: Spec, saturate, nan):
    sat = spec.default_saturate if saturate is None else saturate
    nanp = spec.default_nan if nan is None else nan
    return sat, nanp


def _overflow_code(spec: Spec, neg: bool, saturate: bool) -> int:
    s = spec.sign_bit if neg else 0
    if saturate:
        return spec.max_code | s
    if spec.has_inf:
        return spec.inf_codes[0] | s
    return spec.canonical_nan_neg if neg else spec.canonical_nan_pos


def _nan_code(spec: Spec, neg: bool, nanp: str) -> int:
    if nanp == "raise":
        raise RefRaise("nan")
    if nanp == "max":
        return spec.max_code
    if nanp == "zero":
        return 0
    assert nanp == "nan" and spec.has_nan
    return spec.canonical_nan_neg if neg else spec.canonical_nan_pos


def ref_encode_scalar(x, spec: Spec, mode: str = "rne", saturate=None, nan=None):
    """Exact encode of one float (python float or numpy float16/bfloat16/float32/float64 scalar).

    For mode "stochastic" returns (lo_code, hi_code, p_up) with p_up the probability of the hi code.
    Raises RefRaise where the SPEC says encode raises ValueError.
    """
    sat, nanp = resolve_policy(spec, saturate, nan)
    xf = float(x)  # exact: float16/bfloat16/float32 are subsets of float64
    neg = math.copysign(1.0, xf) < 0
    if math.isnan(xf):
        c = _nan_code(spec, neg, nanp)
        return (c, c, 0.0) if mode == "stochastic" else c
    if not spec.signed:
        if xf == 0:
            return (0, 0, 0.0) if mode == "stochastic" else 0
        if neg:
            raise RefRaise("negative")
    s = spec.sign_bit if neg else 0
    if math.isinf(xf):
        c = _overflow_code(spec, neg, sat)
        return (c, c, 0.0) if mode == "stochastic" else c
    a = abs(F(xf))
    vals = POS_VALS[spec.name]
    codes = POS_CODE[spec.name]
    mx = spec.max
    if a > mx:
        if mode == "stochastic":
            raise NotImplementedError("stochastic beyond max is not specified")
        nxt = spec.next_above_max
        mid = (mx + nxt) / 2
        if mode == "rne":
            over = a > mid or (a == mid and not spec.tie_at_max_goes_to_max)
        elif mode == "rna":
            over = a >= mid
        elif mode == "rz":
            over = False
        elif mode == "ru":
            over = not neg
        elif mode == "rd":
            over = neg
        else:
            raise ValueError(mode)
        return _overflow_code(spec, neg, sat) if over else (codes[mx] | s)
    i = bisect.bisect_left(vals, a)
    if vals[i] == a:
        c = codes[a] | s
        return (c, c, 0.0) if mode == "stochastic" else c
    if i == 0:
        # only UE8M0 (no zero): everything below 2^-127 clamps to byte 0 in every mode
        assert not spec.signed
        return (0, 0, 0.0) if mode == "stochastic" else 0
    lo, hi = vals[i - 1], vals[i]
    if mode == "stochastic":
        return (codes[lo] | s, codes[hi] | s, float((a - lo) / (hi - lo)))
    if mode == "rne":
        mid = (lo + hi) / 2
        if a < mid:
            pick = lo
        elif a > mid:
            pick = hi
        else:
            pick = lo if codes[lo] % 2 == 0 else hi  # the even code (UE8M0 too: the even byte)
    elif mode == "rna":
        pick = lo if a < (lo + hi) / 2 else hi  # ties away from zero
    elif mode == "rz":
        pick = lo
    elif mode == "ru":
        pick = lo if neg else hi
    elif mode == "rd":
        pick = hi if neg else lo
    else:
        raise ValueError(mode)
    return codes[pick] | s


def ref_encode_array(x, spec: Spec, mode: str = "rne", saturate=None, nan=None) -> np.ndarray:
    """Vectorized exact encode (same policy as ref_encode_scalar). NaN handling per ``nan`` except "raise",
    which the caller must exclude (positions get code 0). Negative UE8M0 inputs get -1 (caller checks)."""
    sat, nanp = resolve_policy(spec, saturate, nan)
    xa = np.asarray(x)
    if xa.dtype == ml_dtypes.bfloat16 or xa.dtype == np.float16:
        xa = xa.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        x64 = xa.astype(np.float64).ravel()
    neg = np.signbit(x64)
    isnan = np.isnan(x64)
    isinf = np.isinf(x64)
    a = np.abs(x64)
    vals = POS_VALS_F64[spec.name]
    vcodes = POS_CODES_ARR[spec.name]
    mx = float(spec.max)
    n = vals.size
    # neighbours lo <= a <= hi within [vals[0], max]
    a_in = np.where(isnan | isinf | (a > mx), mx, a)
    i = np.searchsorted(vals, a_in, side="left")
    i = np.clip(i, 0, n - 1)
    exact = vals[i] == a_in
    ilo = np.where(exact, i, np.maximum(i - 1, 0))
    ihi = i
    lo, hi = vals[ilo], vals[ihi]
    mid = (lo + hi) / 2  # exact (<= 5 significant bits)
    if mode == "rne":
        tie = a_in == mid
        tie_pick = np.where(vcodes[ilo] % 2 == 0, ilo, ihi)  # the even code (UE8M0 too: the even byte)
        pick = np.where(a_in < mid, ilo, np.where(a_in > mid, ihi, tie_pick))
        pick = np.where(exact, i, pick)
    elif mode == "rna":
        pick = np.where(a_in < mid, ilo, ihi)
    elif mode == "rz":
        pick = ilo
    elif mode == "ru":
        pick = np.where(neg, ilo, ihi)
    elif mode == "rd":
        pick = np.where(neg, ihi, ilo)
    else:
        raise ValueError(mode)
    pick = np.where(exact, i, pick)
    below = a_in < vals[0]  # UE8M0 only: clamp to byte 0
    codes = vcodes[pick]
    codes = np.where(below, vcodes[0], codes)
    s = spec.sign_bit
    codes = np.where(neg & spec.signed, codes | s, codes)
    # overflow of finite values
    nxt = float(spec.next_above_max)
    omid = (mx + nxt) / 2
    fin_over = (~isnan) & (~isinf) & (a > mx)
    if mode == "rne":
        over = (a > omid) | ((a == omid) & (not spec.tie_at_max_goes_to_max))
    elif mode == "rna":
        over = a >= omid
    elif mode == "rz":
        over = np.zeros_like(a, dtype=bool)
    elif mode == "ru":
        over = ~neg
    else:
        over = neg.copy()
    ovf_pos = _overflow_code(spec, False, sat)
    ovf_neg = _overflow_code(spec, True, sat) if spec.signed else -1
    maxc = spec.max_code
    fin_code = np.where(over, np.where(neg, ovf_neg, ovf_pos), np.where(neg & spec.signed, maxc | s, maxc))
    codes = np.where(fin_over, fin_code, codes)
    codes = np.where(isinf, np.where(neg, ovf_neg, ovf_pos), codes)
    if nanp == "raise":
        nan_pos = nan_neg = 0
    else:
        nan_pos = _nan_code(spec, False, nanp)
        nan_neg = _nan_code(spec, True, nanp)
    codes = np.where(isnan, np.where(neg, nan_neg, nan_pos), codes)
    if not spec.signed:
        codes = np.where(a == 0, 0, codes)
        codes = np.where(neg & ~isnan & (a != 0), -1, codes)
    return codes.reshape(xa.shape)


def neighbours_scalar(x, spec: Spec):
    """(rd_code, ru_code) of a finite in-range x: the two codes stochastic rounding may return."""
    return ref_encode_scalar(x, spec, "rd", saturate=True), ref_encode_scalar(x, spec, "ru", saturate=True)


def constructed_values(spec: Spec) -> np.ndarray:
    """Non-negative float64 test inputs: every value, every midpoint of adjacent values (including 0|min_subnormal
    and max|next_above_max), and the float32 and float64 neighbours of each; tiny and huge values."""
    vals = POS_VALS[spec.name]
    pts = set()
    ext = list(vals) + [spec.next_above_max]
    for k, v in enumerate(ext):
        pts.add(v)
        if k + 1 < len(ext):
            pts.add((v + ext[k + 1]) / 2)
    out = set()
    for p in pts:
        f = float(p)
        out.add(f)
        for dt in (np.float32, np.float64):
            with np.errstate(over="ignore"):
                pf = dt(f)
            if float(pf) == f:
                out.add(float(np.nextafter(pf, dt(np.inf))))
                out.add(float(np.nextafter(pf, dt(0))))
    big = [float(np.finfo(np.float32).max), float(np.finfo(np.float64).max), 3e10, 1e300, 2.0**200, 1000.0,
           float(2 * spec.max), 4 * float(spec.max)]
    tiny = [float(np.finfo(np.float32).smallest_subnormal), 5e-324, float(np.finfo(np.float32).tiny), 1e-300,
            2.0**-130, float(spec.min_subnormal) / 4, float(spec.min_subnormal) / 3]
    out.update(big + tiny)
    out.discard(math.inf)
    return np.array(sorted(out), dtype=np.float64)


def f32_exact(v64: np.ndarray) -> np.ndarray:
    """The members of a float64 array that float32 represents exactly, as float32."""
    with np.errstate(over="ignore"):
        v32 = v64.astype(np.float32)
    keep = v32.astype(np.float64) == v64
    return v32[keep]
