"""Arrays at the edges: accept torch tensors without importing torch.

fp4ref never imports torch (a test asserts it). Kernel authors call the reference GEMMs and the checker with torch
tensors; such a tensor is recognised by ``type(x).__module__.startswith("torch")`` and converted through the torch
module the caller already imported (``sys.modules["torch"]``): moved to the CPU, detached, and viewed bit for bit
as a numpy array. Dtypes numpy lacks are viewed through their bytes, never converted through a float:

=========================  =======================================================
torch dtype                numpy result
=========================  =======================================================
bfloat16                   ml_dtypes.bfloat16 (int16 view -> uint16 -> bfloat16)
float8_e4m3fn              ml_dtypes.float8_e4m3fn (uint8 view)
float8_e5m2                ml_dtypes.float8_e5m2 (uint8 view)
float8_e8m0fnu             uint8 (the UE8M0 bytes)
float4_e2m1fn_x2           uint8 (two packed E2M1 codes per byte, element 2i low)
anything numpy has         the same dtype (``tensor.numpy()``)
=========================  =======================================================

A numpy array of non-native byte order (``'>f8'`` on a little-endian machine, as read from a file) is converted
to native order here too, value for value: every later dtype test (``arr.dtype == np.float64`` is False for
``'>f8'``) and bit view (``.view(np.uint16)`` reads swapped bytes) then sees the same array a native one gives.
"""
from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

__all__ = ["is_torch_tensor", "to_numpy", "native_byte_order"]


def is_torch_tensor(x) -> bool:
    """True when ``x`` is a torch tensor (detected by its type's module; torch is not imported)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "dtype")


def native_byte_order(arr: np.ndarray) -> np.ndarray:
    """``arr`` itself when its dtype has native byte order (one-byte dtypes always do), else a copy in native order
    holding the same values (lossless: only the bytes of each element are reordered)."""
    if arr.dtype.isnative:
        return arr
    return arr.astype(arr.dtype.newbyteorder("="))


def to_numpy(x, name: str = "x"):
    """Return ``x`` unchanged unless it is a torch tensor or a numpy array of non-native byte order: a torch tensor
    becomes a numpy array holding the same bits (a copy), a non-native numpy array a native-order copy holding the
    same values (:func:`native_byte_order`); the caller's array is never modified.

    Raises:
        TypeError: ``x`` is a torch tensor of a dtype with no lossless numpy view here (e.g. complex32).
    """
    if isinstance(x, np.ndarray):
        return native_byte_order(x)
    if not is_torch_tensor(x):
        return x
    torch = sys.modules["torch"]
    t = x.detach()
    if t.device.type == "meta":
        raise TypeError(f"{name}: a meta tensor holds no data to read")
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    dt = t.dtype
    if dt == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).view(ml_dtypes.bfloat16).copy()
    byte_views = {
        "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
        "float8_e5m2": ml_dtypes.float8_e5m2,
        "float8_e8m0fnu": np.uint8,
        "float4_e2m1fn_x2": np.uint8,
    }
    dname = str(dt).replace("torch.", "")
    if dname in byte_views:
        return t.view(torch.uint8).numpy().view(byte_views[dname]).copy()
    try:
        return t.numpy().copy()
    except TypeError as exc:  # pragma: no cover - exotic dtypes
        raise TypeError(f"{name}: torch tensor of dtype {dt} has no lossless numpy view in fp4ref") from exc
