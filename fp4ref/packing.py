"""Bit packing: two E2M1 codes per byte, and the 2:4 structured-sparse layout.

FP4 packing (``pack_fp4`` / ``unpack_fp4``)
    Element 2i goes to bits 3:0 (the low nibble) and element 2i+1 to bits 7:4 of byte i. This is the order of
    ``torch.float4_e2m1fn_x2``, ml_dtypes' ``float4_e2m1fn`` packing in the OCP MX spec v1.0 §5.3.3 note on
    "packing order", and the NVFP4-linear workload's ``weight_fp4`` (SOL-ExecBench nvfp4_linear_layer). Beware PTX
    ``cvt.rn.satfinite.e2m1x2.f32 d, a, b``, which puts ``a`` in the UPPER nibble.

2:4 structured sparsity (``compress_2to4`` / ``decompress_2to4`` / ``check_meta``)
    The A operand of the sparse_gemm_fp4_fp8 workload (FlashInfer-Bench sparse_gemm_fp4_fp8_n2048_k2048;
    docs/quantization.md, "2:4 sparse packing"). Along the
    compressed axis, every group g of 4 columns 4g..4g+3 is stored as one byte of values and one byte of metadata::

        vals[..., g] = v0 | (v1 << 4)          v0, v1: E2M1 codes
        meta[..., g] = idx0 | (idx1 << 2)      idx0, idx1 in 0..3; bits 7:4 ignored
        A[..., 4g + j] = v0 * (idx0 == j) + v1 * (idx1 == j)      (the "sum semantics")

    The sum semantics define EVERY byte pair: a duplicate index (idx0 == idx1) adds both values into one column,
    idx0 > idx1 simply swaps the roles, bits 7:4 of meta are ignored. Canonical metadata (what ``compress_2to4``
    emits, and what CUTLASS / PTX ``mma.sp`` / PyTorch semi-structured sparsity use) has idx0 < idx1 and bits 7:4
    zero: the valid meta bytes are 0x04 0x08 0x09 0x0C 0x0D 0x0E (CUTLASS / PTX mma.sp metadata). ``check_meta``
    reports the others. int8 storage is read as unsigned bytes (a signed shift that smears the sign bit into
    bits 3:0 is a bug this module cannot have).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._validate import as_code_array, exact_float_dtype, normalize_axis
from .formats import E2M1, decode

__all__ = [
    "pack_fp4",
    "unpack_fp4",
    "compress_2to4",
    "decompress_2to4",
    "check_meta",
    "MetaCheck",
    "CANONICAL_META",
]


def pack_fp4(codes, axis: int = -1) -> np.ndarray:
    """Pack 4-bit codes two per byte along ``axis``: element 2i in bits 3:0, element 2i+1 in bits 7:4.

    Args:
        codes: integer array of 4-bit codes (values 0..15), any shape; its length along ``axis`` must be even.
        axis: the axis to pack along (default last).

    Returns:
        uint8 array, the shape of ``codes`` with the length along ``axis`` halved.

    Raises:
        TypeError: ``codes`` is not an integer array.
        ValueError: ``codes`` is 0-d, a code is outside 0..15, the length along ``axis`` is odd, or ``axis`` is
            out of range.

    Source: element order of ``torch.float4_e2m1fn_x2`` and the NVFP4-linear workload (low nibble first).
    """
    c = as_code_array(codes, "codes", nbits=4)
    ax = normalize_axis(axis, c.ndim, "axis", array="codes")
    n = c.shape[ax]
    if n % 2:
        raise ValueError(
            f"codes has odd length {n} along axis={axis}; pack_fp4 needs an even length (pad explicitly "
            "with code 0 if that is what you mean)"
        )
    c = np.moveaxis(c, ax, -1)
    lo = c[..., 0::2]
    hi = c[..., 1::2]
    packed = (lo | (hi << 4)).astype(np.uint8)
    return np.ascontiguousarray(np.moveaxis(packed, -1, ax))


def unpack_fp4(packed, axis: int = -1) -> np.ndarray:
    """Unpack bytes into 4-bit codes along ``axis``: bits 3:0 give element 2i, bits 7:4 element 2i+1.

    Args:
        packed: uint8 array (int8 is accepted and read as unsigned bytes; other integer dtypes must hold
            values 0..255), any shape.
        axis: the axis to unpack along (default last).

    Returns:
        uint8 array of codes 0..15, the shape of ``packed`` with the length along ``axis`` doubled.

    Raises:
        TypeError: ``packed`` is not an integer array.
        ValueError: ``packed`` is 0-d, a value is outside 0..255, or ``axis`` is out of range.
    """
    p = as_code_array(packed, "packed", nbits=8, allow_int8=True)
    ax = normalize_axis(axis, p.ndim, "axis", array="packed")
    p = np.moveaxis(p, ax, -1)
    out = np.empty(p.shape[:-1] + (2 * p.shape[-1],), dtype=np.uint8)
    out[..., 0::2] = p & 0x0F
    out[..., 1::2] = p >> 4
    return np.ascontiguousarray(np.moveaxis(out, -1, ax))


# --------------------------------------------------------------------------------------------------------------
# 2:4 structured sparsity
# --------------------------------------------------------------------------------------------------------------

#: The six canonical metadata bytes, (idx0, idx1) -> idx0 | idx1 << 2 with idx0 < idx1 and bits 7:4 zero.
CANONICAL_META = (0x04, 0x08, 0x09, 0x0C, 0x0D, 0x0E)

# E2M1 code -> value (codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; 8..15 the negatives, 8 = -0), from the format
# registry.
_E2M1_VALUES = decode(np.arange(16, dtype=np.uint8), E2M1)
_E2M1_VALUES.flags.writeable = False


def _e2m1_codes_from(a, name: str) -> np.ndarray:
    """``a`` as uint8 E2M1 codes: integer codes 0..15 pass through; floats must be E2M1-representable."""
    arr = np.asarray(a)
    if arr.dtype.kind in "ui":
        return as_code_array(arr, name, nbits=4)
    if arr.dtype.kind == "f" and not exact_float_dtype(arr.dtype):  # longdouble: float64 would round 1 + 2**-60
        raise TypeError(
            f"{name} has dtype {arr.dtype}, wider than float64, which is not read here (its values would be "
            f"rounded); pass E2M1 codes or a float16/32/64 array (convert explicitly if that is what you mean)"
        )
    if arr.dtype.kind == "f" or arr.dtype.name in ("bfloat16", "float4_e2m1fn", "float8_e4m3fn", "float8_e5m2"):
        x = arr.astype(np.float64)
        if not np.all(np.isfinite(x)):
            bad = np.flatnonzero(~np.isfinite(x))
            first = np.unravel_index(bad[0], x.shape)
            raise ValueError(
                f"{name} holds {bad.size} non-finite value(s) (first {x[first]} at index "
                f"{tuple(int(i) for i in first)}); compress_2to4 needs E2M1-representable values"
            )
        mag = np.abs(x)
        table = _E2M1_VALUES[:8].astype(np.float64)
        idx = np.searchsorted(table, mag)
        idx_c = np.minimum(idx, 7)
        ok = table[idx_c] == mag
        if not np.all(ok):
            bad = np.flatnonzero(~ok)
            first = np.unravel_index(bad[0], x.shape)
            raise ValueError(
                f"{name} holds {bad.size} value(s) that are not E2M1-representable (first {x[first].item()!r} at "
                f"index {tuple(int(i) for i in first)}); representable magnitudes are 0, 0.5, 1, 1.5, 2, 3, 4, 6. "
                "Quantize first (fp4ref.formats.encode) or pass E2M1 codes"
            )
        return (idx_c | np.where(np.signbit(x), 8, 0)).astype(np.uint8)
    raise TypeError(
        f"{name} must be an integer array of E2M1 codes (0..15) or a floating array of E2M1-representable "
        f"values, got dtype {arr.dtype}"
    )


def compress_2to4(a, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Compress a 2:4-sparse E2M1 operand into (vals, meta) bytes, one pair per group of 4 along ``axis``.

    Args:
        a: E2M1 data, shape [..., K, ...] with K (the length along ``axis``) a multiple of 4. Either integer
            codes 0..15 (any integer dtype; code 8 is -0.0) or a floating array (float16/32/64, ml_dtypes
            bfloat16 / float4_e2m1fn / float8) whose values are all E2M1-representable. At most 2 of each group
            of 4 consecutive elements along ``axis`` may be nonzero; -0.0 (code 8) counts as zero.
        axis: the axis holding K (default last).

    Returns:
        ``(vals, meta)``: two uint8 arrays, the shape of ``a`` with K replaced by K/4.
        ``vals`` low nibble = code of the value at idx0, high nibble = code of the value at idx1;
        ``meta`` = idx0 | (idx1 << 2). Every byte is canonical: idx0 < idx1, bits 7:4 of meta zero.

    Policy for groups with fewer than 2 nonzeros (named, tested): the kept positions are the nonzero ones,
        completed with the lowest-numbered zero positions, in ascending order, and a zero is stored as code 0
        (+0.0; a -0.0 input is not preserved: the sum semantics give +0.0 anyway). So an all-zero group gives
        (vals, meta) = (0x00, 0x04) [positions 0, 1]; a single nonzero at position 0, 1, 2, 3 gives positions
        (0, 1), (0, 1), (0, 2), (0, 3).

    Raises:
        TypeError: ``a`` is neither an integer nor a floating array, or is a float wider than float64
            (longdouble: float64 would round its values).
        ValueError: a code is outside 0..15, a float is not E2M1-representable (or not finite), K is not a
            multiple of 4, ``axis`` is out of range, or a group holds more than 2 nonzeros (the message names
            the row index and the group).

    Source: docs/quantization.md, "2:4 sparse packing"; layout of the sparse_gemm_fp4_fp8 workload
    (FlashInfer-Bench); index order of CUTLASS / PTX ``mma.sp`` metadata.
    """
    codes = _e2m1_codes_from(a, "a")
    ax = normalize_axis(axis, codes.ndim, "axis", array="a")
    k = codes.shape[ax]
    if k % 4:
        raise ValueError(
            f"a has length {k} along axis={axis}; compress_2to4 needs a multiple of 4 (pad explicitly with zeros)"
        )
    c = np.moveaxis(codes, ax, -1)
    lead = c.shape[:-1]
    g = c.reshape(lead + (k // 4, 4))
    nz = (g & 0x7) != 0  # -0.0 (code 8) is zero
    count = nz.sum(axis=-1)
    if np.any(count > 2):
        bad = np.argwhere(count > 2)
        first = tuple(int(i) for i in bad[0])
        row, grp = first[:-1], first[-1]
        raise ValueError(
            f"a is not 2:4 sparse: {len(bad)} group(s) of 4 along axis={axis} hold more than 2 nonzeros; first "
            f"at row {row} group {grp} (elements {4 * grp}..{4 * grp + 3}) with {int(count[first])} nonzeros "
            f"(codes {[int(v) for v in g[first]]})"
        )
    # Rank positions: nonzeros first (in position order), then zeros (in position order). A stable argsort of
    # (not nonzero) does exactly that; the first two ranked positions are kept, then put in ascending order.
    order = np.argsort(~nz, axis=-1, kind="stable")[..., :2]
    order = np.sort(order, axis=-1)
    idx0 = order[..., 0]
    idx1 = order[..., 1]
    v0 = np.take_along_axis(g, idx0[..., None], axis=-1)[..., 0]
    v1 = np.take_along_axis(g, idx1[..., None], axis=-1)[..., 0]
    v0 = np.where((v0 & 0x7) == 0, 0, v0)  # zeros stored as code 0
    v1 = np.where((v1 & 0x7) == 0, 0, v1)
    vals = (v0 | (v1 << 4)).astype(np.uint8)
    meta = (idx0 | (idx1 << 2)).astype(np.uint8)
    return (
        np.ascontiguousarray(np.moveaxis(vals, -1, ax)),
        np.ascontiguousarray(np.moveaxis(meta, -1, ax)),
    )


def decompress_2to4(vals, meta, axis: int = -1) -> np.ndarray:
    """Expand (vals, meta) bytes to the dense float32 operand with the workload's sum semantics.

    For each group g along ``axis``: v0 = vals & 0xF, v1 = vals >> 4 (E2M1 codes), idx0 = meta & 3,
    idx1 = (meta >> 2) & 3, bits 7:4 of meta ignored, and::

        A[..., 4g + j] = E2M1(v0) * (idx0 == j) + E2M1(v1) * (idx1 == j)

    This is defined for every byte pair: a duplicate index adds both values into one column (exact in float32:
    the sum of two E2M1 values lies on 2^-1 Z with magnitude <= 12); a descending pair (idx0 > idx1) is the same
    as the ascending one with the values swapped. Zeros come out as +0.0 (a -0.0 code adds nothing).

    Args:
        vals: uint8 or int8 array (int8 read as unsigned bytes; other integer dtypes must hold 0..255),
            shape [..., G, ...] with G along ``axis``.
        meta: same shape and same dtype rules as ``vals``.
        axis: the axis holding G (default last).

    Returns:
        float32 array, the shape of ``vals`` with G replaced by 4*G.

    Raises:
        TypeError: ``vals`` or ``meta`` is not an integer array.
        ValueError: a value is outside 0..255 (or -128..127 for int8), the shapes differ, or ``axis`` is out of
            range.

    Source: docs/quantization.md, "2:4 sparse packing" (the GEMM C[m, n] = sum_g (v0*B[n, 4g+idx0] + v1*B[n, 4g+idx1])).
    """
    v = as_code_array(vals, "vals", nbits=8, allow_int8=True)
    m = as_code_array(meta, "meta", nbits=8, allow_int8=True)
    if v.shape != m.shape:
        raise ValueError(f"vals and meta must have the same shape, got vals {v.shape} and meta {m.shape}")
    ax = normalize_axis(axis, v.ndim, "axis", array="vals")
    v = np.moveaxis(v, ax, -1)
    m = np.moveaxis(m, ax, -1)
    lead, ngroups = v.shape[:-1], v.shape[-1]
    val0 = _E2M1_VALUES[v & 0x0F]
    val1 = _E2M1_VALUES[v >> 4]
    idx0 = (m & 0x3).astype(np.intp)
    idx1 = ((m >> 2) & 0x3).astype(np.intp)
    j = np.arange(4, dtype=np.intp)
    # +0.0 start, then add each value where its index matches (a -0.0 value contributes +0.0 + -0.0 = +0.0).
    dense = np.zeros(lead + (ngroups, 4), dtype=np.float32)
    dense += np.where(idx0[..., None] == j, val0[..., None], np.float32(0))
    dense += np.where(idx1[..., None] == j, val1[..., None], np.float32(0))
    dense = dense.reshape(lead + (4 * ngroups,))
    return np.ascontiguousarray(np.moveaxis(dense, -1, ax))


class MetaCheck(NamedTuple):
    """Result of :func:`check_meta`.

    Attributes:
        noncanonical: bool array, the shape of ``meta``; True where the byte is not one of ``CANONICAL_META``.
        count: number of non-canonical bytes.
        total: number of bytes checked.
        duplicate_index: bytes with idx0 == idx1 (the two values add into one column).
        descending: bytes with idx0 > idx1.
        high_bits: bytes with any of bits 7:4 set (ignored by the sum semantics).
        first: index of the first non-canonical byte (C order), or None.
    """

    noncanonical: np.ndarray
    count: int
    total: int
    duplicate_index: int
    descending: int
    high_bits: int
    first: tuple | None

    @property
    def ok(self) -> bool:
        """True when every byte is canonical."""
        return self.count == 0

    def summary(self) -> str:
        """One line: counts of each kind of non-canonical byte, and the first offender."""
        if self.count == 0:
            return f"meta: all {self.total} byte(s) canonical"
        return (
            f"meta: {self.count} of {self.total} byte(s) non-canonical ({100.0 * self.count / self.total:.3g}%): "
            f"{self.duplicate_index} duplicate index, {self.descending} idx0 > idx1, {self.high_bits} with bits "
            f"7:4 set; first at index {self.first}"
        )


def check_meta(meta) -> MetaCheck:
    """Find non-canonical 2:4 metadata bytes.

    A canonical byte has idx0 = bits 1:0 < idx1 = bits 3:2 and bits 7:4 zero, i.e. it is one of
    0x04 0x08 0x09 0x0C 0x0D 0x0E. Non-canonical bytes are still well defined (``decompress_2to4``), but hardware
    sparse MMA (PTX ``mma.sp``) requires canonical ones, so a kernel that passes them on must handle them itself.

    Args:
        meta: uint8 or int8 array (int8 read as unsigned bytes), any shape.

    Returns:
        A :class:`MetaCheck` with the boolean mask, the counts by kind (a byte can be in several kinds) and
        ``summary()``.

    Raises:
        TypeError: ``meta`` is not an integer array.
        ValueError: a value is outside 0..255.

    Source: CUTLASS / PTX mma.sp / PyTorch semi-structured sparsity metadata.
    """
    m = as_code_array(meta, "meta", nbits=8, allow_int8=True)
    idx0 = m & 0x3
    idx1 = (m >> 2) & 0x3
    high = (m >> 4) != 0
    dup = idx0 == idx1
    desc = idx0 > idx1
    bad = high | dup | desc
    count = int(bad.sum())
    first = None
    if count:
        first = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(bad)[0]), m.shape))
    return MetaCheck(
        noncanonical=bad,
        count=count,
        total=int(m.size),
        duplicate_index=int(dup.sum()),
        descending=int(desc.sum()),
        high_bits=int(high.sum()),
        first=first,
    )
