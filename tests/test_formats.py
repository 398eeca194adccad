"""fp4ref.formats: the FloatFormat registry and decode, checked exhaustively against independent references.

References (tests/_codec_ref.py): hand-written format parameters (OCP MX v1.0 §5.3-5.4, OFP8, PTX), literal value
tables, decode by integer bit-field arithmetic with Fractions, and ml_dtypes' types (float4_e2m1fn,
float6_e2m3fn, float6_e3m2fn, float8_e4m3fn, float8_e5m2, float8_e8m0fnu), whose decode is plain table lookup.
"""
from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest

from _codec_ref import HAND_POSITIVE, HAND_SPOT, NAMES, SPECS, ref_value, value_as_float

from fp4ref import formats
from fp4ref.formats import E2M1, E2M3, E3M2, E4M3FN, E5M2, FORMATS, UE8M0, FloatFormat, decode, encode, get_format

CONSTANTS = {"e2m1": E2M1, "e4m3fn": E4M3FN, "e5m2": E5M2, "ue8m0": UE8M0, "e2m3": E2M3, "e3m2": E3M2}
ROUNDINGS = ("rne", "rz", "ru", "rd", "floor", "ceil")


def _same_floats(actual: np.ndarray, desired: np.ndarray) -> np.ndarray:
    """Elementwise: equal values, equal sign of zero, NaN where NaN."""
    a = np.asarray(actual, dtype=np.float64)
    d = np.asarray(desired, dtype=np.float64)
    both_nan = np.isnan(a) & np.isnan(d)
    return both_nan | ((a == d) & (np.signbit(a) == np.signbit(d)))


def _assert_same_floats(actual, desired, codes, what):
    ok = _same_floats(actual, desired)
    if not ok.all():
        bad = np.flatnonzero(~ok.ravel())[:8]
        rows = [f"code 0x{int(codes.ravel()[i]):02X}: actual {actual.ravel()[i]!r}, desired {desired.ravel()[i]!r}"
                for i in bad]
        pytest.fail(f"{what}: {np.count_nonzero(~ok)} mismatching code(s)\n  " + "\n  ".join(rows))


# ------------------------------------------------------------------------------------------------ registry


def test_registry_names_and_constants():
    assert set(FORMATS) == set(NAMES)
    for name, const in CONSTANTS.items():
        assert isinstance(const, FloatFormat)
        assert FORMATS[name] is const
        assert const.name == name


@pytest.mark.parametrize("name", NAMES)
def test_format_fields_match_hand_spec(name):
    f, s = FORMATS[name], SPECS[name]
    assert (f.ebits, f.mbits, f.bias, f.nbits) == (s.ebits, s.mbits, s.bias, s.nbits)
    assert bool(f.signed) is s.signed
    assert bool(f.has_inf) is s.has_inf
    assert bool(f.has_nan) is s.has_nan
    assert bool(f.has_subnormals) is s.has_subnormals
    assert f.max == float(s.max)
    assert f.min_normal == float(s.min_normal)
    assert f.min_subnormal == float(s.min_subnormal)  # UE8M0: the smallest value 2^-127 (= ml_dtypes finfo)
    assert isinstance(f.nan_codes, tuple) and isinstance(f.inf_codes, tuple)
    assert sorted(f.nan_codes) == sorted(s.nan_codes)
    assert sorted(f.inf_codes) == sorted(s.inf_codes)
    assert isinstance(f.source, str) and len(f.source) > 10


@pytest.mark.parametrize("name", NAMES)
def test_format_fields_match_ml_dtypes_finfo(name):
    f, s = FORMATS[name], SPECS[name]
    fi = ml_dtypes.finfo(s.ml_dtype)
    assert f.max == float(fi.max)
    assert f.min_normal == float(fi.smallest_normal)
    assert f.min_subnormal == float(fi.smallest_subnormal)
    assert f.nbits == fi.bits


@pytest.mark.parametrize("name", NAMES)
def test_format_fields_consistent_with_decode(name):
    f = FORMATS[name]
    vals = decode(np.arange(1 << f.nbits, dtype=np.int64), f, dtype=np.float64)
    fin = vals[np.isfinite(vals)]
    assert fin.max() == f.max
    assert fin[fin > 0].min() == f.min_subnormal
    assert sorted(np.flatnonzero(np.isnan(vals)).tolist()) == sorted(f.nan_codes)
    assert sorted(np.flatnonzero(np.isinf(vals)).tolist()) == sorted(f.inf_codes)
    assert f.nbits == f.ebits + f.mbits + (1 if f.signed else 0)


