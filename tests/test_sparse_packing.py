"""2:4 sparse packing: compress_2to4 / decompress_2to4 / check_meta (docs/quantization.md, "2:4 sparse packing").

Expected values come from an independent per-byte implementation written here from the design text (plain Python
ints and a hand table of E2M1 values), never from the functions under test.
"""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fp4ref.packing import CANONICAL_META, check_meta, compress_2to4, decompress_2to4

# OCP MX v1.0 E2M1: codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; 8..15 the negatives.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def reference_group(vals_byte: int, meta_byte: int) -> list[float]:
    """The sum semantics for one group (docs/quantization.md), in plain Python."""
    v0, v1 = E2M1[vals_byte & 0xF], E2M1[(vals_byte >> 4) & 0xF]
    i0, i1 = meta_byte & 3, (meta_byte >> 2) & 3
    out = [0.0, 0.0, 0.0, 0.0]
    out[i0] += v0
    out[i1] += v1
    return out


def test_e2m1_table_matches_ml_dtypes():
    dec = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    assert [float(x) for x in dec] == E2M1
    assert all(np.signbit(dec[8:])), "codes 8..15 are negative (8 = -0.0)"


def test_decompress_exhaustive_all_byte_pairs():
    v, m = np.meshgrid(np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8), indexing="ij")
    v, m = v.reshape(-1, 1), m.reshape(-1, 1)  # 65536 rows, one group each
    got = decompress_2to4(v, m)
    assert got.dtype == np.float32 and got.shape == (65536, 4)
    want = np.array([reference_group(int(a), int(b)) for a, b in zip(v[:, 0], m[:, 0])], dtype=np.float32)
    np.testing.assert_array_equal(got, want)
    assert not np.any(np.signbit(got) & (got == 0)), "zeros must come out as +0.0"


def test_decompress_int8_reads_unsigned_bytes():
    rng = np.random.default_rng(0)
    v = rng.integers(-128, 128, size=(5, 8), dtype=np.int8)
    m = rng.integers(-128, 128, size=(5, 8), dtype=np.int8)
    got = decompress_2to4(v, m)
    np.testing.assert_array_equal(got, decompress_2to4(v.view(np.uint8), m.view(np.uint8)))
    # A signed shift would smear the sign bit: 0xF0 as int8 is -16; (-16) >> 4 = -1 -> code 15 would still
    # decode, but meta 0x80 (-128) >> 2 = -32, & 3 = 0 -> check one byte by hand.
    one = decompress_2to4(np.array([[np.int8(-16)]]), np.array([[np.int8(-128 + 0x0E)]]))
    # vals 0xF0: v0 = code 0 (0.0), v1 = code 15 (-6.0); meta 0x8E: idx0 = 2, idx1 = 3 (bits 7:4 ignored)
    np.testing.assert_array_equal(one, np.array([[0.0, 0.0, 0.0, -6.0]], dtype=np.float32))


def test_decompress_axis_and_input_untouched():
    rng = np.random.default_rng(1)
    v = rng.integers(0, 256, size=(3, 6, 2), dtype=np.uint8)
    m = rng.integers(0, 256, size=(3, 6, 2), dtype=np.uint8)
    v0, m0 = v.copy(), m.copy()
    got = decompress_2to4(v, m, axis=1)
    assert got.shape == (3, 24, 2)
    ref = np.moveaxis(decompress_2to4(np.moveaxis(v, 1, -1), np.moveaxis(m, 1, -1)), -1, 1)
    np.testing.assert_array_equal(got, ref)
    for i, g, k in itertools.product(range(3), range(6), range(2)):
        np.testing.assert_array_equal(got[i, 4 * g : 4 * g + 4, k], reference_group(int(v[i, g, k]), int(m[i, g, k])))
    np.testing.assert_array_equal(v, v0)
    np.testing.assert_array_equal(m, m0)


