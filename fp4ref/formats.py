"""Element formats (E2M1, E2M3, E3M2, E4M3FN, E5M2, UE8M0) and exact encode / decode.

A format is data: one frozen :class:`FloatFormat` per element type, and one registry (:data:`FORMATS`) that drives
``__all__``, the tests, the CLI and docs/formats.md. Composite block formats (NVFP4, MXFP4, ...) live in
:mod:`fp4ref.blockscale`.

Encoding rounds the exact input value once. float16 and bfloat16 inputs widen exactly to float32, float32 stays
float32 and float64 stays float64, and the rounding to the target format is done with integer arithmetic on the
input's bits: there is no intermediate cast that could round twice. (float16 / bfloat16 / float32 inputs in the
deterministic modes look their code up in a table that this arithmetic fills once per rounding class of float32.)

Policies (each one documented and tested; see docs/formats.md):

* Rounding: ``"rne"`` (default; ties to the even code), ``"rna"`` (ties away from zero), ``"rz"``, ``"ru"`` (toward
  +inf), ``"rd"`` (toward -inf), ``"stochastic"`` (needs ``rng``); aliases ``"floor"`` = rd, ``"ceil"`` = ru. See
  :class:`Rounding`; docs/formats.md shows every mode at a tie of every format.
* Saturation: with ``saturate=True`` every finite overflow and +-inf becomes +-max (PTX ``cvt ... .satfinite``, the
  CUDA ``__NV_SATFINITE`` conversions and Triton's fp8 casts). With ``saturate=False``, overflow follows IEEE 754-2019
  §7.4 with "infinity" meaning the format's inf code if it has one, else its NaN code (ml_dtypes' behaviour).
  Defaults: E2M1/E2M3/E3M2 saturate always (they have neither inf nor NaN); E4M3FN and E5M2 saturate by default;
  UE8M0 does not (overflow and inf give its NaN byte 0xFF).
* NaN input: formats with a NaN keep it (``nan="nan"``, sign kept where the format is signed); formats without one
  raise ``ValueError`` by default; ``nan="max"`` gives +max whatever the NaN's sign (PTX ``cvt.rn.satfinite``),
  ``nan="zero"`` gives +0.
* Zeros: -0.0 and negative values that round to zero give the negative-zero code (E2M1 0x8, E4M3FN/E5M2 0x80).
* UE8M0 is unsigned and has no zero: a negative non-zero input raises ``ValueError``; +-0 and every value that
  rounds below 2^-127 give byte 0 (2^-127), as torch's float8_e8m0fnu cast maps 0 to 0x00.
"""
from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, field

import numpy as np

from ._validate import as_code_array, as_float_array, is_int

__all__ = [
    "FloatFormat",
    "Rounding",
    "NanPolicy",
    "E2M1",
    "E2M3",
    "E3M2",
    "E4M3FN",
    "E5M2",
    "UE8M0",
    "FORMATS",
    "get_format",
    "decode",
    "encode",
    "code_class",
]


