"""Torch tensors at the codec entry points: read bit for bit (fp4ref itself never imports torch)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import fp4ref
from fp4ref import blockscale, packing


def test_bf16_and_grad_tensors_encode_like_their_numpy_bits():
    t = torch.randn(4, 32, generator=torch.Generator().manual_seed(0)).bfloat16()
    as_np = t.view(torch.int16).numpy().view(np.uint16).view(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(fp4ref.encode(t, "e2m1"), fp4ref.encode(as_np, "e2m1"))
    g = torch.randn(3, 5, generator=torch.Generator().manual_seed(1), requires_grad=True)
    np.testing.assert_array_equal(fp4ref.encode(g, "e4m3fn"), fp4ref.encode(g.detach().numpy(), "e4m3fn"))
    q_t, q_np = blockscale.nvfp4_quantize(t), blockscale.nvfp4_quantize(as_np)
    np.testing.assert_array_equal(q_t.codes, q_np.codes)
    np.testing.assert_array_equal(q_t.scales, q_np.scales)


def test_fp8_and_fp4_storage_tensors_are_read_as_their_bytes():
    raw = torch.randint(0, 256, (2, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    np.testing.assert_array_equal(packing.unpack_fp4(raw.view(torch.float4_e2m1fn_x2)),
                                  packing.unpack_fp4(raw.numpy()))
    f8 = raw.view(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="x must be float16"):  # an fp8 array is not a float input to encode
        fp4ref.encode(f8, "e2m1")
    np.testing.assert_array_equal(fp4ref.decode(f8.view(torch.uint8), "e4m3fn"),
                                  raw.numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float32))
    # an fp8 tensor where codes are expected: the hint is torch's view, not numpy's
    with pytest.raises(TypeError, match=r"t\.view\(torch\.uint8\)"):
        fp4ref.decode(f8, "e4m3fn")
    with pytest.raises(TypeError, match=r"arr\.view\(np\.uint8\)"):
        fp4ref.decode(raw.numpy().view(ml_dtypes.float8_e4m3fn), "e4m3fn")


def test_ragged_sequence_names_the_argument():
    with pytest.raises(ValueError, match="x: not a rectangular array"):
        fp4ref.encode([[1.0, 2.0], [3.0]], "e2m1")


def test_to_numpy_gives_native_byte_order_same_values():
    from fp4ref._interop import native_byte_order, to_numpy

    x = np.array([[1 + 2.0**-40, -0.0], [np.inf, 3e-310]])
    be = x.astype(x.dtype.newbyteorder("S"))
    before = be.tobytes()
    n = to_numpy(be, "x")
    assert n.dtype.isnative and n.dtype == np.float64 and n.shape == be.shape
    assert np.array_equal(n.view(np.uint64), x.view(np.uint64))  # every bit of every value, -0.0 included
    assert be.tobytes() == before and not be.dtype.isnative  # the caller's array is not touched
    assert to_numpy(x, "x") is x and native_byte_order(x) is x  # native: no copy
    u1 = np.arange(4, dtype=np.uint8)
    assert to_numpy(u1, "x") is u1  # one-byte dtypes have no byte order
    for dt in ("i2", "u4", "f2", "f4", "c16"):
        a = np.arange(6).astype(dt)
        b = to_numpy(a.astype(a.dtype.newbyteorder("S")), "x")
        assert b.dtype == a.dtype and np.array_equal(b, a) and b.tobytes() == a.tobytes()
    t = torch.tensor([1.5, -2.0])
    assert to_numpy(t, "t").dtype == np.float32


def test_float8_e5m2_tensors_are_read_as_e5m2():
    from fp4ref._interop import to_numpy

    t = torch.tensor([1.5, -0.0, 57344.0, float("inf")]).to(torch.float8_e5m2)
    a = to_numpy(t, "t")
    assert a.dtype == ml_dtypes.float8_e5m2
    assert a.view(np.uint8).tolist() == [0x3E, 0x80, 0x7B, 0x7C]


def test_tensor_subclasses_are_converted_bit_for_bit():
    from fp4ref._interop import to_numpy

    p = torch.nn.Parameter(torch.tensor([1.0, -0.0, 3.0]).bfloat16(), requires_grad=False)
    a = to_numpy(p, "p")
    assert type(a) is np.ndarray and a.dtype == ml_dtypes.bfloat16
    assert a.view(np.uint16).tolist() == [0x3F80, 0x8000, 0x4040]
