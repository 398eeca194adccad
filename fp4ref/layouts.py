"""Block-scale layouts: the swizzled byte orders GEMM kernels read block scales in.

A plain block-scale matrix is row-major ``[rows, cols]`` (one byte per block: E4M3FN for NVFP4, UE8M0 for MX), with
``rows`` the M (or N) dimension of the operand and ``cols = K / block``. Kernels read it swizzled into tiles:

``"128x4"`` (cuBLAS / CUTLASS / ``torch._scaled_mm`` "blocked" layout; FlashInfer ``SWIZZLED_128x4``)
    Rows padded to Rp = ceil(rows/128)*128, columns to Cp = ceil(cols/4)*4, padding bytes ZERO. Each 128x4 tile of
    the padded matrix is 512 contiguous bytes; tiles are ordered row-tile-major. As a shape (Triton tutorial 10,
    torchao ``to_blocked``): ``(Rp/128, Cp/4, 32, 4, 4)`` indexed ``[r//128, c//4, r%32, (r%128)//32, c%4]``, i.e.::

        off(r, c) = ((r//128)*(Cp/4) + c//4)*512 + (r%32)*16 + ((r%128)//32)*4 + (c%4)

``"8x4"`` (FlashInfer / TensorRT-LLM ``SWIZZLED_8x4``, ``get_sf_out_offset_8x4``, used for small M)
    Rows padded to a multiple of 8, columns to 4, padding ZERO; 8x4 tiles of 32 contiguous bytes, row-tile-major,
    row-major inside a tile: shape ``(Rp/8, Cp/4, 8, 4)`` indexed ``[r//8, c//4, r%8, c%4]``::

        off(r, c) = ((r//8)*(Cp/4) + c//4)*32 + (r%8)*4 + (c%4)

Layout names are read in any case (``"128X4"`` is ``"128x4"``), as the library's other names are.

Padding must be zero: a kernel that reads a padding byte as an E4M3 scale multiplies by 0, while 0x7F would be NaN
(cuBLAS "1D block scaling factors layout"; torch._scaled_mm).
"""
from __future__ import annotations

import numpy as np

from ._validate import as_code_array, is_int

__all__ = ["LAYOUTS", "blocked_offsets", "blocked_size", "to_blocked", "from_blocked"]

#: layout name -> (row tile, column tile)
LAYOUTS = {"128x4": (128, 4), "8x4": (8, 4)}


def _check_layout(layout) -> str:
    if not isinstance(layout, str):
        raise TypeError(f"layout={layout!r}: expected a str (one of {sorted(LAYOUTS)}), got {type(layout).__name__}")
    if layout.lower() not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {sorted(LAYOUTS)} (any case)")
    return layout.lower()


def _check_dim(value, name: str) -> int:
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name}={value} must be >= 0")
    return int(value)


