"""Scale layouts 128x4 and 8x4: exhaustive index tests against the offset formulas (cuBLAS block-scaling layout,
TensorRT-LLM/FlashInfer get_sf_out_offset_8x4), written here in plain Python."""
from __future__ import annotations

import numpy as np
import pytest

from fp4ref.layouts import blocked_offsets, blocked_size, from_blocked, to_blocked

SHAPES = [(1, 1), (7, 3), (130, 5), (300, 9), (128, 4), (8, 4), (0, 3)]


def off_128x4(r, c, cols):
    cp = -(-cols // 4) * 4
    return ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)


def off_8x4(r, c, cols):
    cp = -(-cols // 4) * 4
    return ((r // 8) * (cp // 4) + c // 4) * 32 + (r % 8) * 4 + (c % 4)


FORMULA = {"128x4": (off_128x4, 128), "8x4": (off_8x4, 8)}


@pytest.mark.parametrize("layout", ["128x4", "8x4"])
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_every_index(layout, rows, cols):
    off, tile_rows = FORMULA[layout]
    rp, cp = -(-rows // tile_rows) * tile_rows, -(-cols // 4) * 4
    assert blocked_size(rows, cols, layout) == rp * cp
    # distinct non-zero bytes so that every position is identifiable (values 1..255, cycling)
    plain = (np.arange(rows * cols).reshape(rows, cols) % 255 + 1).astype(np.uint8)
    plain0 = plain.copy()
    blocked = to_blocked(plain, layout)
    assert blocked.dtype == np.uint8 and blocked.shape == (rp * cp,)
    want = np.zeros(rp * cp, dtype=np.uint8)
    seen = set()
    for r in range(rows):
        for c in range(cols):
            o = off(r, c, cols)
            assert o not in seen
            seen.add(o)
            want[o] = plain[r, c]
    np.testing.assert_array_equal(blocked, want)  # includes: every padding byte is zero
    if rows and cols:
        np.testing.assert_array_equal(
            blocked_offsets(rows, cols, layout),
            np.array([[off(r, c, cols) for c in range(cols)] for r in range(rows)]),
        )
    back = from_blocked(blocked, rows, cols, layout)
    np.testing.assert_array_equal(back, plain)
    np.testing.assert_array_equal(plain, plain0)
    # torch/TE keep the swizzled bytes 2-D: same C-order bytes accepted
    back = from_blocked(blocked.reshape(-1, 4) if blocked.size else blocked, rows, cols, layout)
    np.testing.assert_array_equal(back, plain)


def test_torchao_shape_view():
    # Triton tutorial 10 / torchao: (Rp/128, Cp/4, 32, 4, 4) indexed [r//128, c//4, r%32, (r%128)//32, c%4]
    rng = np.random.default_rng(0)
    plain = rng.integers(0, 256, size=(256, 8), dtype=np.uint8)
    v = to_blocked(plain).reshape(2, 2, 32, 4, 4)
    for r in range(256):
        for c in range(8):
            assert v[r // 128, c // 4, r % 32, (r % 128) // 32, c % 4] == plain[r, c]


def test_int8_input_and_errors():
    plain = np.array([[-1, 2], [3, -128]], dtype=np.int8)
    np.testing.assert_array_equal(from_blocked(to_blocked(plain), 2, 2), plain.view(np.uint8))
    with pytest.raises(ValueError, match="layout="):
        to_blocked(plain, "32x4")
    # layout names in any case, as the library's other names
    np.testing.assert_array_equal(to_blocked(plain, "128X4"), to_blocked(plain, "128x4"))
    np.testing.assert_array_equal(from_blocked(to_blocked(plain, "8x4"), 2, 2, "8X4"), plain.view(np.uint8))
    with pytest.raises(ValueError, match="2-D"):
        to_blocked(np.zeros(4, np.uint8))
    with pytest.raises(TypeError, match="scales"):
        to_blocked(np.zeros((2, 2), np.float32))
    b = to_blocked(np.ones((2, 2), np.uint8))
    with pytest.raises(ValueError, match="needs 512"):
        from_blocked(b[:-1], 2, 2)
    b2 = b.copy()
    b2[off_128x4(5, 3, 2)] = 0x7F  # a padding position
    with pytest.raises(ValueError, match="non-zero padding"):
        from_blocked(b2, 2, 2)
    np.testing.assert_array_equal(from_blocked(b2, 2, 2, check_padding=False), np.ones((2, 2), np.uint8))
    with pytest.raises(TypeError, match="layout=128"):
        to_blocked(np.ones((2, 2), np.uint8), 128)
    for bad in ("no", 0, None):  # a truthy string would have checked the padding anyway
        with pytest.raises(TypeError, match="check_padding"):
            from_blocked(b2, 2, 2, check_padding=bad)
    with pytest.raises(TypeError, match="rows"):
        from_blocked(b, 2.0, 2)


@pytest.mark.parametrize("layout", ["128x4", "8x4"])
def test_from_blocked_returns_a_new_array(layout):
    # with one column tile (cols <= 4) and no reordering, the result was a view of the caller's bytes
    tr, _ = {"128x4": (128, 4), "8x4": (8, 4)}[layout]
    for rows in (1, tr - 1, tr, tr + 1):
        for cols in (1, 3, 4, 5, 8):
            plain = np.arange(rows * cols, dtype=np.uint32).reshape(rows, cols) % 251 + 1
            for blocked in (to_blocked(plain.astype(np.uint8), layout),
                            to_blocked(plain.astype(np.uint8), layout).view(np.int8)):
                before = blocked.copy()
                out = from_blocked(blocked, rows, cols, layout)
                assert out.dtype == np.uint8 and out.flags.c_contiguous and out.flags.writeable
                assert not np.shares_memory(out, blocked), (layout, rows, cols)
                np.testing.assert_array_equal(out, plain)
                out[...] = 0
                np.testing.assert_array_equal(blocked, before)
