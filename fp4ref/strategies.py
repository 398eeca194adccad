"""Hypothesis strategies for FP4/FP8 kernels, in the style of ``hypothesis.extra.numpy``.

Each strategy is named for what it produces, takes keyword-only options (``min_``/``max_``/``allow_`` families),
validates its arguments when it is BUILT (``InvalidArgument`` with the offending value), and accepts a value or a
strategy for shapes. Everything is numpy (uint8 codes, float16, ml_dtypes bfloat16). The module needs Hypothesis
(the ``testing`` extra: ``pip install 'fp4ref[testing]'``).

=================================  =============================================================================
strategy                           draws
=================================  =============================================================================
``gemm_shapes``                    GemmShape(M, N, K) with bounds and divisibility constraints
``e2m1_codes``                     uint8 E2M1 codes 0..15 (optionally without -0)
``e4m3_bytes``                     uint8 E4M3FN bytes (NaN 0x7F/0xFF optional; magnitude classes weighted)
``packed_fp4``                     uint8 packed FP4 bytes (two codes per byte)
``meta_bytes``                     2:4 metadata bytes: canonical (0x04 0x08 0x09 0x0C 0x0D 0x0E) or any byte
``sparse_a_operands``              (a_vals, a_meta) for the sparse workload, uint8 or int8
``fp16_matrices``                  float16 matrices with adversarial magnitude patterns
``nvfp4_operands``                 raw NVFP4 operands (NVFP4Tensor: codes, scale bytes, global scale) with ties,
                                   zero blocks, subnormal and near-overflow block scales
``mx_operands``                    raw MX operand dicts (element codes, UE8M0 scale bytes incl. 0 = 2^-127, 254)
``nvfp4_inputs``                   bf16 activations that exercise an NVFP4 quantizer (ties, zero blocks, ...)
``exact_accumulation_fp16``        fp16 (A, B) whose fp32 partial sums are exact in ANY order and on any tensor
                                   core model, yet need > 14 significant bits (so ``check`` demands equality)
``exact_accumulation_sparse``      sparse operands with the same property (B integers, A halves)
=================================  =============================================================================
"""
from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

try:
    from hypothesis import strategies as st
    from hypothesis.errors import InvalidArgument
except ModuleNotFoundError as exc:  # an optional dependency: say which extra brings it
    if exc.name != "hypothesis":
        raise
    raise ModuleNotFoundError("fp4ref.strategies needs hypothesis, which is not installed: pip install "
                              "'fp4ref[testing]'", name="hypothesis") from exc

from ._validate import global_scale_float32, is_int
from .blockscale import NVFP4Tensor, _mx_element
from .packing import CANONICAL_META

__all__ = [
    "GemmShape",
    "gemm_shapes",
    "e2m1_codes",
    "e4m3_bytes",
    "packed_fp4",
    "meta_bytes",
    "sparse_a_operands",
    "fp16_matrices",
    "nvfp4_operands",
    "NVFP4Operand",
    "nvfp4_inputs",
    "mx_operands",
    "exact_accumulation_fp16",
    "exact_accumulation_sparse",
    "exact_accumulation_fp16_arrays",
    "exact_accumulation_sparse_arrays",
    "MAGNITUDE_PATTERNS",
]


class GemmShape(NamedTuple):
    """A GEMM problem size: C [M, N] = A [M, K] @ B [N, K].T."""

    M: int
    N: int
    K: int


def _check_int(name, v, lo=0):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise InvalidArgument(f"{name}={v!r} must be an int")
    if v < lo:
        raise InvalidArgument(f"{name}={v} must be >= {lo}")


def _check_bools(**flags):
    """InvalidArgument naming the first of ``flags`` that is not a bool (1, "no" and None are not read as flags)."""
    for name, v in flags.items():
        if not isinstance(v, (bool, np.bool_)):
            raise InvalidArgument(f"{name}={v!r} must be a bool, got {type(v).__name__}")