def _padded(rows: int, cols: int, layout: str) -> tuple[int, int]:
    tr, tc = LAYOUTS[layout]
    return -(-rows // tr) * tr, -(-cols // tc) * tc


def blocked_size(rows: int, cols: int, layout: str = "128x4") -> int:
    """Number of bytes of the swizzled layout for a ``rows`` x ``cols`` scale matrix (padding included)."""
    layout = _check_layout(layout)
    rp, cp = _padded(_check_dim(rows, "rows"), _check_dim(cols, "cols"), layout)
    return rp * cp


def blocked_offsets(rows: int, cols: int, layout: str = "128x4") -> np.ndarray:
    """int64 array [rows, cols]: the byte offset of plain element (r, c) in the swizzled layout (formula above)."""
    layout = _check_layout(layout)
    rows, cols = _check_dim(rows, "rows"), _check_dim(cols, "cols")
    _, cp = _padded(rows, cols, layout)
    r = np.arange(rows, dtype=np.int64)[:, None]
    c = np.arange(cols, dtype=np.int64)[None, :]
    if layout == "128x4":
        return ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)
    return ((r // 8) * (cp // 4) + c // 4) * 32 + (r % 8) * 4 + (c % 4)


def to_blocked(scales, layout: str = "128x4") -> np.ndarray:
    """Swizzle a plain [rows, cols] block-scale matrix into ``layout`` (padding bytes zero).

    Args:
        scales: 2-D uint8 array (int8 read as unsigned bytes; other integer dtypes must hold 0..255) of scale bytes,
            row-major plain layout [rows, cols] (cols = K / block).
        layout: ``"128x4"`` or ``"8x4"`` (module docstring).

    Returns:
        1-D uint8 array of ``blocked_size(rows, cols, layout)`` bytes.

    Raises:
        TypeError: ``scales`` is not an integer array (for ml_dtypes float8 arrays pass ``.view(np.uint8)``);
            ``layout`` not a str.
        ValueError: ``scales`` is not 2-D, a value is outside 0..255, or ``layout`` is unknown.

    Source: cuBLAS "1D block scaling factors layout"; torchao ``mx_formats/utils.py`` ``to_blocked``;
    TensorRT-LLM/FlashInfer ``get_sf_out_offset_128x4`` / ``get_sf_out_offset_8x4``.
    """
    layout = _check_layout(layout)
    s = as_code_array(scales, "scales", nbits=8, allow_int8=True)
    if s.ndim != 2:
        raise ValueError(f"scales must be 2-D [rows, cols], got shape {s.shape}")
    rows, cols = s.shape
    rp, cp = _padded(rows, cols, layout)
    tr, tc = LAYOUTS[layout]
    padded = np.zeros((rp, cp), dtype=np.uint8)
    padded[:rows, :cols] = s
    if layout == "128x4":
        # [Rp/128, 4, 32, Cp/4, 4] -> [Rp/128, Cp/4, 32, 4, 4]
        t = padded.reshape(rp // 128, 4, 32, cp // 4, 4).transpose(0, 3, 2, 1, 4)
    else:
        # [Rp/8, 8, Cp/4, 4] -> [Rp/8, Cp/4, 8, 4]
        t = padded.reshape(rp // tr, tr, cp // tc, tc).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(t).reshape(-1)


def from_blocked(blocked, rows: int, cols: int, layout: str = "128x4", *, check_padding: bool = True) -> np.ndarray:
    """Inverse of :func:`to_blocked`: the plain [rows, cols] scale matrix from its swizzled bytes.

    Args:
        blocked: uint8 (or int8) array holding exactly ``blocked_size(rows, cols, layout)`` bytes, any shape
            (read in C order; torchao keeps it 1-D, TE/FlashInfer as [Rp, Cp]).
        rows, cols: the plain matrix shape (cols = K / block).
        layout: ``"128x4"`` or ``"8x4"``.
        check_padding: raise if a padding byte is not zero (default True; a non-zero padding byte is a layout bug).

    Returns:
        a new uint8 array [rows, cols] (C order), never a view of ``blocked``: writing to it leaves ``blocked``
        unchanged.

    Raises:
        TypeError / ValueError: bad dtype, wrong byte count, unknown layout, or non-zero padding (with the count and
        the first padded position); TypeError: ``check_padding`` not a bool.
    """
    if not isinstance(check_padding, (bool, np.bool_)):
        raise TypeError(f"check_padding={check_padding!r}: expected a bool")
    layout = _check_layout(layout)
    rows, cols = _check_dim(rows, "rows"), _check_dim(cols, "cols")
    b = as_code_array(blocked, "blocked", nbits=8, allow_int8=True)
    rp, cp = _padded(rows, cols, layout)
    if b.size != rp * cp:
        raise ValueError(
            f"blocked holds {b.size} bytes; a {rows}x{cols} scale matrix in layout {layout!r} needs {rp * cp} "
            f"(rows padded to {rp}, cols to {cp})"
        )
    flat = b.reshape(-1)
    tr, tc = LAYOUTS[layout]
    if layout == "128x4":
        padded = flat.reshape(rp // 128, cp // 4, 32, 4, 4).transpose(0, 3, 2, 1, 4).reshape(rp, cp)
    else:
        padded = flat.reshape(rp // tr, cp // tc, tr, tc).transpose(0, 2, 1, 3).reshape(rp, cp)
    if check_padding and (rp > rows or cp > cols):
        pad_mask = np.ones((rp, cp), dtype=bool)
        pad_mask[:rows, :cols] = False
        bad = pad_mask & (padded != 0)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"blocked has {int(bad.sum())} non-zero padding byte(s) (first at padded position {first}, value "
                f"{int(padded[first])}); padding must be zero. Pass check_padding=False to ignore it"
            )
    # a copy always: when no reordering is needed (one column tile) the slice is a view of the caller's bytes
    return np.array(padded[:rows, :cols], dtype=np.uint8, order="C", copy=True)