def test_decompress_errors():
    with pytest.raises(ValueError, match="same shape"):
        decompress_2to4(np.zeros((2, 3), np.uint8), np.zeros((2, 4), np.uint8))
    with pytest.raises(TypeError, match="vals"):
        decompress_2to4(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.uint8))
    with pytest.raises(ValueError, match="meta"):
        decompress_2to4(np.zeros((2, 3), np.int32), np.full((2, 3), 256, np.int32))
    with pytest.raises(ValueError, match="axis"):
        decompress_2to4(np.zeros((2, 3), np.uint8), np.zeros((2, 3), np.uint8), axis=2)


def test_check_meta_exhaustive():
    r = check_meta(np.arange(256, dtype=np.uint8))
    want = np.array([not (b < 16 and (b & 3) < ((b >> 2) & 3)) for b in range(256)])
    np.testing.assert_array_equal(r.noncanonical, want)
    assert sorted(int(b) for b in np.flatnonzero(~want)) == [0x04, 0x08, 0x09, 0x0C, 0x0D, 0x0E]
    assert tuple(sorted(CANONICAL_META)) == (0x04, 0x08, 0x09, 0x0C, 0x0D, 0x0E)
    assert r.count == 250 and r.total == 256 and r.first == (0,)
    assert r.high_bits == 240
    assert r.duplicate_index == 64  # 4 equal pairs x 16 high nibbles
    assert r.descending == 6 * 16
    assert "250 of 256" in r.summary() and not r.ok
    ok = check_meta(np.array(CANONICAL_META, dtype=np.int8).reshape(2, 3))
    assert ok.ok and ok.count == 0 and ok.first is None and "canonical" in ok.summary()
    # int8 read as unsigned: -128 = 0x80 has bits 7:4 set
    r8 = check_meta(np.array([[4, -128]], dtype=np.int8))
    np.testing.assert_array_equal(r8.noncanonical, [[False, True]])
    assert r8.first == (0, 1) and r8.high_bits == 1


def independent_compress_group(codes: list[int]) -> tuple[int, int]:
    """The documented policy: nonzeros first, completed with the lowest zero positions; zeros stored as code 0."""
    nonzero = [j for j in range(4) if codes[j] & 7]
    assert len(nonzero) <= 2
    keep = sorted((nonzero + [j for j in range(4) if j not in nonzero])[:2])
    c = [codes[j] if codes[j] & 7 else 0 for j in keep]
    return c[0] | (c[1] << 4), keep[0] | (keep[1] << 2)


def all_sparse_groups():
    """Every group of 4 E2M1 codes with at most 2 nonzeros (zeros as code 0 or 8)."""
    out = []
    for g in itertools.product(range(16), repeat=4):
        if sum(1 for c in g if c & 7) <= 2:
            out.append(g)
    return np.array(out, dtype=np.uint8)


def test_compress_exhaustive_groups():
    groups = all_sparse_groups()  # every valid group, one row each
    vals, meta = compress_2to4(groups)
    assert vals.shape == meta.shape == (len(groups), 1) and vals.dtype == meta.dtype == np.uint8
    want = np.array([independent_compress_group([int(c) for c in g]) for g in groups], dtype=np.uint8)
    np.testing.assert_array_equal(vals[:, 0], want[:, 0])
    np.testing.assert_array_equal(meta[:, 0], want[:, 1])
    assert check_meta(meta).ok
    dense = decompress_2to4(vals, meta)
    np.testing.assert_array_equal(dense, np.array([[E2M1[c] for c in g] for g in groups], np.float32) + 0.0)


def test_compress_policy_for_sparse_groups():
    # all zero -> positions (0, 1); single nonzero at 0, 1, 2, 3 -> (0,1), (0,1), (0,2), (0,3)
    a = np.array([[0, 0, 0, 0, 2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2, 8, 0, 8, 8]], dtype=np.uint8)
    vals, meta = compress_2to4(a)
    np.testing.assert_array_equal(vals, [[0x00, 0x02, 0x20, 0x20, 0x20, 0x00]])
    np.testing.assert_array_equal(meta, [[0x04, 0x04, 0x04, 0x08, 0x0C, 0x04]])