def test_format_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        E2M1.bias = 2  # type: ignore[misc]


@pytest.mark.parametrize("name", NAMES)
def test_get_format(name):
    f = FORMATS[name]
    assert get_format(name) is f
    assert get_format(name.upper()) is f
    assert get_format(name.capitalize()) is f
    assert get_format(f) is f


def test_get_format_unknown_lists_known_names():
    with pytest.raises(ValueError) as ei:
        get_format("e3m4")
    msg = str(ei.value)
    assert "e3m4" in msg
    for name in NAMES:
        assert name in msg.lower()
    assert "OCP" not in msg  # the hint is only for the MX element name


def test_get_format_mx_element_name_e4m3_points_to_e4m3fn():
    """mx_quantize takes the OCP MX element name "e4m3"; the codec registry does not, and says which name it is."""
    with pytest.raises(ValueError, match=r"'e4m3fn' is OCP E4M3"):
        get_format("E4M3")


# ------------------------------------------------------------------------------------------------ decode


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", NAMES)
def test_decode_every_code_vs_ml_dtypes(name, dtype):
    s = SPECS[name]
    codes = np.arange(s.ncodes, dtype=np.uint8)
    out = decode(codes, FORMATS[name], dtype=dtype)
    assert out.dtype == dtype and out.shape == codes.shape
    desired = codes.view(s.ml_dtype).astype(dtype)
    _assert_same_floats(out, desired, codes, f"decode({name}) vs ml_dtypes {s.ml_dtype.__name__}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", NAMES)
def test_decode_every_code_vs_bitfield_formula(name, dtype):
    s = SPECS[name]
    codes = np.arange(s.ncodes, dtype=np.uint16)
    out = decode(codes, FORMATS[name], dtype=dtype)
    desired = np.array([value_as_float(ref_value(int(c), s)) for c in codes])
    _assert_same_floats(out, desired, codes, f"decode({name}) vs integer bit-field formula")


@pytest.mark.parametrize("name", sorted(HAND_POSITIVE))
def test_decode_hand_tables_small_formats(name):
    s = SPECS[name]
    half = s.ncodes // 2
    pos = np.array(HAND_POSITIVE[name], dtype=np.float64)
    assert pos.size == half
    desired = np.concatenate([pos, -pos])  # the sign bit is the top bit; -0 for the negative zero code
    codes = np.arange(s.ncodes, dtype=np.int32)
    _assert_same_floats(decode(codes, FORMATS[name], dtype=np.float64), desired, codes, f"{name} hand table")


@pytest.mark.parametrize("name", sorted(HAND_SPOT))
def test_decode_hand_spot_values_8bit(name):
    codes = np.array(sorted(HAND_SPOT[name]), dtype=np.uint8)
    desired = np.array([value_as_float({"+inf": "+inf", "-inf": "-inf", "nan": "nan"}.get(v, v))
                        if isinstance(v, str) else v for v in (HAND_SPOT[name][int(c)] for c in codes)])
    _assert_same_floats(decode(codes, FORMATS[name], dtype=np.float64), desired, codes, f"{name} spot values")


def test_decode_public_bug_vectors():
    # public bug reports: E2M1 0b1001 -> -0.5, 0b1000 -> -0.0 (not +0).
    out = decode(np.array([0b1001, 0b1000], dtype=np.uint8), E2M1)
    assert out[0] == -0.5
    assert out[1] == 0 and np.signbit(out[1])
    # UE8M0 byte 0 is 2^-127 (~5.8775e-39, a float32 subnormal), not 0; byte 255 is NaN, not inf.
    s = decode(np.array([0, 255], dtype=np.uint8), UE8M0)
    assert s.dtype == np.float32
    assert s[0] == np.float32(2.0**-127) and s[0] > 0 and abs(float(s[0]) - 5.8775e-39) < 1e-43
    assert np.isnan(s[1])
    # e4m3 1.0 (0x38) times scale byte 0 -> 2^-127, exactly, in float32.
    prod = decode(np.array([0x38], dtype=np.uint8), E4M3FN) * s[0]
    assert prod[0] == np.float32(2.0**-127)
    assert decode(np.array([0], dtype=np.uint8), UE8M0, dtype=np.float64)[0] == 2.0**-127