def _range(name, lo, hi, mult):
    _check_int(f"min_{name}", lo, 1)
    _check_int(f"max_{name}", hi, 1)
    _check_int(f"{name}_multiple_of", mult, 1)
    if lo > hi:
        raise InvalidArgument(f"min_{name}={lo} is larger than max_{name}={hi}")
    first = -(-lo // mult) * mult
    if first > hi:
        raise InvalidArgument(f"no multiple of {name}_multiple_of={mult} lies in [min_{name}={lo}, max_{name}={hi}]")
    return st.integers(first // mult, hi // mult).map(lambda v: v * mult)


def gemm_shapes(*, min_m=1, max_m=64, min_n=1, max_n=64, min_k=1, max_k=256, m_multiple_of=1, n_multiple_of=1,
                k_multiple_of=1) -> st.SearchStrategy[GemmShape]:
    """GEMM sizes within bounds, each a multiple of its ``*_multiple_of`` (e.g. ``k_multiple_of=16`` for NVFP4,
    4 for 2:4 sparsity). Shrinks toward the smallest sizes."""
    return st.builds(GemmShape, _range("m", min_m, max_m, m_multiple_of), _range("n", min_n, max_n, n_multiple_of),
                     _range("k", min_k, max_k, k_multiple_of))


def _shape_strategy(shape):
    """``shape`` (a non-negative int, a tuple of them, or a strategy) as a strategy of shape tuples; called when a
    strategy is built, so a bad fixed shape (2.0, a bool, -1, a list) is an InvalidArgument then, not at draw time."""
    if isinstance(shape, st.SearchStrategy):
        return shape
    if is_int(shape):
        shape = (int(shape),)
    if not isinstance(shape, tuple) or not all(is_int(s) and s >= 0 for s in shape):
        raise InvalidArgument(f"shape={shape!r} must be a tuple of non-negative ints or a strategy")
    return st.just(tuple(int(s) for s in shape))


def _array_from_choices(shape, choices, dtype=np.uint8):
    """uint8 array of ``shape`` drawn from ``choices`` (a sequence of ints) with a random generator seeded by
    Hypothesis (fast for large arrays; shrinks through the seed) and a few explicitly drawn cells."""
    choices = np.asarray(list(choices), dtype=np.int64)
    shapes = _shape_strategy(shape)  # validated now, when the strategy is built

    @st.composite
    def _draw(draw):
        shp = draw(shapes)
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        arr = choices[rng.integers(0, len(choices), size=shp)].astype(dtype)
        if arr.size:
            # a few cells chosen by Hypothesis itself, so shrinking can find a single bad code
            for _ in range(draw(st.integers(0, 3))):
                i = draw(st.integers(0, arr.size - 1))
                arr.reshape(-1)[i] = draw(st.sampled_from(choices.tolist()))
        return arr

    return _draw()


def e2m1_codes(shape, *, allow_negative_zero=True) -> st.SearchStrategy[np.ndarray]:
    """uint8 arrays of E2M1 codes 0..15 (code 8 = -0.0 unless ``allow_negative_zero=False``)."""
    _check_bools(allow_negative_zero=allow_negative_zero)
    codes = [c for c in range(16) if allow_negative_zero or c != 8]
    return _array_from_choices(shape, codes)


# E4M3FN magnitude classes (bytes without the sign): zero, subnormals, small normals, ~1, large, max, NaN.
_E4M3_CLASSES = {
    "zero": [0x00],
    "subnormal": list(range(0x01, 0x08)),
    "normal": list(range(0x08, 0x7E)),
    "max": [0x7E],
    "nan": [0x7F],
}


def e4m3_bytes(shape, *, allow_nan=False, allow_subnormal=True, allow_negative=True) -> st.SearchStrategy[np.ndarray]:
    """uint8 arrays of E4M3FN bytes. Every finite byte can occur; zero, subnormal and max bytes are over-weighted
    (one class in ~8 draws each); NaN bytes 0x7F / 0xFF only with ``allow_nan``."""
    _check_bools(allow_nan=allow_nan, allow_subnormal=allow_subnormal, allow_negative=allow_negative)
    mags = list(_E4M3_CLASSES["normal"]) + _E4M3_CLASSES["max"] * 8 + _E4M3_CLASSES["zero"] * 8
    if allow_subnormal:
        mags += _E4M3_CLASSES["subnormal"] * 2
    if allow_nan:
        mags += _E4M3_CLASSES["nan"] * 4
    vals = mags + ([m | 0x80 for m in mags] if allow_negative else [])
    return _array_from_choices(shape, vals)


def packed_fp4(shape, *, allow_negative_zero=True) -> st.SearchStrategy[np.ndarray]:
    """uint8 arrays of packed E2M1 pairs (``shape`` is the PACKED shape; element 2i in the low nibble)."""
    _check_bools(allow_negative_zero=allow_negative_zero)
    codes = [c for c in range(16) if allow_negative_zero or c != 8]
    return _array_from_choices(shape, [lo | (hi << 4) for lo in codes for hi in codes])


def meta_bytes(shape, *, canonical=True) -> st.SearchStrategy[np.ndarray]:
    """2:4 metadata bytes: only the six canonical bytes, or (``canonical=False``) any byte 0..255 with the
    non-canonical kinds (duplicate index, idx0 > idx1, bits 7:4 set) well represented."""
    _check_bools(canonical=canonical)
    if canonical:
        return _array_from_choices(shape, CANONICAL_META)
    return _array_from_choices(shape, list(range(256)) + list(CANONICAL_META) * 8)


def sparse_a_operands(m, k, *, canonical=False, int8=False) -> st.SearchStrategy[tuple]:
    """(a_vals, a_meta) for the sparse workload, shape [m, k/4] each (``k`` a multiple of 4; ints or strategies).

    ``canonical=False`` draws any bytes (the public benchmark's randint(-128, 128) int8 inputs); ``int8=True``
    returns int8 views of the same bytes.

    Raises:
        InvalidArgument: (when built) a fixed ``m`` or ``k`` that is not an int >= 0, or ``k`` not a multiple of 4;
            a drawn ``k`` not a multiple of 4 is one at draw time."""
    _check_bools(canonical=canonical, int8=int8)
    for nm, v in (("m", m), ("k", k)):
        if not isinstance(v, st.SearchStrategy):
            _check_int(nm, v, 0)
    if not isinstance(k, st.SearchStrategy) and k % 4:
        raise InvalidArgument(f"k={k} must be a multiple of 4")

    @st.composite
    def _draw(draw):
        mm = draw(m) if isinstance(m, st.SearchStrategy) else m
        kk = draw(k) if isinstance(k, st.SearchStrategy) else k
        if kk % 4:
            raise InvalidArgument(f"k={kk} must be a multiple of 4")
        vals = draw(packed_fp4((mm, kk // 4)))
        meta = draw(meta_bytes((mm, kk // 4), canonical=canonical))
        if int8:
            return vals.view(np.int8), meta.view(np.int8)
        return vals, meta

    return _draw()


#: Magnitude patterns of :func:`fp16_matrices`.
MAGNITUDE_PATTERNS = ("normal", "wide", "rows", "cancel", "tiny", "huge", "mixed")


def _pattern(rng, shape, pattern, max_exp, min_exp):
    x = rng.standard_normal(shape)
    if pattern == "normal":
        return x
    if pattern == "wide":  # every element its own exponent
        return x * np.ldexp(1.0, rng.integers(min_exp, max_exp, shape))
    if pattern == "rows":  # each row a different scale
        return x * np.ldexp(1.0, rng.integers(min_exp, max_exp, (shape[0], 1)))
    if pattern == "cancel":  # pairs (x, -x(1 + tiny)) along K: heavy cancellation
        y = x.copy()
        y[:, 1::2] = -x[:, 0::2][:, : y[:, 1::2].shape[1]] * (1 + rng.integers(-4, 5, y[:, 1::2].shape) * 2.0**-10)
        return y
    if pattern == "tiny":
        return x * 2.0**min_exp
    if pattern == "huge":
        return x * 2.0 ** (max_exp - 3)
    # mixed: one huge element per row, the rest small
    y = x * 2.0**-6
    y[np.arange(shape[0]), rng.integers(0, shape[1], shape[0])] *= 2.0**12
    return y


#: fp16's largest finite exponent (65504 = 1.999 * 2^15): the largest ``max_exponent`` of :func:`fp16_matrices`.
_FP16_MAX_EXPONENT = 15
_FP16_MAX = float(np.finfo(np.float16).max)


def fp16_matrices(shape, *, patterns=MAGNITUDE_PATTERNS, max_exponent=6, min_exponent=-20,
                  allow_nonfinite=False) -> st.SearchStrategy[np.ndarray]:
    """float16 2-D arrays with adversarial magnitude patterns (``MAGNITUDE_PATTERNS``): wide exponent spread,
    per-row scales, cancelling pairs, subnormal-range (``tiny``), near-overflow (``huge``) and one dominant element
    per row. ``allow_nonfinite`` sprinkles +-inf / NaN; without it every value is finite. Values are float16 RNE
    casts of float64 draws (standard normals times powers of two), those beyond fp16's range clamped to +-65504.

    Args:
        shape: (rows, cols), non-negative ints, or a strategy of such 2-tuples (its draws are checked when drawn).
        patterns: a non-empty subset of ``MAGNITUDE_PATTERNS``.
        max_exponent: int in [-30, 15] (15: fp16's largest finite exponent): ``wide`` / ``rows`` scale by 2^e,
            e in [min_exponent, max_exponent); ``huge`` by 2^(max_exponent - 3).
        min_exponent: int >= -40, below ``max_exponent``: the smallest such e; ``tiny`` scales by 2^min_exponent.

    Returns:
        a strategy of float16 arrays of ``shape``.

    Raises:
        InvalidArgument: (when built) an unknown pattern; an exponent not an int or out of range; a fixed shape
            that is not a 2-tuple of non-negative ints.
    """
    bad = [p for p in patterns if p not in MAGNITUDE_PATTERNS]
    if bad or not patterns:
        raise InvalidArgument(f"patterns={patterns!r}: each must be one of {MAGNITUDE_PATTERNS}")
    _check_bools(allow_nonfinite=allow_nonfinite)
    _check_int("max_exponent", max_exponent, -30)
    if max_exponent > _FP16_MAX_EXPONENT:
        raise InvalidArgument(f"max_exponent={max_exponent} must be <= {_FP16_MAX_EXPONENT} (fp16's largest finite "
                              f"exponent: 2^16 overflows)")
    _check_int("min_exponent", min_exponent, -40)
    if min_exponent >= max_exponent:
        raise InvalidArgument(f"min_exponent={min_exponent} is not smaller than max_exponent={max_exponent}")
    shapes = _shape_strategy(shape)
    if not isinstance(shape, st.SearchStrategy) and (is_int(shape) or len(shape) != 2):
        raise InvalidArgument(f"shape={shape!r}: fp16_matrices needs a 2-D shape (rows, cols)")

    @st.composite
    def _draw(draw):
        shp = draw(shapes)
        if len(shp) != 2:
            raise InvalidArgument(f"fp16_matrices needs a 2-D shape, got {shp}")
        pattern = draw(st.sampled_from(list(patterns)))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        x = _pattern(rng, shp, pattern, max_exponent, min_exponent)
        a = np.clip(x, -_FP16_MAX, _FP16_MAX).astype(np.float16)  # |x| * 2^14 can pass 65520 (inf) at 15
        if allow_nonfinite and a.size and draw(st.booleans()):
            i = draw(st.integers(0, a.size - 1))
            a.reshape(-1)[i] = draw(st.sampled_from([np.inf, -np.inf, np.nan]))
        return a

    return _draw()


def _check_arrays_args(rng, m, n, k, *, sparse=False, promote_every=None, **flags):
    """The arguments of a plain-numpy ``*_arrays`` construction (no Hypothesis, so TypeError / ValueError, not
    InvalidArgument): ``rng`` a numpy Generator, ``m``, ``n`` ints >= 0, ``k`` an int >= 1 (``sparse``: a multiple
    of 4), ``promote_every`` None or an int >= 1, each of ``flags`` a bool. Each error names the argument."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator (np.random.default_rng(seed)), got {type(rng).__name__}")
    for nm, v, lo in (("m", m, 0), ("n", n, 0), ("k", k, 1)):
        if not is_int(v):
            raise TypeError(f"{nm}={v!r} must be an int, got {type(v).__name__}")
        if v < lo:
            raise ValueError(f"{nm}={v} must be >= {lo}")
    if sparse and k % 4:
        raise ValueError(f"k={k} must be a multiple of 4 (2:4 sparsity: a_vals and a_meta hold one byte per 4 "
                         f"K-columns)")
    if promote_every is not None:
        if not is_int(promote_every):
            raise TypeError(f"promote_every={promote_every!r} must be None or an int, got "
                            f"{type(promote_every).__name__}")
        if promote_every < 1:
            raise ValueError(f"promote_every={promote_every} must be >= 1 (products per promotion to fp32)")
    for nm, v in flags.items():
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{nm}={v!r} must be a bool, got {type(v).__name__}")


def exact_accumulation_fp16(m, n, k) -> st.SearchStrategy[tuple]:
    """fp16 (A [m, k], B [n, k]) whose every partial sum, in ANY order and under every tensor-core model with
    F >= 24 (and fp32 RN summation), is EXACT, while the results use up to 24 significant bits (far more than 14:
    an e8m13 fp8-style accumulator or a bf16/fp16 intermediate loses them). The correctly rounded fp16 output is then
    the only right answer (``check(..., exact_accumulation=True)``); fp16 output ties occur.

    Construction (CUTLASS-style small integers, scaled): a = ia 2^-sa, b = ib 2^-sb with integers
    |ia|, |ib| <= imax, k imax^2 < 2^24, and sa + sb chosen so that |sum| <= k |a| |b| <= 2^15 (finite fp16
    outputs). All partial sums lie on 2^-(sa+sb) Z below 2^15, i.e. need <= 24 bits: exact in fp32, and a block
    FMA aligned to a term <= 2^15 keeps 2^(15-24) = 2^-9 >= the grid. Two mirrored same-sign runs open every row
    (:func:`exact_accumulation_fp16_arrays`): every element's partial sums pass 2^11, so an fp16 or bf16
    accumulator cannot be exact on any element (tests/test_exact_families.py).
    """
    for nm, v in (("m", m), ("n", n), ("k", k)):
        _check_int(nm, v, 1)
    imax = min(2047, int(np.floor(np.sqrt((2**24 - 1) / k))))
    if imax < 2:
        raise InvalidArgument(f"k={k} is too large for an exact-accumulation family (k * imax^2 < 2^24)")

    @st.composite
    def _draw(draw):
        return exact_accumulation_fp16_arrays(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), m, n, k)

    return _draw()


def exact_accumulation_fp16_arrays(rng, m, n, k) -> tuple:
    """The construction of :func:`exact_accumulation_fp16` with a numpy Generator (deterministic for a seed).

    Every row opens with two mirrored same-sign runs of ``k // 4`` columns each: in the first, row i of A has one
    sign and row j of B one sign, with |ia|, |ib| >= ceil(0.7 imax), so every output element's partial sums grow
    monotonically to at least ``_fp16_run_floor(k)`` (>= 2^11: there an fp16 accumulator's ulp is >= 2, bf16's
    >= 16, while the products lie on 2^-(sa+sb) Z, so fp16/bf16 accumulation cannot keep them); the second run
    holds -A and B of the first, so it brings every sum back to exactly 0 and the results are those of the
    remaining columns, uniform in [-imax, imax] (cancellation, exact fp16 output ties).

    Args:
        rng: a ``np.random.Generator``. m, n: ints >= 0. k: an int >= 1.

    Returns:
        (A, B): float16 arrays [m, k] and [n, k].

    Raises:
        TypeError: ``rng`` not a Generator; ``m``, ``n`` or ``k`` not an int (a bool, 8.0).
        ValueError: ``m`` or ``n`` < 0, ``k`` < 1, or ``k`` too large for the family (k * 2^2 >= 2^24)."""
    _check_arrays_args(rng, m, n, k)
    imax = min(2047, int(np.floor(np.sqrt((2**24 - 1) / k))))
    if imax < 2:
        raise ValueError(f"k={k} is too large for an exact-accumulation family (k * imax^2 < 2^24)")
    shift = _fp16_shift(k, imax)
    sa, sb = shift // 2, shift - shift // 2
    a = rng.integers(-imax, imax + 1, (m, k))
    b = rng.integers(-imax, imax + 1, (n, k))
    run, lo = k // 4, _fp16_run_min(imax)
    a[:, :run] = rng.integers(lo, imax + 1, (m, run)) * rng.choice([-1, 1], (m, 1))
    b[:, :run] = rng.integers(lo, imax + 1, (n, run)) * rng.choice([-1, 1], (n, 1))
    a[:, run:2 * run] = -a[:, :run]
    b[:, run:2 * run] = b[:, :run]
    return np.ldexp(a, -sa).astype(np.float16), np.ldexp(b, -sb).astype(np.float16)


def _fp16_shift(k, imax):
    return max(0, int(np.ceil(np.log2(k * imax * imax))) - 15)


def _fp16_run_min(imax):
    return -(-7 * imax // 10)


def _fp16_run_floor(k) -> float:
    """A lower bound on the largest |partial sum| of every output element of exact_accumulation_fp16_arrays."""
    imax = min(2047, int(np.floor(np.sqrt((2**24 - 1) / k))))
    return (k // 4) * _fp16_run_min(imax) ** 2 * 2.0 ** -_fp16_shift(k, imax)


def _groups_per_chunk(n: int) -> int:
    """The most groups of 4 K-columns that a chunk of ``n`` columns starting at a multiple of ``n`` (one promotion
    interval) touches: n / 4 when 4 divides n, one or two more when a chunk can start or end inside a group (the
    starts repeat with period 4 n)."""
    return max((c + n - 1) // 4 - c // 4 + 1 for c in range(0, 4 * n, n))


def _exact_sparse_b_bytes(k, promote_every, positive) -> np.ndarray:
    """E4M3FN bytes allowed in B by the exact-accumulation sparse family (see exact_accumulation_sparse)."""
    all_vals = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    bmax = min(448.0, 2.0**23 / (3 * k))
    if promote_every is not None:
        bmax = min(bmax, np.floor((2.0**13 - 1) / (12 * _groups_per_chunk(promote_every))))
    ok = np.isfinite(all_vals) & (all_vals == np.round(all_vals)) & (np.abs(all_vals) <= bmax)
    if positive:
        ok &= all_vals > 0
    ok = np.flatnonzero(ok)
    if ok.size < 2:
        raise ValueError(f"k={k}, promote_every={promote_every}: no room for an exact-accumulation family")
    return ok


def exact_accumulation_sparse(m, n, k, *, promote_every=None, positive=False) -> st.SearchStrategy[tuple]:
    """(a_vals, a_meta, b_fp8) for the sparse workload whose every fp32 partial sum is exact in any order: B bytes
    are E4M3FN integers (|b| <= bmax) and A values lie on 2^-1 Z, so all partial sums lie on 2^-1 Z with magnitude
    <= 3 k bmax < 2^23 (each group of 4 columns adds at most |v0| + |v1| <= 12 times bmax). Sums need up to ~22
    bits: a 14-bit fp8 accumulator or a bf16 intermediate loses them, and the bf16 output rounding (ties included)
    is tested.

    ``promote_every=N`` (Hopper fp8 wgmma promoted to fp32 every N products): bmax is lowered so that every chunk
    of N products also sums exactly in the 14-bit e8m13 accumulator (|chunk| <= 12 bmax per group of 4 columns the
    chunk touches, N / 4 groups when 4 divides N and more when a chunk can cut a group, whose two values may then
    both lie in the chunk; < 2^13, on 2^-1 Z: 14 bits, and the block-FMA alignment to 2^(E - 13) >= 2^-1 keeps the
    grid), while a same-sign run over the first half of K (:func:`exact_accumulation_sparse_arrays`) takes every
    element's partial sums past 2^13 (>= 13312 at k = 2048; with N = 128 only from k = 512) with half-odd products
    still to come, so an UNpromoted accumulator drops bits. The output check catches that where the dropped bits
    change the rounded output: every seed tried at k >= 1024, some draws not at k = 512, and below that nothing
    forces it (docs/bounds.md). ``positive``: only positive values (no cancellation)."""
    _check_bools(positive=positive)
    for nm, v in (("m", m), ("n", n), ("k", k)):
        _check_int(nm, v, 1)
    if k % 4:
        raise InvalidArgument(f"k={k} must be a multiple of 4")
    if promote_every is not None:
        _check_int("promote_every", promote_every, 1)
    try:
        _exact_sparse_b_bytes(k, promote_every, positive)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None

    @st.composite
    def _draw(draw):
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        return exact_accumulation_sparse_arrays(rng, m, n, k, promote_every=promote_every, positive=positive,
                                                canonical=draw(st.booleans()))

    return _draw()


def exact_accumulation_sparse_arrays(rng, m, n, k, *, promote_every=None, positive=False, canonical=True) -> tuple:
    """The construction of :func:`exact_accumulation_sparse` with a numpy Generator (deterministic for a seed);
    ``canonical=False`` draws any meta byte.

    The first ``k // 2`` K-columns (``k // 8`` groups) are a same-sign run: row i of A holds v0 = 6 s_i and
    v1 in {0.5, 1.5, 3, 6} s_i there, row j of B magnitudes >= bmin (``_sparse_run_bmin``: 8 at k = 2048) with
    one sign t_j, so every output element's partial sums grow monotonically over the run, by 6.5 bmin or more per
    group, to at least ``_sparse_run_floor(k)`` (13312 = 1.6 * 2^13 at k = 2048, 12480 at k = 1024), while the
    half-odd products (0.5 b, 1.5 b, b odd) keep bits on the 2^-1 grid: an unpromoted 14-bit accumulator (ulp >= 1 above
    2^13) drops them. The rest is
    uniform over the allowed codes (cancellation, output ties). The 128-product chunk bound of ``promote_every``
    holds everywhere (the run uses the same B bytes, |v0| + |v1| <= 12).

    Args:
        rng: a ``np.random.Generator``. m, n: ints >= 0. k: an int >= 1, a multiple of 4. promote_every: None or an
            int >= 1.

    Returns:
        (a_vals, a_meta, b_fp8): uint8 arrays [m, k/4] (packed E2M1 pairs), [m, k/4] (2:4 metadata) and [n, k]
        (E4M3FN bytes).

    Raises:
        TypeError: ``rng`` not a Generator; ``m``, ``n``, ``k`` or ``promote_every`` not an int (a bool, 8.0).
        ValueError: ``m`` or ``n`` < 0, ``k`` < 1 or not a multiple of 4, ``promote_every`` < 1, or no room for the
            family at that ``k`` / ``promote_every``."""
    _check_arrays_args(rng, m, n, k, sparse=True, promote_every=promote_every, positive=positive,
                       canonical=canonical)
    ok = _exact_sparse_b_bytes(k, promote_every, positive)
    val_codes = [1, 2, 3, 4, 5, 6, 7] if positive else list(range(16))
    pair = np.array([lo | (hi << 4) for lo in val_codes for hi in val_codes], dtype=np.uint8)
    vals = pair[rng.integers(0, pair.size, (m, k // 4))]
    metas = np.array(CANONICAL_META if canonical else range(256), dtype=np.uint8)
    meta = metas[rng.integers(0, metas.size, (m, k // 4))]
    b = ok[rng.integers(0, ok.size, (n, k))].astype(np.uint8)
    g_run = _sparse_run_groups(k)
    if g_run:
        sign_a = (rng.integers(0, 2, (m, 1)) * 8 if not positive else np.zeros((m, 1), np.int64)).astype(np.uint8)
        hi = np.array([1, 3, 5, 7], np.uint8)[rng.integers(0, 4, (m, g_run))]
        vals[:, :g_run] = (7 | sign_a) | ((hi | sign_a) << 4)
        mags = ok[((ok & 0x80) == 0) & (_E4M3_VALUES[ok] >= _sparse_run_bmin(k, promote_every))]
        sign_b = (rng.integers(0, 2, (n, 1)) * 0x80 if not positive else np.zeros((n, 1), np.int64)).astype(np.uint8)
        b[:, :4 * g_run] = mags[rng.integers(0, mags.size, (n, 4 * g_run))].astype(np.uint8) | sign_b
    return vals, meta, b


def _sparse_run_groups(k) -> int:
    """Groups of 4 K-columns in the same-sign run of :func:`exact_accumulation_sparse_arrays`."""
    return k // 8


def _sparse_run_bmin(k, promote_every) -> float:
    """Smallest |b| in the run: the smallest allowed B value that takes the run's sum to 1.5 * 2^13 (8 at
    k = 2048, 15 at k = 1024 with promotion every 128), or the largest allowed one when none does."""
    vals = np.sort(_E4M3_VALUES[_exact_sparse_b_bytes(k, promote_every, True)])
    groups = _sparse_run_groups(k)
    need = 1.5 * 2.0**13 / (6.5 * groups) if groups else np.inf
    big = vals[vals >= need]
    return float(big[0] if big.size else vals[-1])


def _sparse_run_floor(k, promote_every=None) -> float:
    """A lower bound on |the run's sum| of every output element of :func:`exact_accumulation_sparse_arrays`."""
    return _sparse_run_groups(k) * (6 + 0.5) * _sparse_run_bmin(k, promote_every)


_E4M3_VALUES = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


class NVFP4Operand(NVFP4Tensor):
    """An :class:`fp4ref.blockscale.NVFP4Tensor` (so ``gemm.nvfp4_gemm`` and ``blockscale.nvfp4_dequantize``
    take it as it is) that also reads like the dict :func:`nvfp4_operands` used to yield: ``op["codes"]``,
    ``op["scales"]``, ``op["global_decode_scale"]`` (kept for existing tests; new code uses the attributes)."""

    _KEYS = ("codes", "scales", "global_decode_scale")

    def __getitem__(self, key):
        if key not in self._KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def keys(self):
        return self._KEYS


def nvfp4_operands(rows, k, *, allow_nan_scale=False, global_scale=None) -> st.SearchStrategy[NVFP4Operand]:
    """Raw NVFP4 operands [rows, k] quantized along K (axis 1, 16-element blocks), as :class:`NVFP4Operand`
    (an NVFP4Tensor with ``recipe="raw"``): ``codes`` uint8 [rows, k/2] packed, ``scales`` uint8 [rows, k/16]
    E4M3FN bytes, ``global_decode_scale`` float32; pass two of them to ``gemm.nvfp4_gemm(xq, wq)`` as they are.
    Block scale classes: zero blocks (scale 0x00), subnormal scales (0x01..0x07), typical, near-overflow
    (0x7E = 448); codes include E2M1 ties' neighbours and -0. NaN scale bytes only with ``allow_nan_scale``.
    ``global_scale``: a real scalar (a float or int, a numpy scalar, a 0-d or one-element array or tensor), rounded
    to float32 once and finite and > 0 there, as the quantizers' global decode scale must be; or None to draw one
    (powers of two and odd float32s).

    Raises:
        InvalidArgument: (when built) ``rows`` or ``k`` not an int, ``rows`` < 1, ``k`` not a positive multiple of
            16; ``global_scale`` not a real number (a bool, a str) or not finite and > 0 as float32 (0, -1, NaN,
            inf, 1e-50, 1e39); ``allow_nan_scale`` not a bool.
    """
    _check_bools(allow_nan_scale=allow_nan_scale)
    _check_int("rows", rows, 1)
    _check_int("k", k, 16)
    if k % 16:
        raise InvalidArgument(f"k={k} must be a multiple of 16")
    if global_scale is not None:
        try:  # the rule of fp4ref.blockscale's global decode scale (fp4ref._validate.global_scale_float32)
            global_scale = global_scale_float32(global_scale, "global_scale")
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(str(exc)) from None
    scale_choices = [0x00] * 4 + list(range(0x01, 0x08)) + list(range(0x08, 0x7E)) + [0x7E] * 8
    if allow_nan_scale:
        scale_choices += [0x7F] * 2

    @st.composite
    def _draw(draw):
        codes = draw(packed_fp4((rows, k // 2)))
        scales = draw(_array_from_choices((rows, k // 16), scale_choices))
        if global_scale is None:
            g = draw(st.sampled_from([1.0, 2.0**-8, 2.0**6]) | st.floats(2.0**-20, 2.0**10, width=32))
        else:
            g = global_scale
        return NVFP4Operand(codes=codes, scales=scales, global_decode_scale=np.float32(g), shape=(rows, k),
                            recipe="raw", block=(1, 16), axis=1)

    return _draw()


def nvfp4_inputs(rows, k) -> st.SearchStrategy[np.ndarray]:
    """bf16 activations [rows, k] (k a multiple of 16) that stress an NVFP4 quantizer: per block one of randn,
    all zeros, E2M1 ties (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 times the block scale, with a 6 to pin the scale),
    tiny blocks (block scale an E4M3 subnormal), large blocks, -0.0, and one planted tensor amax of 2688."""
    _check_int("rows", rows, 1)
    _check_int("k", k, 16)
    if k % 16:
        raise InvalidArgument(f"k={k} must be a multiple of 16")

    @st.composite
    def _draw(draw):
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        x = rng.standard_normal((rows, k // 16, 16))
        kind = rng.integers(0, 6, size=(rows, k // 16))
        x[kind == 0] = 0.0
        ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
        sel = kind == 1
        x[sel] = rng.choice(ties, size=(int(sel.sum()), 16)) * rng.choice([-1.0, 1.0], size=(int(sel.sum()), 16))
        x[sel, 0] = 6.0
        x[kind == 2] *= 2.0**-7
        x[kind == 3] *= 2.0**6
        x[kind == 4] = -0.0
        if draw(st.booleans()):
            x.reshape(-1)[0] = 2688.0
        return x.reshape(rows, k).astype(np.float32).astype(ml_dtypes.bfloat16)

    return _draw()


def mx_operands(rows, k, *, elem="e2m1", block=32, allow_nan_scale=False) -> st.SearchStrategy[dict]:
    """Raw MX operands: {"codes": uint8 [rows, k] element codes (e2m1: packed, [rows, k/2]), "scales": uint8
    [rows, k/block] UE8M0 bytes, "elem": the canonical name (:data:`fp4ref.blockscale.MX_ELEMENTS`; ``elem`` may
    be any case, "e4m3" for "e4m3fn")}. Scale bytes cover 0 (2^-127, an fp32 subnormal), small, 127 (1.0),
    large and 254 (2^127); 255 (NaN) only with ``allow_nan_scale``. Element codes: every code of the element format
    (E4M3FN NaN codes excluded).

    Raises:
        InvalidArgument: (when built) ``rows``, ``k`` or ``block`` not an int >= 1; ``k`` not a multiple of
            ``block``; an odd ``k`` for e2m1 (two codes per packed byte); an unknown ``elem``.
    """
    _check_bools(allow_nan_scale=allow_nan_scale)
    _check_int("rows", rows, 1)
    _check_int("k", k, 1)
    _check_int("block", block, 1)
    widths = {"e2m1": 4, "e2m3": 6, "e3m2": 6, "e4m3fn": 8, "e5m2": 8}
    try:
        elem = _mx_element(elem)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(str(exc)) from None
    if k % block:
        raise InvalidArgument(f"k={k} must be a multiple of block={block}")
    if elem == "e2m1" and k % 2:
        raise InvalidArgument(f"k={k} must be even for elem='e2m1' (codes are packed two per byte, [rows, k/2])")
    scale_choices = [0, 1, 2, 100, 120, 126, 127, 128, 134, 200, 253, 254] + list(range(256 - 1))
    if allow_nan_scale:
        scale_choices += [255] * 4

    @st.composite
    def _draw(draw):
        if elem == "e2m1":
            codes = draw(packed_fp4((rows, k // 2)))
        elif elem == "e4m3fn":
            codes = draw(e4m3_bytes((rows, k)))
        else:
            codes = draw(_array_from_choices((rows, k), range(1 << widths[elem]) if elem != "e5m2" else
                                             [c for c in range(256) if (c & 0x7F) < 0x7C]))
        scales = draw(_array_from_choices((rows, k // block), scale_choices))
        return {"codes": codes, "scales": scales, "elem": elem}

    return _draw()