def test_compress_float_input_and_axis():
    x = np.array([[0.0, -6.0, 0.0, 0.5], [1.5, 0.0, -0.0, 0.0]], dtype=np.float32).T  # K along axis 0
    vals, meta = compress_2to4(x, axis=0)
    np.testing.assert_array_equal(vals, [[0x1F, 0x03]])
    np.testing.assert_array_equal(meta, [[0x0D, 0x04]])
    # ml_dtypes float4 and bfloat16 inputs
    y = x.T.astype(ml_dtypes.float4_e2m1fn)
    np.testing.assert_array_equal(compress_2to4(y)[0], vals.T)
    np.testing.assert_array_equal(compress_2to4(x.T.astype(ml_dtypes.bfloat16))[1], meta.T)


def test_compress_errors():
    a = np.zeros((3, 8), np.uint8)
    a[2, 4:8] = [1, 1, 1, 0]
    with pytest.raises(ValueError, match=r"row \(2,\) group 1"):
        compress_2to4(a)
    with pytest.raises(ValueError, match="multiple of 4"):
        compress_2to4(np.zeros((2, 6), np.uint8))
    with pytest.raises(ValueError, match="not E2M1-representable"):
        compress_2to4(np.array([[0.25, 0, 0, 0]]))
    with pytest.raises(ValueError, match="non-finite"):
        compress_2to4(np.array([[np.nan, 0, 0, 0]]))
    with pytest.raises(ValueError, match="outside the 4-bit"):
        compress_2to4(np.array([[16, 0, 0, 0]]))
    with pytest.raises(TypeError, match="a must be"):
        compress_2to4(np.array([[True, False, False, False]]))


@given(
    st.integers(1, 5),
    st.integers(1, 6),
    st.randoms(use_true_random=False),
)
def test_compress_decompress_round_trip(rows, groups, rnd):
    a = np.zeros((rows, 4 * groups), np.uint8)
    for r in range(rows):
        for g in range(groups):
            pos = rnd.sample(range(4), rnd.randint(0, 2))
            for p in pos:
                a[r, 4 * g + p] = rnd.choice([1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15])
    a0 = a.copy()
    vals, meta = compress_2to4(a)
    np.testing.assert_array_equal(a, a0)
    assert check_meta(meta).ok
    dense = decompress_2to4(vals, meta)
    np.testing.assert_array_equal(dense, np.array(E2M1, np.float32)[a])


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52, reason="longdouble is float64 on this platform")
def test_compress_refuses_longdouble():
    # 1 + 2^-60 is not E2M1-representable, but longdouble -> float64 rounded it to 1.0 (code 2) silently
    a = np.array([[1 + np.longdouble(2) ** -60, 0, 0, 0]], dtype=np.longdouble)
    assert a[0, 0] != 1
    with pytest.raises(TypeError, match=r"^a has dtype float\d+, wider than float64"):
        compress_2to4(a)
    with pytest.raises(TypeError, match=r"^a has dtype"):
        compress_2to4(np.array([[1, 0, 0, 0]], dtype=np.longdouble))  # exact values too: the dtype is refused


def test_compress_non_native_byte_order_same_bytes():
    rng = np.random.default_rng(11)
    vals = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -6])
    a = np.zeros((8, 16))
    for r in range(8):
        for g in range(4):
            pos = rng.choice(4, 2, replace=False)
            a[r, 4 * g + pos] = rng.choice(vals, 2)
    want = compress_2to4(a)
    for dt in ("f2", "f4", "f8"):
        x = a.astype(dt)
        got = compress_2to4(x.astype(x.dtype.newbyteorder("S")))
        assert all(np.array_equal(g, w) for g, w in zip(got, want)), dt
    codes = compress_2to4(a)  # integer codes as big-endian uint16 too
    dense_codes = np.array([[0 if v == 0 else list(vals).index(v) if v > 0 else 8 + list(vals[:8]).index(-v)
                             for v in row] for row in a], dtype=np.uint16)
    got = compress_2to4(dense_codes.astype(">u2" if np.little_endian else "<u2"))
    assert all(np.array_equal(g, w) for g, w in zip(got, codes))