@pytest.mark.parametrize("name", NAMES)
def test_decode_keeps_shape_and_accepts_integer_dtypes(name):
    f = FORMATS[name]
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 1 << f.nbits, size=(3, 5, 4))
    ref = decode(codes.astype(np.uint8).ravel(), f).reshape(codes.shape)
    for dt in (np.uint8, np.uint16, np.int16, np.int32, np.int64, np.uint64):
        c = codes.astype(dt)
        before = c.copy()
        out = decode(c, f)
        assert out.shape == c.shape and out.dtype == np.float32
        assert np.array_equal(out, ref, equal_nan=True)
        assert np.array_equal(c, before)
    # non-contiguous views
    c = codes.astype(np.uint8)
    assert np.array_equal(decode(c[:, ::2, :].transpose(2, 0, 1), f), ref[:, ::2, :].transpose(2, 0, 1),
                          equal_nan=True)
    assert decode(np.zeros((0, 3), dtype=np.uint8), f).shape == (0, 3)


@pytest.mark.parametrize("name", ["e4m3fn", "e5m2", "ue8m0"])
def test_decode_int8_read_as_unsigned_bytes(name):
    f = FORMATS[name]
    b = np.arange(256, dtype=np.uint8)
    out = decode(b.view(np.int8), f)
    assert np.array_equal(out, decode(b, f), equal_nan=True)
    assert np.array_equal(np.signbit(out), np.signbit(decode(b, f)))


@pytest.mark.parametrize("name", NAMES)
def test_decode_out_of_range_codes(name):
    f = FORMATS[name]
    n = 1 << f.nbits
    codes = np.zeros(100, dtype=np.int32)
    codes[[37, 50, 99]] = [n, n + 5, -1]
    with pytest.raises(ValueError) as ei:
        decode(codes, f)
    msg = str(ei.value)
    assert "codes" in msg and "3" in msg and "37" in msg, msg
    with pytest.raises(ValueError, match="codes"):
        decode(np.array([n], dtype=np.int64), f)
    with pytest.raises(ValueError, match="codes"):
        decode(np.array([-1], dtype=np.int64), f)


def test_decode_e2m1_code_16_and_negative_int8():
    with pytest.raises(ValueError, match="codes"):
        decode(np.array([0, 16], dtype=np.uint8), E2M1)
    with pytest.raises(ValueError, match="codes"):
        decode(np.array([-1], dtype=np.int8), E2M1)  # int8 is read as unsigned only for 8-bit formats
    with pytest.raises(ValueError, match="codes"):
        decode(np.array([64], dtype=np.uint8), E2M3)


@pytest.mark.parametrize("bad", [np.array([0.0, 1.0]), np.array([1.0], dtype=np.float32), np.array([True]),
                                 np.array([1 + 0j])])
def test_decode_non_integer_codes_type_error(bad):
    with pytest.raises(TypeError, match="codes"):
        decode(bad, E4M3FN)


@pytest.mark.parametrize("dtype", [np.float16, np.int32, ml_dtypes.bfloat16, np.uint8, "foo", 3])
def test_decode_bad_dtype_type_error(dtype):
    with pytest.raises(TypeError, match=r"^dtype must be float32 or float64, got "):  # (not numpy's own message)
        decode(np.array([1], dtype=np.uint8), E2M1, dtype=dtype)


# ------------------------------------------------------------------------------------------------ round trip


def _roundtrip_expected(name, codes, saturate):
    """encode(decode(c)) must give c back, except: non-canonical NaN codes give the canonical NaN code of the same
    sign; inf codes under saturation give +-max."""
    s = SPECS[name]
    exp = codes.astype(np.int64).copy()
    for c in s.nan_codes:
        neg = bool(s.signed and c & s.sign_bit)
        exp[codes == c] = s.canonical_nan_neg if neg else s.canonical_nan_pos
    for c in s.inf_codes:
        neg = bool(c & s.sign_bit)
        exp[codes == c] = (s.max_code | (s.sign_bit if neg else 0)) if saturate else c
    return exp


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("name", NAMES)
def test_every_code_round_trips(name, rounding, dtype):
    f = FORMATS[name]
    codes = np.arange(1 << f.nbits, dtype=np.uint8)
    vals = decode(codes, f, dtype=dtype)
    kwargs = {} if not f.has_nan else {"nan": "nan"}
    for saturate in ([None, False] if f.has_nan else [None]):
        out = encode(vals, f, rounding=rounding, saturate=saturate, **kwargs)
        assert out.dtype == np.uint8 and out.shape == codes.shape
        sat = SPECS[name].default_saturate if saturate is None else saturate
        exp = _roundtrip_expected(name, codes, sat)
        bad = np.flatnonzero(out != exp)
        assert bad.size == 0, (f"{name} {rounding} saturate={saturate}: codes {[hex(c) for c in codes[bad][:8]]} "
                               f"-> {[hex(c) for c in out[bad][:8]]}, expected {[hex(c) for c in exp[bad][:8]]}")


