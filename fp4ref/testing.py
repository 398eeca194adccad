"""Assertions for kernel authors: the K-aware check, and the public benchmarks' own checkers for comparison.

* :func:`assert_gemm_close` — :func:`fp4ref.bounds.check` + ``Report.assert_ok()``: every element within the
  rigorous bound of the declared accumulation model, NaN/Inf patterns equal, nothing unwritten; with
  ``exact_accumulation=True`` every element equal to the correctly rounded output.
* :func:`fib_allclose` — FlashInfer-Bench's checker (its gemm definitions' correctness rule; docs/verify.md): any
  NaN/Inf in the output fails; otherwise an element fails iff, in float32, |o - r| > atol AND
  |o - r| / (|r| + 1e-8) > rtol, atol = rtol = 1e-2 (a NaN error fails neither test).
* :func:`sol_allclose` — SOL-ExecBench's checker (nvfp4_linear_layer's tolerance; docs/verify.md): any NaN/Inf in
  the output or the reference fails, and so does an all-zero output; otherwise an element matches iff, in float32,
  |o - r| <= 0.005 + 0.02 |r|, and the output passes when at least 99% of the elements match.

The last two are K-independent and loose; they are here so a report can say what the public suites would have
concluded on the same output (docs/testing.md lists bugs they let through).

Arguments may be numpy arrays, ml_dtypes arrays or torch tensors (converted without importing torch).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ._interop import to_numpy
from ._validate import is_real
from .bounds import DEFAULT_MODEL, Report, check
from .gemm import Reference

__all__ = ["assert_gemm_close", "fib_allclose", "sol_allclose", "AllcloseResult", "check", "Report"]


def assert_gemm_close(out, ref: Reference, model=DEFAULT_MODEL, *, output_rounding: str = "rne", poison=None,
                      exact_accumulation: bool = False, epilogue_multiplies: int | None = None) -> Report:
    """Assert that a kernel output is within the K-aware bound of ``model`` around ``ref``.

    Args:
        out: kernel output (numpy / torch), shape and dtype of ``ref.out``.
        ref: :class:`fp4ref.gemm.Reference` of the same inputs.
        model: accumulation model name (e.g. the kernel module's ``NUMERIC_MODEL``) or AccumulationModel.
        output_rounding: "rne", or "faithful" under the Triton CPU interpreter (its bf16 stores truncate).
        poison: the value the output buffer was pre-filled with (e.g. ``float("nan")``), to detect unwritten
            elements; None skips that check.
        exact_accumulation: inputs from an exact-accumulation family: demand equality with the correctly
            rounded output.
        epilogue_multiplies: override the count of fp32 epilogue multiplies.

    Returns:
        The :class:`fp4ref.bounds.Report` (so a test can also look at SQNR, ulps, ...).

    Raises:
        AssertionError: with a numpy.testing-style message (rule, counts, first offenders, bound terms).
        TypeError / ValueError: as :func:`fp4ref.bounds.check`.
    """
    __tracebackhide__ = True
    report = check(out, ref, model, output_rounding=output_rounding, poison=poison,
                   exact_accumulation=exact_accumulation, epilogue_multiplies=epilogue_multiplies)
    report.assert_ok()
    return report


@dataclass(frozen=True)
class AllcloseResult:
    """Verdict of a public checker. Truthy when it passes.

    Attributes:
        ok: the checker's verdict.
        checker: "flashinfer-bench" or "sol-execbench".
        n_fail: elements that fail the element test (NaN/Inf counted as failures).
        matched_fraction: fraction of elements that pass the element test.
        max_abs_err: max |o - r| over finite pairs.
        n_nonfinite_out: NaN/Inf elements in the output.
        reason: why it fails ("" when it passes): "dtype" (the output's is not the reference's), "non-finite" (a
            NaN/Inf the benchmark refuses outright), "all-zero output" (SOL-ExecBench) or "tolerance" (elements
            beyond it: every one for FlashInfer-Bench, more than ``1 - required`` for SOL-ExecBench).
    """

    ok: bool
    checker: str
    n_fail: int
    matched_fraction: float
    max_abs_err: float
    n_nonfinite_out: int
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def _ml_float(dtype) -> bool:
    """Whether ``dtype`` is one of ml_dtypes' floating types (bfloat16, float8_*, float6_*, float4_*)."""
    try:
        ml_dtypes.finfo(dtype)
    except (TypeError, ValueError):
        return False
    return dtype.kind == "V"


def _pair(out, ref):
    """(out, ref, same_dtype): out and ref as float64 arrays of one shape (ref may be a Reference: its correctly
    rounded ``out``), and whether their own dtypes agree. float64 is exact for every floating dtype, so a float32
    cast of these is the benchmarks' ``.to(torch.float32)`` of the originals (exact, or one RNE from float64)."""
    if isinstance(ref, Reference):
        ref = ref.out
    o = to_numpy(out, "out")
    r = to_numpy(ref, "ref")
    o = np.asarray(o)
    r = np.asarray(r)
    for name, a in (("out", o), ("ref", r)):
        if a.dtype.kind != "f" and not _ml_float(a.dtype):
            raise TypeError(f"{name} must be a floating array (numpy or ml_dtypes: bfloat16, float8_*, ...), got "
                            f"dtype {a.dtype}")
    if o.shape != r.shape:
        raise ValueError(f"out has shape {o.shape}, ref {r.shape}")
    return o.astype(np.float64), r.astype(np.float64), o.dtype == r.dtype


def _float32(*arrays) -> list:
    """float64 ``arrays`` cast to float32 (RNE; beyond float32's range inf, as torch's cast gives)."""
    with np.errstate(over="ignore"):
        return [a.astype(np.float32) for a in arrays]


def _tolerance(v, name: str, upper: float | None = None) -> float:
    """A checker's tolerance ``v`` as a float: a real number (not a bool), finite, >= 0 (and <= ``upper``).

    A NaN tolerance would pass every element (every comparison with NaN is False), a negative one fail them all."""
    if not is_real(v):
        raise TypeError(f"{name}={v!r}: expected a real number, got {type(v).__name__}")
    try:
        f = float(v)
    except OverflowError:  # a Python int beyond float64
        f = math.inf
    if not (math.isfinite(f) and f >= 0 and (upper is None or f <= upper)):
        bound = f"in [0, {upper:g}]" if upper is not None else "finite and >= 0"
        raise ValueError(f"{name}={v!r}: expected a real number {bound}")
    return f


def fib_allclose(out, ref, *, atol: float = 1e-2, rtol: float = 1e-2) -> AllcloseResult:
    """FlashInfer-Bench's correctness rule (docs/verify.md), as its default evaluator applies it
    (flashinfer_bench/bench/evaluators/default.py, bench/utils.py ``compute_error_stats``).

    An output whose dtype is not the reference's fails (INCORRECT_DTYPE), and so does one holding any NaN/Inf in
    its own dtype. Otherwise both are converted to float32 and an element fails iff
    |o - r| > atol AND |o - r| / (|r| + 1e-8) > rtol, in float32 arithmetic with float32 tolerances; every
    comparison with NaN is false, so an element whose reference is inf or NaN passes with any finite output (its
    relative error is inf / inf or NaN). ``n_fail`` counts the failing elements and the non-finite outputs.
    ``ref`` is an array or a :class:`Reference` (its correctly rounded ``out``).

    Raises:
        TypeError: ``out`` / ``ref`` not floating arrays, a tolerance not a real number (a bool is not).
        ValueError: shapes differ; ``atol`` or ``rtol`` NaN, infinite or negative.
    """
    atol, rtol = _tolerance(atol, "atol"), _tolerance(rtol, "rtol")
    o64, r64, same_dtype = _pair(out, ref)
    nonfinite = ~np.isfinite(o64)  # (checked before the float32 cast, as FlashInfer-Bench does)
    o, r = _float32(o64, r64)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(o - r)
        rel = d / (np.abs(r) + np.float32(1e-8))
        fail = nonfinite | ((d > np.float32(atol)) & (rel > np.float32(rtol)))
    n_fail = int(fail.sum())
    reason = "dtype" if not same_dtype else "non-finite" if nonfinite.any() else "tolerance" if n_fail else ""
    return AllcloseResult(
        ok=not reason,
        checker="flashinfer-bench",
        n_fail=n_fail,
        matched_fraction=1.0 - n_fail / max(o.size, 1),
        max_abs_err=float(np.max(d[np.isfinite(d)])) if np.any(np.isfinite(d)) else 0.0,
        n_nonfinite_out=int(nonfinite.sum()),
        reason=reason,
    )


def _norm_nonzero(a: np.ndarray) -> bool:
    """Whether torch.linalg.vector_norm of float32 ``a`` is non-zero: its float32 sum of squares (a square that
    underflows is 0), except for one element, whose norm is |x| (no square)."""
    return bool(a.reshape(()) != 0) if a.size == 1 else bool(np.any(np.square(a) > 0))


def sol_allclose(out, ref, *, atol: float = 0.005, rtol: float = 0.02, required: float = 0.99) -> AllcloseResult:
    """SOL-ExecBench's correctness rule (docs/verify.md), as its evaluator applies it (NVIDIA/SOL-ExecBench
    src/sol_execbench/core/bench/correctness.py ``check_tensor_sanity`` and ``compute_error_stats``, 2026-04).

    An output whose dtype is not the reference's fails (INCORRECT_DTYPE). Both are converted to float32; the
    output fails if either holds a NaN or inf (even where both hold the same inf), or if its norm is 0 while the
    reference's is not (torch.linalg.vector_norm in float32: the sum of squares, or |x| for one element).
    Otherwise an element matches iff |o - r| <= atol + rtol * |r| in float32 arithmetic with float32 tolerances
    (a non-finite |o - r| never matches), and the output passes when at least ``required`` (99%) of the elements
    match. (Its optional per-workload ``max_error_cap`` and ``allow_negative_inf`` are not modelled.)

    Raises:
        TypeError: ``out`` / ``ref`` not floating arrays, a tolerance or ``required`` not a real number (a bool is
            not). ValueError: shapes differ; ``atol`` or ``rtol`` NaN, infinite or negative; ``required`` outside
            [0, 1].
    """
    atol, rtol = _tolerance(atol, "atol"), _tolerance(rtol, "rtol")
    required = _tolerance(required, "required", upper=1.0)
    o64, r64, same_dtype = _pair(out, ref)
    o, r = _float32(o64, r64)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        d = np.abs(o - r)
        match = (d <= np.float32(atol) + np.float32(rtol) * np.abs(r)) & np.isfinite(d)
        insane = not (np.isfinite(o).all() and np.isfinite(r).all())  # (check_tensor_sanity)
        zero_out = _norm_nonzero(r) and not _norm_nonzero(o)
    frac = 1.0 - float((~match).sum()) / max(o.size, 1)  # (its order: 1 - exceeding / total)
    reason = ("dtype" if not same_dtype else "non-finite" if insane else "all-zero output" if zero_out
              else "tolerance" if frac < required else "")
    return AllcloseResult(
        ok=not reason,
        reason=reason,
        checker="sol-execbench",
        n_fail=int((~match).sum()),
        matched_fraction=frac,
        max_abs_err=float(np.max(d[np.isfinite(d)])) if np.any(np.isfinite(d)) else 0.0,
        n_nonfinite_out=int((~np.isfinite(o)).sum()),
    )
