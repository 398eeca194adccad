"""fp4ref.packing.pack_fp4 / unpack_fp4: element 2i in bits 3:0, element 2i+1 in bits 7:4 (docs/quantization.md).

References: the hand formula byte = lo | hi << 4 evaluated per element with Python ints, and literal byte vectors
(public bug report: element 0 in the low nibble; a kernel packed it high).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fp4ref.formats import E2M1, decode, encode
from fp4ref.packing import pack_fp4, unpack_fp4


def _pack_ref(codes: np.ndarray, axis: int) -> np.ndarray:
    """Per-element Python reference: out[..., i, ...] = codes[..., 2i, ...] | codes[..., 2i+1, ...] << 4."""
    c = np.moveaxis(np.asarray(codes), axis, -1)
    flat = c.reshape(int(np.prod(c.shape[:-1])), c.shape[-1])
    out = np.zeros((flat.shape[0], c.shape[-1] // 2), dtype=np.uint8)
    for r in range(flat.shape[0]):
        for i in range(c.shape[-1] // 2):
            out[r, i] = int(flat[r, 2 * i]) | (int(flat[r, 2 * i + 1]) << 4)
    return np.moveaxis(out.reshape(c.shape[:-1] + (c.shape[-1] // 2,)), -1, axis)


def test_element_zero_in_low_nibble():
    # public bug vector: element 0 in the low nibble
    assert pack_fp4(np.array([0x1, 0x2], dtype=np.uint8)).tolist() == [0x21]
    assert pack_fp4(np.array([0xF, 0x0, 0x3, 0xC], dtype=np.uint8)).tolist() == [0x0F, 0xC3]
    assert unpack_fp4(np.array([0x21, 0xC3], dtype=np.uint8)).tolist() == [0x1, 0x2, 0x3, 0xC]
    # E2M1 values [1.0, -0.5] -> codes [0x2, 0x9] -> byte 0x92
    assert pack_fp4(encode(np.array([1.0, -0.5]), E2M1)).tolist() == [0x92]


def test_every_byte_round_trips():
    b = np.arange(256, dtype=np.uint8)
    u = unpack_fp4(b)
    assert u.dtype == np.uint8 and u.shape == (512,)
    assert u[0::2].tolist() == [v & 0xF for v in range(256)]
    assert u[1::2].tolist() == [v >> 4 for v in range(256)]
    assert np.array_equal(pack_fp4(u), b)
    # every pair of codes
    lo, hi = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    pairs = np.stack([lo.ravel(), hi.ravel()], axis=-1).astype(np.uint8)  # shape (256, 2)
    assert pack_fp4(pairs).ravel().tolist() == [int(a) | (int(c) << 4) for a, c in pairs]
    assert np.array_equal(unpack_fp4(pack_fp4(pairs)), pairs)


@pytest.mark.parametrize("shape,axis", [((4, 6), -1), ((4, 6), 0), ((4, 6), 1), ((3, 4, 2), 1), ((2, 3, 8), -1),
                                        ((2, 3, 8), 2), ((2, 3, 8), -3), ((6,), 0), ((2, 0, 4), 2), ((2, 4, 0), 1)])
def test_pack_along_axis_matches_reference(shape, axis):
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, size=shape).astype(np.uint8)
    if codes.size:
        codes.flat[0] = 0xF  # not all zero
    before = codes.copy()
    p = pack_fp4(codes, axis=axis)
    exp_shape = list(shape)
    exp_shape[axis] //= 2
    assert p.shape == tuple(exp_shape) and p.dtype == np.uint8
    assert np.array_equal(p, _pack_ref(codes, axis))
    assert np.array_equal(unpack_fp4(p, axis=axis), codes)
    assert np.array_equal(codes, before)


@pytest.mark.parametrize("dt", [np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64])
def test_pack_accepts_integer_dtypes(dt):
    codes = np.array([[1, 15, 7, 0], [8, 9, 2, 3]], dtype=dt)
    assert pack_fp4(codes).tolist() == [[0xF1, 0x07], [0x98, 0x32]]


def test_unpack_int8_read_as_unsigned():
    p = np.array([-1, -128, 0x12], dtype=np.int8)
    assert unpack_fp4(p).tolist() == [15, 15, 0, 8, 2, 1]


@pytest.mark.parametrize("dt", [np.int16, np.int32, np.uint16, np.int64])
def test_unpack_accepts_wide_integer_bytes(dt):
    assert unpack_fp4(np.array([0xAB, 0x01], dtype=dt)).tolist() == [0xB, 0xA, 0x1, 0x0]


def test_non_contiguous_inputs():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 16, size=(8, 12)).astype(np.uint8)
    v = codes[::2, ::-1]
    assert np.array_equal(pack_fp4(v), _pack_ref(np.ascontiguousarray(v), 1))
    assert np.array_equal(pack_fp4(codes.T, axis=0), _pack_ref(np.ascontiguousarray(codes.T), 0))
    p = pack_fp4(codes)
    assert np.array_equal(unpack_fp4(p[:, ::-1]), _unpack_ref_rows(p[:, ::-1]))


def _unpack_ref_rows(p):
    return np.array([[n for b in row for n in (int(b) & 0xF, int(b) >> 4)] for row in p], dtype=np.uint8)


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("n", [1, 3, 7])
def test_pack_odd_length_raises(n):
    with pytest.raises(ValueError, match="codes"):
        pack_fp4(np.ones(n, dtype=np.uint8))
    with pytest.raises(ValueError, match="codes"):
        pack_fp4(np.ones((2, n), dtype=np.uint8), axis=1)
    pack_fp4(np.ones((n + 1, n), dtype=np.uint8), axis=0)  # an even axis is fine even when another is odd


def test_pack_out_of_range_codes():
    with pytest.raises(ValueError, match="codes"):
        pack_fp4(np.array([0, 16], dtype=np.uint8))
    with pytest.raises(ValueError, match="codes"):
        pack_fp4(np.array([-1, 2], dtype=np.int32))
    with pytest.raises(ValueError, match="codes"):
        pack_fp4(np.array([255, 0], dtype=np.uint8))


def test_unpack_out_of_range_bytes():
    with pytest.raises(ValueError, match="packed"):
        unpack_fp4(np.array([256, 1], dtype=np.int32))
    with pytest.raises(ValueError, match="packed"):
        unpack_fp4(np.array([-1], dtype=np.int16))


@pytest.mark.parametrize("bad", [np.array([1.0, 2.0]), np.array([1.0, 2.0], dtype=np.float32),
                                 np.array([True, False])])
def test_non_integer_arrays_raise_type_error(bad):
    with pytest.raises(TypeError, match="codes"):
        pack_fp4(bad)
    with pytest.raises(TypeError, match="packed"):
        unpack_fp4(bad)


def test_zero_d_arrays_are_refused_by_name():
    for value in (np.uint8(3), np.array(3, dtype=np.uint8), 3):
        with pytest.raises(ValueError, match=r"^codes must have at least one dimension, got a 0-d array$"):
            pack_fp4(value)
        with pytest.raises(ValueError, match=r"^packed must have at least one dimension, got a 0-d array$"):
            unpack_fp4(value)


def test_bad_axis():
    with pytest.raises(ValueError, match="axis"):
        pack_fp4(np.ones((2, 4), dtype=np.uint8), axis=2)
    with pytest.raises(ValueError, match="axis"):
        unpack_fp4(np.ones((2, 4), dtype=np.uint8), axis=-3)
    with pytest.raises(TypeError, match="axis"):
        pack_fp4(np.ones((2, 4), dtype=np.uint8), axis=1.0)


# ------------------------------------------------------------------------------------------------ properties


@given(codes=hnp.arrays(np.uint8, hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=6),
                        elements=st.integers(0, 15)),
       data=st.data())
def test_round_trip_any_shape(codes, data):
    axis = data.draw(st.integers(-codes.ndim, codes.ndim - 1))
    if codes.shape[axis] % 2:
        with pytest.raises(ValueError):
            pack_fp4(codes, axis=axis)
        return
    p = pack_fp4(codes, axis=axis)
    assert np.array_equal(p, _pack_ref(codes, axis))
    assert np.array_equal(unpack_fp4(p, axis=axis), codes)


def test_e2m1_encode_pack_unpack_decode():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16, 64)) * 3).astype(np.float32)
    codes = encode(x, E2M1)
    packed = pack_fp4(codes)
    assert packed.shape == (16, 32)
    assert np.array_equal(decode(unpack_fp4(packed), E2M1), decode(codes, E2M1))
    # low nibble = even elements
    assert np.array_equal(packed & 0xF, codes[:, 0::2]) and np.array_equal(packed >> 4, codes[:, 1::2])