@pytest.mark.parametrize("name", NAMES)
def test_every_code_round_trips_stochastic(name):
    f = FORMATS[name]
    codes = np.arange(1 << f.nbits, dtype=np.uint8)
    finite = np.isfinite(decode(codes, f))
    vals = decode(codes[finite], f)
    out = encode(np.tile(vals, 50), f, rounding="stochastic", rng=np.random.default_rng(0))
    assert np.array_equal(out, np.tile(codes[finite], 50))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["e4m3fn", "e5m2"])
def test_decode_nan_keeps_sign_bit(name, dtype):
    # A NaN code with the sign bit set decodes to a NaN with the sign bit set (as ml_dtypes does), so that
    # encode(decode(0xFF)) gives 0xFF back (issue 2: "every 8-bit code round-trips").
    s = SPECS[name]
    codes = np.array(s.nan_codes, dtype=np.uint8)
    out = decode(codes, FORMATS[name], dtype=dtype)
    assert np.isnan(out).all()
    assert np.signbit(out).tolist() == [bool(c & 0x80) for c in s.nan_codes]
    assert np.signbit(out).tolist() == np.signbit(codes.view(s.ml_dtype).astype(dtype)).tolist()


def test_decode_dtype_none_and_scalar_codes():
    # From a fresh-user review: dtype=None silently meant float64; a scalar code gave a numpy scalar.
    with pytest.raises(TypeError, match="dtype"):
        decode(np.array([1], np.uint8), "e2m1", dtype=None)
    out = decode(np.uint8(7), "e2m1")
    assert isinstance(out, np.ndarray) and out.shape == () and out.dtype == np.float32 and float(out) == 6.0


# ------------------------------------------------------------------------------------ FloatFormat field checks

def _fmt(name="t", ebits=3, mbits=2, bias=3, signed=True, has_subnormals=True, special="none", source="test"):
    return FloatFormat(name, ebits, mbits, bias, signed=signed, has_subnormals=has_subnormals, special=special,
                       source=source)


@pytest.mark.parametrize("kw, match", [
    # codes are uint8: E5M10 (16 bits) decoded 0x3C00 as 0, an unsigned 9-bit format encoded 3.0 as 8 (not 264)
    (dict(name="e5m10", ebits=5, mbits=10, bias=15, special="ieee"), r"'e5m10': signed \+ ebits \+ mbits = 16 bits"),
    (dict(ebits=4, mbits=5, bias=7, signed=False), r"= 9 bits; codes are stored as uint8"),
    (dict(ebits=8, mbits=1, bias=127), r"= 10 bits"),
    (dict(ebits=0, mbits=1, bias=0), r"ebits=0 must be >= 1"),
    (dict(mbits=-1), r"mbits=-1 must be >= 0"),
    (dict(special="IEEE"), r"special='IEEE' is not one of"),
    (dict(mbits=0, special="ieee"), r"special='ieee' needs mbits >= 1"),
    (dict(ebits=1, mbits=2, bias=0, special="ieee"), r"special='ieee' needs .* ebits >= 2"),
    (dict(mbits=0, special="fn"), r"special='fn' needs mbits >= 1"),
    (dict(ebits=7, mbits=0, bias=63, signed=True, has_subnormals=False, special="ue8m0"), r"special='ue8m0' needs"),
    (dict(ebits=6, mbits=1, bias=31, signed=False, has_subnormals=False, special="ue8m0"), r"special='ue8m0' needs"),
    (dict(has_subnormals=False), r"has_subnormals=False is supported only with special='ue8m0'"),
    (dict(ebits=8, mbits=0, bias=0, signed=False, has_subnormals=False, special="ue8m0"), r"bias=0 puts values"),
    (dict(ebits=5, mbits=2, bias=160), r"bias=160 puts values outside float32"),
    (dict(name=""), r"name is empty"),
])
def test_floatformat_refuses_bad_fields(kw, match):
    with pytest.raises(ValueError, match=match):
        _fmt(**kw)