@dataclass(frozen=True)
class FloatFormat:
    """A small binary floating-point element format.

    Attributes:
        name: registry name, lower case (``"e2m1"``).
        ebits, mbits: exponent and explicit mantissa (fraction) bits.
        bias: exponent bias. A normal code with exponent field E and fraction f has value (1 + f/2^m) * 2^(E - bias).
        signed: whether the top bit is a sign bit.
        has_subnormals: whether exponent field 0 encodes subnormals f/2^m * 2^(1 - bias) (False for UE8M0, whose
            byte 0 is the normal value 2^-127).
        special: how the all-ones exponent field is used: ``"none"`` (all codes finite), ``"ieee"`` (inf and NaN as in
            IEEE 754), ``"fn"`` (only the all-ones code is NaN, "finite + NaN"), ``"ue8m0"`` (byte 0xFF is NaN).
        source: the specification the format's definition comes from.

    Raises (on construction, each naming the field):
        TypeError: ``name`` or ``source`` not a str; ``ebits``, ``mbits`` or ``bias`` not an int (a bool is not);
            ``signed`` or ``has_subnormals`` not a bool.
        ValueError: an empty ``name``; ``special`` not one of the four; ``ebits`` < 1 or ``mbits`` < 0; more than 8
            bits in all (``signed + ebits + mbits``: codes are stored as uint8); ``special="ieee"`` with
            ``mbits`` = 0 (no NaN codes) or ``ebits`` < 2 (no normal binade); ``special="fn"`` with ``mbits`` = 0
            (the NaN would be the only code of the top binade); ``special="ue8m0"`` not unsigned with
            ``mbits`` = 0 and no subnormals; ``has_subnormals=False`` with another ``special`` (the encoder has no
            rule for values below the smallest normal then); a ``bias`` that puts a value outside float32 (every
            value must be exact in float32, as :func:`decode` returns it: max < 2^128, smallest magnitude
            >= 2^-149).
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    signed: bool
    has_subnormals: bool
    special: str
    source: str
    # Derived, filled by __post_init__.
    nbits: int = field(init=False)
    emin: int = field(init=False)
    emax: int = field(init=False)
    max_code: int = field(init=False)
    max: float = field(init=False)
    min_normal: float = field(init=False)
    min_subnormal: float = field(init=False)
    has_inf: bool = field(init=False)
    has_nan: bool = field(init=False)
    nan_codes: tuple = field(init=False)
    inf_codes: tuple = field(init=False)

    def _check_fields(self):
        """The field checks of __post_init__ (see the class docstring): each error names the field."""
        for fname in ("name", "source"):
            if not isinstance(getattr(self, fname), str):
                raise TypeError(f"FloatFormat.{fname}={getattr(self, fname)!r}: expected a str")
        if not self.name:
            raise ValueError("FloatFormat.name is empty: the format needs a name")
        for fname in ("ebits", "mbits", "bias"):
            if not is_int(getattr(self, fname)):
                raise TypeError(f"FloatFormat {self.name!r}: {fname}={getattr(self, fname)!r} is not an int")
        for fname in ("signed", "has_subnormals"):
            if not isinstance(getattr(self, fname), (bool, np.bool_)):
                raise TypeError(f"FloatFormat {self.name!r}: {fname}={getattr(self, fname)!r} is not a bool")
        if self.special not in ("none", "ieee", "fn", "ue8m0"):
            raise ValueError(f"FloatFormat {self.name!r}: special={self.special!r} is not one of 'none', 'ieee', "
                             "'fn', 'ue8m0'")
        if self.ebits < 1:
            raise ValueError(f"FloatFormat {self.name!r}: ebits={self.ebits} must be >= 1")
        if self.mbits < 0:
            raise ValueError(f"FloatFormat {self.name!r}: mbits={self.mbits} must be >= 0")
        nbits = int(self.signed) + self.ebits + self.mbits
        if nbits > 8:  # encode returns uint8 codes and decode reads codes as uint8: a wider code would wrap
            raise ValueError(f"FloatFormat {self.name!r}: signed + ebits + mbits = {nbits} bits; codes are stored "
                             "as uint8, so at most 8 bits")
        if self.special == "ieee" and (self.mbits < 1 or self.ebits < 2):
            raise ValueError(f"FloatFormat {self.name!r}: special='ieee' needs mbits >= 1 (NaN codes) and ebits >= 2 "
                             f"(a normal binade below inf/NaN), got ebits={self.ebits}, mbits={self.mbits}")
        if self.special == "fn" and self.mbits < 1:
            raise ValueError(f"FloatFormat {self.name!r}: special='fn' needs mbits >= 1, got mbits={self.mbits}")
        if self.special == "ue8m0" and (self.signed or self.mbits or self.has_subnormals):
            raise ValueError(f"FloatFormat {self.name!r}: special='ue8m0' needs signed=False, mbits=0 and "
                             f"has_subnormals=False, got signed={self.signed}, mbits={self.mbits}, "
                             f"has_subnormals={self.has_subnormals}")
        if not self.has_subnormals and self.special != "ue8m0":
            raise ValueError(f"FloatFormat {self.name!r}: has_subnormals=False is supported only with "
                             "special='ue8m0' (the encoder has no rule below the smallest normal otherwise)")

    def __post_init__(self):
        self._check_fields()
        s = object.__setattr__
        m = self.mbits
        nbits = int(self.signed) + self.ebits + m
        eall = (1 << self.ebits) - 1
        if self.special == "ieee":
            emax_field, mant_max = eall - 1, (1 << m) - 1
        elif self.special == "fn":
            emax_field, mant_max = eall, (1 << m) - 2
        elif self.special == "ue8m0":
            emax_field, mant_max = eall - 1, 0
        else:  # "none" (_check_fields refused anything else)
            emax_field, mant_max = eall, (1 << m) - 1
        emin = (1 if self.has_subnormals else 0) - self.bias
        emax = emax_field - self.bias
        low = emin - m if self.has_subnormals else emin
        if emax > 127 or low < -149:  # decode promises every value exact in float32
            raise ValueError(f"FloatFormat {self.name!r}: bias={self.bias} puts values outside float32 (largest "
                             f"binade 2^{emax}, smallest magnitude 2^{low}; need <= 2^127 and >= 2^-149)")
        s(self, "nbits", nbits)
        s(self, "emin", emin)
        s(self, "emax", emax)
        s(self, "max_code", (emax_field << m) | mant_max)
        s(self, "max", math.ldexp((1 << m) + mant_max, emax - m))
        s(self, "min_normal", math.ldexp(1.0, emin))
        s(self, "min_subnormal", math.ldexp(1.0, emin - m) if self.has_subnormals else math.ldexp(1.0, emin))
        mag = (1 << (nbits - int(self.signed))) - 1
        sign = (1 << (nbits - 1)) if self.signed else 0
        if self.special == "ieee":
            inf = (eall << m,)
            nans = tuple(range((eall << m) + 1, mag + 1))
        elif self.special in ("fn", "ue8m0"):
            inf, nans = (), (mag,)
        else:
            inf, nans = (), ()
        with_sign = lambda codes: tuple(sorted(codes + tuple(c | sign for c in codes))) if sign else codes
        s(self, "inf_codes", with_sign(inf))
        s(self, "nan_codes", with_sign(nans))
        s(self, "has_inf", bool(inf))
        s(self, "has_nan", bool(nans))

    @property
    def num_codes(self) -> int:
        """Number of codes, 2**nbits."""
        return 1 << self.nbits

    @property
    def nan_code(self) -> int:
        """The canonical (positive) NaN code this library writes; -1 if the format has no NaN."""
        if not self.has_nan:
            return -1
        if self.special == "ieee":  # quiet NaN, top fraction bit set (ml_dtypes, torch)
            return (((1 << self.ebits) - 1) << self.mbits) | (1 << (self.mbits - 1))
        return (1 << (self.nbits - int(self.signed))) - 1

    @property
    def inf_code(self) -> int:
        """The positive-infinity code; -1 if the format has no inf."""
        return (((1 << self.ebits) - 1) << self.mbits) if self.has_inf else -1

    def __repr__(self) -> str:
        return f"FloatFormat({self.name!r}, ebits={self.ebits}, mbits={self.mbits}, bias={self.bias})"


E2M1 = FloatFormat(
    "e2m1", 2, 1, 1, signed=True, has_subnormals=True, special="none",
    source="OCP Microscaling Formats (MX) v1.0, §5.3.3 (FP4 E2M1); NVFP4 element type (PTX ISA .e2m1)",
)
E2M3 = FloatFormat(
    "e2m3", 2, 3, 1, signed=True, has_subnormals=True, special="none",
    source="OCP Microscaling Formats (MX) v1.0, §5.3.2 (FP6 E2M3)",
)
E3M2 = FloatFormat(
    "e3m2", 3, 2, 3, signed=True, has_subnormals=True, special="none",
    source="OCP Microscaling Formats (MX) v1.0, §5.3.2 (FP6 E3M2)",
)
E4M3FN = FloatFormat(
    "e4m3fn", 4, 3, 7, signed=True, has_subnormals=True, special="fn",
    source="OCP 8-bit Floating Point Specification (OFP8) v1.0, §5 (E4M3); MX v1.0 §5.3.1; PTX ISA .e4m3",
)
E5M2 = FloatFormat(
    "e5m2", 5, 2, 15, signed=True, has_subnormals=True, special="ieee",
    source="OCP OFP8 v1.0, §5 (E5M2, IEEE 754-2019 conventions for inf/NaN); PTX ISA .e5m2",
)
UE8M0 = FloatFormat(
    "ue8m0", 8, 0, 127, signed=False, has_subnormals=False, special="ue8m0",
    source="OCP Microscaling Formats (MX) v1.0, §5.4.1 (E8M0 scale: 2^(b-127), 0xFF = NaN, no zero, no sign)",
)

#: Registry: name -> format. Drives tests, the CLI and the generated docs.
FORMATS: dict = {f.name: f for f in (E2M1, E2M3, E3M2, E4M3FN, E5M2, UE8M0)}


def get_format(fmt) -> FloatFormat:
    """Return the :class:`FloatFormat` for ``fmt`` (a FloatFormat or a registry name, case-insensitive).

    Raises:
        ValueError: unknown name. TypeError: neither a string nor a FloatFormat.
    """
    if isinstance(fmt, FloatFormat):
        return fmt
    if isinstance(fmt, str):
        try:
            return FORMATS[fmt.lower()]
        except KeyError:
            raise ValueError(f"fmt={fmt!r} is not a known format{_name_hint(fmt)}; expected one of "
                             f"{sorted(FORMATS)}") from None
    raise TypeError(f"fmt must be a format name or FloatFormat, got {type(fmt).__name__}")


def _name_hint(name: str) -> str:
    """What an unknown format name may have meant (for error messages), or "": the OCP MX spec calls the 8-bit
    element "E4M3" (mx_quantize takes that name); as a codec the registry names it for what it is, finite-only with
    one NaN pattern."""
    return " ('e4m3fn' is OCP E4M3)" if name.lower() == "e4m3" else ""


class Rounding(str, enum.Enum):
    """Rounding of the exact value to the format (IEEE 754-2019 §4.3 attributes).

    RNE: round to nearest, ties to even (roundTiesToEven): a value halfway between two neighbouring codes gets the
        one whose code is even (its last bit 0). Default everywhere. For UE8M0 (no mantissa bits: the tie between
        2^k and 2^(k+1) is 1.5 * 2^k) that is the even byte: 3.0 -> 0x80 (2.0), 0.75 -> 0x7E (0.5), 1.5 -> 0x80
        (2.0); ml_dtypes and torch send every UE8M0 tie up instead, which is RNA here.
    RNA: round to nearest, ties away from zero (roundTiesToAway; PTX ``.rna``). For UE8M0 this is the ties-up
        rounding of ml_dtypes' and torch's ``float8_e8m0fnu`` casts (3.0 -> 0x81, 0.75 -> 0x7F); microxcaling
        rounds E2M1 ties this way by default.
    RZ: round toward zero (truncate the magnitude).
    RU: round toward +inf (ceil). RD: round toward -inf (floor).
    STOCHASTIC: round the magnitude up with probability (|x| - lo) / (hi - lo), where lo <= |x| <= hi are the
        neighbouring representable magnitudes; unbiased: E[decode(encode(x))] = x inside the finite range. The draw
        is a float64 uniform from the given numpy Generator (probability resolution 2^-53).
    """

    RNE = "rne"
    RNA = "rna"
    RZ = "rz"
    RU = "ru"
    RD = "rd"
    STOCHASTIC = "stochastic"


_ROUNDING_ALIASES = {"floor": Rounding.RD, "ceil": Rounding.RU}


class NanPolicy(str, enum.Enum):
    """What encode does with a NaN input.

    NAN: the format's NaN code, sign kept for signed formats (only for formats that have a NaN; their default).
    RAISE: ValueError with the count and the first index (default for E2M1, E2M3, E3M2).
    MAX: +max whatever the NaN's sign (PTX cvt.rn.satfinite.e2m1x2.f32 gives 0x7 = +6).
    ZERO: +0 (TransformerEngine's python NVFP4 reference maps NaN to code 0x0).
    """

    NAN = "nan"
    RAISE = "raise"
    MAX = "max"
    ZERO = "zero"


def _parse_rounding(rounding) -> Rounding:
    if isinstance(rounding, Rounding):
        return rounding
    if isinstance(rounding, str):
        key = rounding.lower()
        if key in _ROUNDING_ALIASES:
            return _ROUNDING_ALIASES[key]
        try:
            return Rounding(key)
        except ValueError:
            pass
    names = [r.value for r in Rounding] + sorted(_ROUNDING_ALIASES)
    if not isinstance(rounding, str):
        raise TypeError(f"rounding={rounding!r}: expected a str or Rounding (one of {names}), got "
                        f"{type(rounding).__name__}")
    raise ValueError(f"rounding={rounding!r} is not one of {names}")


def _parse_nan(nan, fmt: FloatFormat) -> NanPolicy:
    if nan is None:
        return NanPolicy.NAN if fmt.has_nan else NanPolicy.RAISE
    if not isinstance(nan, (str, NanPolicy)):
        raise TypeError(f"nan={nan!r}: expected a str or NanPolicy (one of {[p.value for p in NanPolicy]}), got "
                        f"{type(nan).__name__}")
    try:
        policy = NanPolicy(nan.lower() if isinstance(nan, str) else nan)
    except ValueError:
        raise ValueError(f"nan={nan!r} is not one of {[p.value for p in NanPolicy]}") from None
    if policy is NanPolicy.NAN and not fmt.has_nan:
        raise ValueError(f"nan='nan' is impossible for {fmt.name.upper()}, which has no NaN; use 'raise', 'max' or "
                         "'zero'")
    return policy


def _parse_saturate(saturate, fmt: FloatFormat) -> bool:
    if saturate is None:
        return fmt.special != "ue8m0"
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"saturate must be True, False or None, got {saturate!r}")
    if not saturate and fmt.special == "none":
        raise ValueError(
            f"saturate=False is impossible for {fmt.name.upper()}: it has neither inf nor NaN to overflow to"
        )
    return bool(saturate)


# ----------------------------------------------------------------------------------------------------------- decode

_TABLES: dict = {}


def _value_of(code: int, fmt: FloatFormat) -> float:
    """Exact value of one code (python float; exact for every format here)."""
    m = fmt.mbits
    sign = -1.0 if fmt.signed and code >> (fmt.nbits - 1) else 1.0
    mag = code & ((1 << (fmt.nbits - int(fmt.signed))) - 1)
    if code in fmt.nan_codes:
        return math.copysign(math.nan, sign)  # the NaN keeps the code's sign bit
    if code in fmt.inf_codes:
        return sign * math.inf
    e, f = mag >> m, mag & ((1 << m) - 1)
    if e == 0 and fmt.has_subnormals:
        return sign * math.ldexp(f, fmt.emin - m)
    return sign * math.ldexp((1 << m) + f, e - fmt.bias - m)


def _table(fmt: FloatFormat) -> np.ndarray:
    # keyed by the whole (frozen, hashable) format: a user format that reuses a name ("e2m1") has other values
    t = _TABLES.get(fmt)
    if t is None:
        t = np.array([_value_of(c, fmt) for c in range(fmt.num_codes)], dtype=np.float64)
        t.flags.writeable = False
        _TABLES[fmt] = t
    return t


def code_class(code: int, fmt) -> str:
    """Class of one code: 'zero', 'subnormal', 'normal', 'max', 'nan' or 'inf' (used by the format tables).

    Args:
        code: a Python or numpy int in 0 .. 2**fmt.nbits - 1 (a bool is not a code).
        fmt: a :class:`FloatFormat` or its name.

    Raises:
        TypeError: ``code`` is not an int. ValueError: ``code`` is outside the format's code range; unknown ``fmt``.
    """
    fmt = get_format(fmt)
    if not is_int(code):
        raise TypeError(f"code={code!r}: expected an int code of {fmt.name.upper()}, got {type(code).__name__}")
    if not 0 <= code < fmt.num_codes:
        raise ValueError(f"code={code!r} is outside the {fmt.nbits}-bit code range 0..{fmt.num_codes - 1} of "
                         f"{fmt.name.upper()}")
    code = int(code)
    if code in fmt.nan_codes:
        return "nan"
    if code in fmt.inf_codes:
        return "inf"
    mag = code & ((1 << (fmt.nbits - int(fmt.signed))) - 1)
    if mag == fmt.max_code:
        return "max"
    if fmt.has_subnormals and mag >> fmt.mbits == 0:
        return "zero" if mag == 0 else "subnormal"
    return "normal"


def decode(codes, fmt, dtype=np.float32) -> np.ndarray:
    """Decode codes of ``fmt`` to their values.

    Args:
        codes: integer array of codes, any shape, values 0 .. 2**fmt.nbits - 1. For 8-bit formats an int8 array is
            read as unsigned bytes (torch int8 storage of fp8 bytes).
        fmt: a :class:`FloatFormat` or its name.
        dtype: ``np.float32`` (default) or ``np.float64``. Every value of every format here is exact in float32
            (UE8M0 byte 0 is 2^-127, a float32 subnormal; byte 255 is NaN).

    Returns:
        Array of ``dtype`` with the shape of ``codes``. NaN codes give NaN (sign kept), inf codes +-inf.

    Raises:
        TypeError: ``codes`` is not an integer array, or ``dtype`` is not float32/float64.
        ValueError: a code is out of range; unknown ``fmt``.

    Source: the value rule of each format's specification (see ``fmt.source``).
    """
    fmt = get_format(fmt)
    try:
        ok = dtype is not None and np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.float64))
    except TypeError:  # not a dtype at all ("foo"): the same message, not numpy's
        ok = False
    if not ok:
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r}")
    c = as_code_array(codes, "codes", nbits=fmt.nbits, allow_int8=fmt.nbits == 8)
    return np.asarray(_table(fmt).astype(dtype)[c])  # 0-d codes give a 0-d array, as encode does


# ----------------------------------------------------------------------------------------------------------- encode

# Bytes per chunk of input: the chunk's scratch arrays (_Workspace) stay cache-resident.
_CHUNK_BYTES = 1 << 18
# Elements per chunk of the class-table path (its one index array stays cache-resident).
_CLASS_CHUNK = 1 << 16


def _first_index(mask: np.ndarray) -> tuple:
    return tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(mask)[0]), mask.shape))


def encode(x, fmt, *, rounding="rne", saturate=None, nan=None, rng=None) -> np.ndarray:
    """Round each value of ``x`` once, exactly, to ``fmt`` and return the codes.

    Args:
        x: float16, ml_dtypes.bfloat16, float32 or float64 array (any shape), or a python float.
        fmt: a :class:`FloatFormat` or its name (``"e2m1"``, ``"e4m3fn"``, ``"e5m2"``, ``"ue8m0"``, ``"e2m3"``,
            ``"e3m2"``).
        rounding: a :class:`Rounding` or its name; ``"floor"``/``"ceil"`` are aliases of ``"rd"``/``"ru"``.
        saturate: ``None`` for the format's default (True except UE8M0), or a bool. See the module docstring.
        nan: ``None`` for the format's default, or a :class:`NanPolicy` name.
        rng: a ``numpy.random.Generator``; required for ``rounding="stochastic"``, ignored otherwise.

    Returns:
        uint8 array of codes with the shape of ``x`` (0-d for a python float).

    Raises:
        TypeError: ``x`` is not a floating array; ``rng`` is not a Generator (stochastic); bad ``saturate`` type;
            ``rounding`` / ``nan`` neither a str nor its enum.
        ValueError: unknown ``fmt``/``rounding``/``nan``; NaN in ``x`` with ``nan="raise"`` (the message gives the
            count and first index); ``saturate=False`` for a format with neither inf nor NaN; a negative non-zero
            ``x`` for the unsigned UE8M0.

    Source: IEEE 754-2019 §4.3 (rounding attributes) and §7.4 (overflow) applied to the format's value set;
    satfinite behaviour of PTX ``cvt``; policies in docs/formats.md.
    """
    fmt = get_format(fmt)
    mode = _parse_rounding(rounding)
    sat = _parse_saturate(saturate, fmt)
    nanpol = _parse_nan(nan, fmt)
    if mode is Rounding.STOCHASTIC and not isinstance(rng, np.random.Generator):
        raise TypeError(f"rounding='stochastic' needs rng=numpy.random.Generator, got {type(rng).__name__}")
    arr = as_float_array(x, "x")

    # Exact widening. float64 input stays float64; narrower inputs widen to float32 and, in every mode but
    # stochastic, take the code of their rounding class (_class_table); otherwise the integer path below, in float64
    # where the format reaches below float32's normal range (UE8M0's 2^-127: the leading-bit exponent stays exact).
    by_class = arr.dtype != np.float64 and mode is not Rounding.STOCHASTIC
    with np.errstate(invalid="ignore"):  # ml_dtypes warns when it widens a bfloat16 NaN; the value stays NaN
        if not by_class and (arr.dtype == np.float64 or fmt.emin - fmt.mbits < -126):
            work = arr.astype(np.float64, copy=False)  # exact widening; only ever read, never written
        else:
            work = arr.astype(np.float32, copy=False)

    # Inputs that raise: one cheap reduction (min propagates NaN) decides whether the detailed scan is needed.
    if (nanpol is NanPolicy.RAISE or not fmt.signed) and work.size:
        lo = np.min(work)
        if not (lo >= 0 if not fmt.signed else lo == lo):
            isnan = np.isnan(work)
            if isnan.any() and nanpol is NanPolicy.RAISE:
                name = fmt.name.upper()
                if fmt.has_nan:  # only an explicit nan='raise' gets here: the format's default keeps NaN
                    why = (f"nan='raise' refuses them; pass nan='nan' (keep them as {name} NaN), nan='max' "
                           "(PTX satfinite: +max) or nan='zero'")
                else:
                    why = (f"{name} has no NaN and nan='raise' refuses them"
                           + (" (the default for it)" if nan is None else "")
                           + ": pass nan='max' (PTX satfinite: +max) or nan='zero'")
                raise ValueError(f"x has {int(isnan.sum())} NaN value(s) (first at index {_first_index(isnan)}); {why}")
            neg = (work < 0) & ~isnan
            if not fmt.signed and neg.any():
                raise ValueError(
                    f"x has {int(neg.sum())} negative value(s) (first {work[_first_index(neg)].item()!r} at index "
                    f"{_first_index(neg)}); {fmt.name.upper()} is unsigned"
                )

    flat = work.reshape(-1)
    if by_class:
        return _encode_by_class(flat, _class_table(fmt, mode, sat, nanpol)).reshape(arr.shape)
    return _encode_flat(flat, fmt, mode, sat, nanpol, rng).reshape(arr.shape)


def _encode_flat(flat: np.ndarray, fmt: FloatFormat, mode: Rounding, sat: bool, nanpol: NanPolicy,
                 rng) -> np.ndarray:
    """Codes of a 1-D float32/float64 array, chunk by chunk on the integer path (_encode_chunk)."""
    out = np.empty(flat.shape, dtype=np.uint8)
    chunk = _CHUNK_BYTES // flat.itemsize
    ws = _Workspace(min(chunk, flat.size), flat.dtype)
    for start in range(0, flat.size, chunk):
        stop = min(start + chunk, flat.size)
        u = rng.random(stop - start) if mode is Rounding.STOCHASTIC else None
        _encode_chunk(flat[start:stop], fmt, mode, sat, nanpol, u, ws, out[start:stop])
    return out


@functools.lru_cache(maxsize=None)
def _class_table(fmt: FloatFormat, mode: Rounding, sat: bool, nanpol: NanPolicy) -> np.ndarray:
    """The codes encode() gives float32 inputs in a deterministic mode, tabulated over their rounding classes:
    index (bits >> 16) * 2 + (bits & 0xFFFF != 0) (_encode_by_class).

    Why a class has one code: every format here keeps at most 3 mantissa bits, so a float32 input's round bit is its
    mantissa bit 19 or higher (22 - m for a normal result, higher for a subnormal one or a float32 subnormal input)
    and the bits below it only count through "is any of them set" (the sticky bit of RNE, RNA, RU and RD; RZ
    ignores them); bits 15..0 lie below it. So the class's members with bits 15..0 equal to 0 and to 1 give every
    member's code, and the integer path computes those two. NaN classes (their NaN-ness is in the top 16 bits) hold
    the policy's code (nan="raise" is applied before any lookup; "zero" stands in); an unsigned format's other
    negative classes, whose inputs encode() refuses first except -0.0, hold -0.0's code. tests/test_encode.py
    compares this path with the integer path on five members of every class of every format, mode and policy."""
    reps = np.empty((1 << 16, 2), dtype=np.uint32)
    reps[:, 0] = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    reps[:, 1] = reps[:, 0] | np.uint32(1)
    reps = reps.reshape(-1)
    if not fmt.signed:  # negative classes but NaN ones (a NaN's sign is no sign for an unsigned format)
        nan_class = (reps & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        reps[(reps >= np.uint32(0x80000000)) & ~nan_class] = np.uint32(0x80000000)
    vals = reps.view(np.float32)
    if fmt.emin - fmt.mbits < -126:  # as encode() widens for the integer path
        with np.errstate(invalid="ignore"):  # (numpy warns when it widens a NaN; the value stays NaN)
            vals = vals.astype(np.float64)
    table = _encode_flat(vals, fmt, mode, sat, NanPolicy.ZERO if nanpol is NanPolicy.RAISE else nanpol, None)
    table.flags.writeable = False
    return table


def _encode_by_class(flat: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Codes of a 1-D float32 array: one gather from ``table`` (_class_table) per chunk. The index is
    ((bits & 0x7FFF) + 0x7FFF | bits) >> 15: the sum stays below 2^16 and has bit 15 set exactly when bits 14..0
    are not all zero, so after the OR bit 15 says "bits 15..0 not all zero" and bits 31..16 are the input's."""
    bits = flat.view(np.uint32)
    out = np.empty(flat.shape, dtype=np.uint8)
    chunk = _CLASS_CHUNK
    idx = np.empty(min(chunk, flat.size), dtype=np.intp)
    for start in range(0, flat.size, chunk):
        stop = min(start + chunk, flat.size)
        b, i = bits[start:stop], idx[:stop - start]
        np.bitwise_and(b, 0x7FFF, out=i)
        i += 0x7FFF
        i |= b
        i >>= 15
        table.take(i, out=out[start:stop], mode="wrap")  # every index is in range; "wrap" is not buffered
    return out


class _Workspace:
    """Scratch arrays for one chunk, allocated once per encode() call and reused by every chunk.

    Reusing them (every ufunc writes with ``out=``) keeps the chunk loop from allocating and freeing ~1 MiB per chunk,
    which glibc returned to the OS and faulted back in each time: at 64M values that was most of encode's time.
    """

    def __init__(self, n: int, work_dtype):
        if work_dtype == np.float32:
            self.uint, self.sint, self.width, self.p, self.sbias = np.uint32, np.int32, 32, 23, 127
        else:
            self.uint, self.sint, self.width, self.p, self.sbias = np.uint64, np.int64, 64, 52, 1023
        u = lambda: np.empty(n, dtype=self.uint)  # noqa: E731
        b = lambda: np.empty(n, dtype=bool)  # noqa: E731
        self.expf, self.M, self.n, self.r, self.half, self.sh, self.t = u(), u(), u(), u(), u(), u(), u()
        self.sign, self.normal, self.special, self.up, self.b1, self.b2 = b(), b(), b(), b(), b(), b()


def _encode_chunk(v: np.ndarray, fmt: FloatFormat, mode: Rounding, sat: bool, nanpol: NanPolicy, u,
                  ws: _Workspace, out: np.ndarray) -> None:
    """Encode a 1-D float32/float64 chunk into ``out`` (uint8, same length). Integer arithmetic on the bits.

    See encode() for the semantics. All intermediates live in ``ws`` (views cut to the chunk's length).
    """
    k = v.size
    uint, sint, width, p, sbias = ws.uint, ws.sint, ws.width, ws.p, ws.sbias
    expf, M, n, r, half, sh, t = (a[:k] for a in (ws.expf, ws.M, ws.n, ws.r, ws.half, ws.sh, ws.t))
    sign, normal, special, up, b1, b2 = (a[:k] for a in (ws.sign, ws.normal, ws.special, ws.up, ws.b1, ws.b2))
    m = fmt.mbits
    bits = v.view(uint)
    np.greater_equal(bits, uint(1 << (width - 1)), out=sign)
    np.right_shift(bits, uint(p), out=expf)
    np.bitwise_and(expf, uint((1 << (width - 1 - p)) - 1), out=expf)
    np.equal(expf, uint((1 << (width - 1 - p)) - 1), out=special)  # inf or NaN
    np.not_equal(expf, uint(0), out=normal)
    # |v| = M * 2^(e_x - p), M < 2^(p+1); for subnormal inputs e_x is the minimum exponent (value below every
    # target's emin on the paths encode() chooses, so the quantum below is right).
    np.bitwise_and(bits, uint((1 << p) - 1), out=M)
    np.bitwise_or(M, uint(1 << p), out=M, where=normal)
    e_x = expf.view(sint)
    np.maximum(e_x, sint(1), out=e_x)
    np.subtract(e_x, sint(sbias), out=e_x)
    # e_t: exponent of the target binade (emin for the subnormal range); the target quantum is 2^(e_t - m), so M is
    # shifted right by (e_t - m) - (e_x - p) = (e_t - e_x) + (p - m) >= p - m > 0 bits.
    e_t = t.view(sint)
    np.maximum(e_x, sint(fmt.emin), out=e_t)
    shift = sh.view(sint)
    np.subtract(e_t, e_x, out=shift)
    np.add(shift, sint(p - m), out=shift)
    if mode is Rounding.STOCHASTIC:  # P(up) = r / 2^shift with the exact (unclamped) shift
        shift_exact = shift.astype(np.int64)
    np.minimum(shift, sint(width - 1), out=shift)  # beyond p+1 bits only "below half" matters: same outcome
    np.right_shift(M, sh, out=n)
    np.left_shift(uint(1), sh, out=r)
    np.subtract(r, uint(1), out=r)
    np.bitwise_and(M, r, out=r)
    np.subtract(sh, uint(1), out=half)
    np.left_shift(uint(1), half, out=half)
    if mode is Rounding.RNE:
        np.greater(r, half, out=up)
        np.equal(r, half, out=b1)
        # ties to the even CODE. code = ((e_t + bias) << m) + n - 2^m has the parity of n when m >= 1; with no
        # mantissa bits (UE8M0) it is the parity of e_t + bias + n - 1.
        if m == 0:
            np.add(n, e_t.view(uint), out=half)  # half is free now: reuse it for the parity of the code
            np.add(half, uint(fmt.bias - 1), out=half)
        else:
            np.copyto(half, n)
        np.bitwise_and(half, uint(1), out=half)
        np.logical_and(b1, half, out=b1)
        np.logical_or(up, b1, out=up)
    elif mode is Rounding.RNA:
        np.greater_equal(r, half, out=up)
    elif mode is Rounding.RZ:
        up.fill(False)
    elif mode in (Rounding.RU, Rounding.RD):
        np.not_equal(r, uint(0), out=up)
        if mode is Rounding.RU:
            np.logical_not(sign, out=b1)
            np.logical_and(up, b1, out=up)
        else:
            np.logical_and(up, sign, out=up)
    else:
        np.less(u, np.ldexp(r.astype(np.float64), -shift_exact), out=up)
    np.add(n, up, out=n, casting="unsafe")
    # Code of n * 2^(e_t - m): ((e_t + bias) << m) + n - 2^m, uniformly for subnormals, normals and the carry into
    # the next binade (n = 2^(m+1)). Integers of the input's width: |codes| stay far below 2^31.
    mag = e_t  # reuse
    np.add(e_t, sint(fmt.bias), out=mag)
    np.left_shift(mag, sint(m), out=mag)
    np.add(mag, n.view(sint), out=mag)
    np.subtract(mag, sint(1 << m), out=mag)
    if fmt.special == "ue8m0":
        np.maximum(mag, sint(0), out=mag)  # no zero: everything below 2^-127 is byte 0 (policy)
    np.greater(mag, sint(fmt.max_code), out=b1)
    if b1.any():
        if sat:
            np.copyto(mag, sint(fmt.max_code), where=b1)
        else:
            # IEEE 754 §7.4: modes that round toward zero for this sign overflow to max, the others to "inf".
            inf_mag = fmt.inf_code if fmt.has_inf else fmt.nan_code
            if mode is Rounding.RZ:
                b2.fill(True)
            elif mode is Rounding.RU:
                np.copyto(b2, sign)
            elif mode is Rounding.RD:
                np.logical_not(sign, out=b2)
            else:
                b2.fill(False)
            np.copyto(mag, sint(inf_mag), where=b1 & ~b2)
            np.copyto(mag, sint(fmt.max_code), where=b1 & b2)
    if special.any():
        frac_zero = (bits & uint((1 << p) - 1)) == 0
        isinf = special & frac_zero
        isnan = special & ~frac_zero
        np.copyto(mag, sint(fmt.max_code if sat else (fmt.inf_code if fmt.has_inf else fmt.nan_code)), where=isinf)
        if isnan.any():
            nan_mag = {NanPolicy.NAN: fmt.nan_code, NanPolicy.MAX: fmt.max_code, NanPolicy.ZERO: 0}[nanpol]
            np.copyto(mag, sint(nan_mag), where=isnan)
            if nanpol is not NanPolicy.NAN:
                np.logical_and(sign, ~isnan, out=sign)  # "max" and "zero" give +max / +0 whatever the NaN's sign
    np.copyto(out, mag, casting="unsafe")
    if fmt.signed:
        np.bitwise_or(out, np.uint8(1 << (fmt.nbits - 1)), out=out, where=sign)