@pytest.mark.parametrize("kw, match", [
    (dict(ebits=3.0), r"ebits=3.0 is not an int"),
    (dict(mbits=True), r"mbits=True is not an int"),
    (dict(bias="3"), r"bias='3' is not an int"),
    (dict(signed=1), r"signed=1 is not a bool"),
    (dict(has_subnormals=None), r"has_subnormals=None is not a bool"),
    (dict(name=None), r"FloatFormat.name=None: expected a str"),
    (dict(source=1), r"FloatFormat.source=1: expected a str"),
])
def test_floatformat_refuses_bad_field_types(kw, match):
    with pytest.raises(TypeError, match=match):
        _fmt(**kw)


def test_floatformat_registry_formats_pass_the_checks():
    for fmt in FORMATS.values():
        assert dataclasses.replace(fmt) == fmt  # rebuilt through __post_init__


def test_user_format_8bit_roundtrip_exhaustive():
    # a signed E3M4 (bias 3, no inf/NaN): every code decodes to k/16 * 2^(e-3) and encodes back to itself
    fmt = _fmt(name="e3m4", ebits=3, mbits=4, bias=3)
    assert fmt.nbits == 8 and fmt.max == 31.0 and fmt.min_subnormal == 2.0**-6  # (1 + 15/16) 2^4, 1/16 2^-2
    codes = np.arange(256, dtype=np.uint8)
    v = decode(codes, fmt, dtype=np.float64)
    for c in range(256):
        e, m = (c >> 4) & 7, c & 15
        want = (m / 16 * 2.0**-2) if e == 0 else (1 + m / 16) * 2.0 ** (e - 3)
        assert v[c] == (-want if c & 0x80 else want) and math.copysign(1, v[c]) == (-1 if c & 0x80 else 1), c
    assert np.array_equal(encode(v, fmt), codes)


def test_user_format_reusing_a_registry_name_has_its_own_table():
    # decode tables were cached by name: a user "e2m1" with 2 mantissa bits read E2M1's values (code 2 -> 1.0)
    decode(np.array([2], np.uint8), E2M1)  # E2M1's table is cached first
    mine = _fmt(name="e2m1", ebits=2, mbits=2, bias=1)
    assert decode(np.arange(8, dtype=np.uint8), mine, dtype=np.float64).tolist() == [
        0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
    assert decode(np.array([2], np.uint8), E2M1).tolist() == [1.0]


def test_code_class_refuses_codes_outside_the_format():
    # code_class(16, 'e2m1') said 'zero', -1 'max', 0x17F for E4M3FN 'normal' (bits above the format were masked)
    for name, fmt in FORMATS.items():
        for bad in (-1, fmt.num_codes, fmt.num_codes + 0x7F, 1 << 20):
            with pytest.raises(ValueError, match=rf"code={bad} is outside the {fmt.nbits}-bit code range"):
                formats.code_class(bad, name)
    for bad in (True, 1.0, "1", None, np.float32(1)):
        with pytest.raises(TypeError, match=r"code=.*expected an int code"):
            formats.code_class(bad, "e2m1")
    assert formats.code_class(np.uint8(0x7F), "e4m3fn") == "nan" and formats.code_class(np.int64(7), "e2m1") == "max"
    # exhaustive: every in-range code of every format has one class, the same for a numpy int
    for name, fmt in FORMATS.items():
        for c in range(fmt.num_codes):
            assert formats.code_class(c, fmt) == formats.code_class(np.uint16(c), name)
    assert [formats.code_class(c, "e2m1") for c in range(16)] == (
        ["zero", "subnormal"] + ["normal"] * 5 + ["max"] + ["zero", "subnormal"] + ["normal"] * 5 + ["max"])


def test_the_formats_command_names_e4m3fn_for_e4m3(capsys):
    """`fp4ref formats e4m3` is a usage error (exit 2) that points at the OCP name, as encode's ValueError does; a
    name in another case is accepted."""
    from fp4ref.cli import main

    with pytest.raises(SystemExit) as ex:
        main(["formats", "e4m3"])
    assert ex.value.code == 2
    assert "unknown format 'e4m3' ('e4m3fn' is OCP E4M3); choose from e2m1" in capsys.readouterr().err
    assert main(["formats", "E2M1"]) == 0 and "e2m1" in capsys.readouterr().out
