"""Exact reference GEMMs with certified, correctly rounded outputs.

One function per workload (docs/verify.md, "Workloads"), with the workload's own operands and dtypes:

=========================  ============================================================  ===========
function                   operands                                                      output
=========================  ============================================================  ===========
``gemm_fp16``              A fp16 [M, K], B fp16 [N, K]; C = A @ B.T                     fp16 [M, N]
``sparse_gemm_fp4_fp8``    a_vals, a_meta uint8/int8 [M, K/4] (2:4 E2M1), b E4M3FN [N, K]  bf16 [M, N]
``nvfp4_gemm``             two NVFP4 operands [M, K], [N, K] (16-element blocks)         bf16 [M, N]
``nvfp4_linear``           x bf16 [..., K], NVFP4 weight [N, K]; x quantized per recipe  bf16 [..., N]
=========================  ============================================================  ===========

Every function returns a :class:`Reference`: the exact result, its ONE round-to-nearest-even step to the output
format (``out``), |A||B| for the error bounds (``absprod``), K and a description of the inputs.

How exactness is obtained (docs/bounds.md):

* If every product lies on 2^-q Z and the sum of the magnitudes is <= 2^(53-q), every float64 summation order is
  exact, so a float64 matmul (any BLAS blocking, with or without FMA) IS the exact sum. This holds for the sparse
  workload (E2M1 x E4M3FN: q = 10, exact up to K ~ 6e9).
* fp16 x fp16 (40 bits of exponent range per operand): the same proof is tried per element from the data (grid
  2^-q of each operand from its smallest nonzero magnitude, Cauchy-Schwarz ||a_i|| ||b_j|| >= sum |a||b|); where it
  fails, the float64 matmul S carries an error bound e = (K + 4) * 2^-52 * ||a_i||_2 * ||b_j||_2 (Higham §3.1:
  |S - C| <= gamma_K |a|.|b| <= gamma_K ||a|| ||b||, doubled for the rounding of the norms) and the output is
  certified element by element: if RN(S - e) and RN(S + e) agree (value and sign), RN is monotone, so that is
  RN(C). The other elements (output ties, heavy cancellation) are recomputed exactly (integer limbs in float64,
  combined in python ints) and rounded exactly.
* NVFP4: operands as integers (2 e2m1 * 2^9 ue4m3), an exact integer matmul (one float64 matmul when
  Cauchy-Schwarz proves it exact, else two 11-bit limbs), then the global scales by a certified float64 product
  (float64 alone is not exact for NVFP4 beyond K ~ 1190).
* The rounding itself is this module's own RNE from float64 (``round_float64``): frexp/ldexp/rint, all exact,
  so never a double rounding, whatever a library's own float64 cast does (a cast through float32 would
  double-round: 1 + 2^-8 + 2^-40 -> float32 1 + 2^-8, a bf16 tie -> 1.0 instead of 1 + 2^-7).

Policies (named, documented, tested):

* **Zero sign**: an exact sum of 0 gives +0.0 (an fp32 accumulator starting at +0 gives +0 for any sum of zeros);
  a nonzero exact sum that rounds to zero keeps its sign (IEEE).
* **Overflow**: RNE with IEEE overflow: |C| >= max + ulp(max)/2 gives +-inf (bf16 3.3961776e38, fp16 65520).
* **NaN / Inf inputs**: IEEE arithmetic on the products that the semantics actually form: fp16 inf * 0 = NaN,
  inf + -inf = NaN, otherwise +-inf. In the sparse workload only the B columns selected by the metadata enter
  (an E4M3FN NaN byte 0x7F/0xFF in an unselected column does not poison the row; a selected one does, even
  times a zero value).

Torch tensors are accepted at the edges (converted bit for bit by :mod:`fp4ref._interop`; torch is not imported).
"""
from __future__ import annotations

import math
from functools import lru_cache
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

import ml_dtypes
import numpy as np

from ._interop import to_numpy
from ._validate import exact_float_dtype, global_scale_float32, is_int
from .packing import decompress_2to4

__all__ = [
    "Reference",
    "OutputFormat",
    "OUTPUT_FORMATS",
    "round_float64",
    "round_exact",
    "gemm_fp16",
    "sparse_gemm_fp4_fp8",
    "nvfp4_gemm",
    "nvfp4_linear",
]


# --------------------------------------------------------------------------------------------------------------
# Output formats and exact rounding
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputFormat:
    """A binary floating output format, for exact RNE rounding.

    Attributes:
        name: numpy / ml_dtypes dtype name ("bfloat16", "float16", "float32").
        p: significand precision in bits, hidden bit included (bf16 8, fp16 11, fp32 24).
        emin: exponent of the smallest normal (bf16 -126, fp16 -14, fp32 -126).
        emax: exponent of the largest finite value (bf16 127, fp16 15, fp32 127).
        dtype: the numpy dtype.
    """

    name: str
    p: int
    emin: int
    emax: int
    dtype: Any = field(compare=False)

    @property
    def max(self) -> float:
        """Largest finite value, (2 - 2^(1-p)) * 2^emax (bf16 0x1.fep127, fp16 65504)."""
        return math.ldexp(2.0 - math.ldexp(1.0, 1 - self.p), self.emax)

    @property
    def u(self) -> float:
        """Unit roundoff of RNE, 2^-p (bf16 2^-8, fp16 2^-11, fp32 2^-24)."""
        return math.ldexp(1.0, -self.p)

    @property
    def eta(self) -> float:
        """Half the smallest subnormal, 2^(emin - p) (bf16 2^-134, fp16 2^-25): the absolute error floor."""
        return math.ldexp(1.0, self.emin - self.p)

    def ulp(self, x) -> np.ndarray:
        """ulp of the format at |x| (float64 array): 2^(max(floor(log2|x|), emin) - p + 1), from the bits."""
        x = np.asarray(x, dtype=np.float64)
        _, e = np.frexp(np.where(np.isfinite(x), x, self.max))
        return np.ldexp(1.0, np.maximum(e - 1, self.emin) - (self.p - 1))


OUTPUT_FORMATS = {
    "bfloat16": OutputFormat("bfloat16", 8, -126, 127, ml_dtypes.bfloat16),
    "float16": OutputFormat("float16", 11, -14, 15, np.float16),
    "float32": OutputFormat("float32", 24, -126, 127, np.float32),
}


def _get_format(fmt) -> OutputFormat:
    if isinstance(fmt, OutputFormat):
        return fmt
    name = np.dtype(fmt).name if not isinstance(fmt, str) else fmt
    if name not in OUTPUT_FORMATS:
        raise ValueError(f"output format {fmt!r} is not supported; expected one of {sorted(OUTPUT_FORMATS)}")
    return OUTPUT_FORMATS[name]


def round_float64(x, fmt) -> np.ndarray:
    """Round float64 values to ``fmt`` with ONE round-to-nearest-even step; return float64 values of ``fmt``.

    Args:
        x: float64 array (any shape); NaN and +-inf pass through.
        fmt: "bfloat16", "float16", "float32" or an :class:`OutputFormat`.

    Returns:
        float64 array, same shape, each value exactly representable in ``fmt``: RNE with gradual underflow and
        IEEE overflow (|x| >= max + ulp(max)/2 -> +-inf). Exact: frexp, ldexp and rint are exact operations.

    Raises:
        TypeError: ``x`` not of a floating dtype (an integer, bool, str or object array is not converted: an int
            beyond 2^53 would be rounded once on the way in; :func:`round_exact` rounds exact integers).
        ValueError: ``fmt`` not one of the output formats.

    Source: IEEE 754-2019 §4.3.1 (roundTiesToEven), §7.4 (overflow).
    """
    f = _get_format(fmt)
    a = np.asarray(x)
    if not exact_float_dtype(a.dtype):
        raise TypeError(f"x must be a floating array (its values held exactly in float64), got dtype {a.dtype}")
    x = a.astype(np.float64)
    _, e = np.frexp(x)
    q = np.maximum(e - 1, f.emin) - (f.p - 1)  # exponent of the format's ulp at x
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.ldexp(np.rint(np.ldexp(x, -q)), q)
        y = np.where(np.abs(y) > f.max, np.copysign(np.inf, x), y)
    return y


def round_exact(n: int, s: int, fmt) -> float:
    """Round the exact value n * 2^s (python ints) to ``fmt`` with RNE; return a python float.

    Zero (n == 0) gives +0.0; a nonzero value that rounds to zero keeps its sign. Overflow gives +-inf.

    Raises:
        TypeError: ``n`` or ``s`` not an int (numpy integers are; bools and floats are not). ValueError: ``fmt``
            not one of the output formats.
    """
    for name, v in (("n", n), ("s", s)):
        if not is_int(v):
            raise TypeError(f"{name}={v!r}: expected an int (the value is n * 2**s, exact), got {type(v).__name__}")
    n, s = int(n), int(s)
    f = _get_format(fmt)
    if n == 0:
        return 0.0
    sign = -1.0 if n < 0 else 1.0
    m = abs(n)
    top = m.bit_length() - 1 + s  # exponent of the leading bit
    q = max(top, f.emin) - (f.p - 1)
    shift = q - s
    if shift <= 0:
        r, rq = m, s
    else:
        r = m >> shift
        rem = m - (r << shift)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and (r & 1)):
            r += 1
        rq = q
    if r == 0:
        return math.copysign(0.0, sign)
    if r.bit_length() + rq - 1 > f.emax:
        return sign * math.inf
    val = math.ldexp(r, rq)
    if val > f.max:
        return sign * math.inf
    return sign * val


# --------------------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Reference:
    """The exact result of a reference GEMM and its correctly rounded output.

    Attributes:
        out: the correctly rounded output, dtype of the workload (bfloat16 / float16), shape [M, N] (or the
            workload's shape). One RNE step from the exact value; zero policy and overflow as in the module doc.
        exact: float64 array, shape of ``out``: the exact result where ``exact_err`` is 0, else a float64
            value within ``exact_err`` of it. NaN / +-inf where the IEEE semantics give them.
        exact_err: float64 array (or 0.0): a rigorous bound on |exact - true exact value| per element. 0.0 means
            ``exact`` is exact everywhere (``is_exact``).
        K: the reduction length (for the sparse workload: the dense K, 4 * a_vals.shape[1]).
        output_format: the :class:`OutputFormat` of ``out``.
        description: dict naming the workload, shapes, dtypes and recipe.
        epilogue_multiplies: fp32 multiplies that a kernel is expected to apply to the accumulator (global scales);
            the bound adds 2^-24 |exact| for each (docs/bounds.md, "The bound").
        epilogue_scale: the exact product G of the global scales that a kernel applies to the accumulator as ONE
            fp32 scalar, fp32(G) (the NVFP4 epilogue ``acc * fp32(x_gdec * w_gdec)``), or None (no such scalar).
            Where fp32(G) is subnormal or 0 the bound adds the error that carries into the output (docs/bounds.md).
    """

    out: np.ndarray
    exact: np.ndarray
    exact_err: Any
    K: int
    output_format: OutputFormat
    description: dict
    epilogue_multiplies: int = 0
    epilogue_scale: float | None = None
    _absprod_fn: Callable[[], np.ndarray] | None = field(default=None, repr=False)
    _fraction_fn: Callable[[tuple], Fraction] | None = field(default=None, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def is_exact(self) -> bool:
        """True when ``exact`` holds the exact result in every element."""
        return bool(np.all(np.asarray(self.exact_err) == 0))

    @property
    def absprod(self) -> np.ndarray:
        """|A||B| (float64, shape of ``out``): sum over k of |a_ik| |b_jk| (times the global scales for NVFP4).

        Computed on first use (one more float64 matmul) and cached. Exact under the same conditions as
        ``exact``; otherwise within a relative gamma_K (far below any accumulation bound it scales).
        """
        if "absprod" not in self._cache:
            self._cache["absprod"] = self._absprod_fn()
        return self._cache["absprod"]

    @property
    def shape(self) -> tuple:
        return self.out.shape

    def _element_index(self, index) -> tuple:
        """``index`` checked as one element's index of ``out``, as a tuple of non-negative Python ints."""
        shape = self.out.shape
        want = f"a tuple of {len(shape)} int(s) (one element of shape {shape})"
        if is_int(index) and len(shape) == 1:  # a 1-D output is indexed by an int, as numpy does
            index = (index,)
        if not isinstance(index, tuple):
            raise TypeError(f"index={index!r}: expected {want}, got {type(index).__name__}")
        if len(index) != len(shape):
            raise ValueError(f"index={index!r} has {len(index)} entries; expected {want}")
        for i in index:
            if not is_int(i):  # 1.7 is not truncated to 1, and True is not 1
                raise TypeError(f"index={index!r}: expected {want}, got an entry {i!r} of type {type(i).__name__}")
        if not all(-n <= i < n for i, n in zip(index, shape)):  # negative entries count from the end, as in numpy
            raise IndexError(f"index={index!r} is out of range for shape {shape}")
        return tuple(int(i) % n for i, n in zip(index, shape))

    def exact_fraction(self, index) -> Fraction:
        """The exact value of one element as a ``fractions.Fraction`` (integer arithmetic).

        Args:
            index: the element, a tuple of ``out.ndim`` Python or numpy ints (an int alone for a 1-D ``out``);
                negative entries count from the end, as in numpy.

        Raises:
            TypeError: ``index`` is not a tuple, or an entry is not an int (1.7 and True are refused, not read as
                1). ValueError: a tuple of another length than ``out.ndim``; the element is NaN or +-inf.
            IndexError: an entry is out of range for ``out.shape`` (the message gives the index and the shape).
        """
        index = self._element_index(index)
        v = self.exact[index]
        if not np.isfinite(v):
            raise ValueError(f"element {index} is {v}: not a finite rational")
        if np.asarray(self.exact_err).ndim == 0 and float(self.exact_err) == 0.0:
            return Fraction(float(v))
        return self._fraction_fn(index)


# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------


def _check_2d(x, name: str, dtype_names: tuple[str, ...]) -> np.ndarray:
    x = to_numpy(x, name)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or torch tensor, got {type(x).__name__}")
    if x.dtype.name not in dtype_names:
        raise TypeError(f"{name} must have dtype {' or '.join(dtype_names)}, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {x.shape}")
    return x


def _certify(S: np.ndarray, err: np.ndarray, fmt: OutputFormat, exact_many):
    """Certified RNE of values known only as S +- err; undecided elements are computed exactly.

    ``exact_many(ii, jj)`` returns (list of python ints n, shared exponent s): the exact values n * 2^s of the
    elements (ii[u], jj[u]). Returns (out float64 values of fmt, number of elements computed exactly).

    Fast path (all exact operations): S in units of its ulp in ``fmt``, t = S * 2^-q, r = rint(t); when
    |t - r| + err * 2^-q < 1/2 the whole interval lies inside r's rounding interval, so RN(C) = r * 2^q. Elements
    where that cannot be trusted (r at the bottom of a binade, where the gap below is half as wide; r = 0, whose
    sign the interval may not decide) go to the two-sided test RN(S - err) == RN(S + err) (RN is monotone), and the
    rest to the exact path.
    """
    finite = np.isfinite(S)
    with np.errstate(invalid="ignore", over="ignore"):
        _, e = np.frexp(S)
        q = np.maximum(e - 1, fmt.emin) - (fmt.p - 1)
        t = np.ldexp(S, -q)
        r = np.rint(t)
        slack = np.abs(t - r) + np.ldexp(err, -q)  # exact difference; one rounding in the sum
        out = np.ldexp(r, q)
        out = np.where(np.abs(out) > fmt.max, np.copysign(np.inf, S), out)
        easy = finite & ((err == 0) | ((slack < 0.5 - 2.0**-40) & (r != 0) & (np.abs(r) != 2.0 ** (fmt.p - 1))))
    out = np.where(finite, out, S)
    out = np.where(finite & (S == 0) & (err == 0), 0.0, out)  # exact zero -> +0.0
    hard_i, hard_j = np.nonzero(~easy & finite)
    n_exact = 0
    if hard_i.size:
        Sh, eh = S[hard_i, hard_j], err[hard_i, hard_j]
        lo = np.nextafter(Sh - eh, -np.inf)
        hi = np.nextafter(Sh + eh, np.inf)
        r_lo = round_float64(lo, fmt)
        r_hi = round_float64(hi, fmt)
        und = (r_lo != r_hi) | (np.signbit(r_lo) != np.signbit(r_hi))
        out[hard_i[~und], hard_j[~und]] = r_lo[~und]
        ii, jj = hard_i[und], hard_j[und]
        if ii.size:
            ns, sexp = exact_many(ii, jj)
            out[ii, jj] = [round_exact(n, sexp, fmt) for n in ns]
        n_exact = int(ii.size)
    return out, n_exact


def _fp16_grid_exponent(x: np.ndarray):
    """A q with every finite value of the float16 array x on 2^-q Z (None if x has no finite nonzero value).

    From the smallest nonzero magnitude 2^E <= m: an fp16 value >= 2^E has its last bit at >= 2^(E-10), and every
    fp16 value is a multiple of 2^-24, so q = min(24, 10 - E). (Coarser than the exact grid by up to 10 bits, but
    one cheap integer reduction over the fp16 bit patterns: magnitude order = bit-pattern order.)
    """
    if x.size == 0:
        return None
    mb = np.ascontiguousarray(x).view(np.uint16) & np.uint16(0x7FFF)
    mb -= np.uint16(1)  # wraps +-0 to 0xFFFF: the min is then the smallest nonzero magnitude (inf/NaN sort above)
    m = int(mb.min()) + 1
    if m >= 0x7C00:  # no finite nonzero value
        return None
    E = math.frexp(float(np.array([m], np.uint16).view(np.float16)[0]))[1] - 1
    return min(24, 10 - E)


def _exact_dots_fp16(Af: np.ndarray, Bf: np.ndarray, ii: np.ndarray, jj: np.ndarray) -> list:
    """Exact sum_k A[i,k] B[j,k] * 2^48 (python ints) for the pairs (ii[u], jj[u]); fp16 values (finite).

    Vectorized integer arithmetic on float64 limbs: A * 2^24 is an integer below 2^40, split as H * 2^20 + L with
    0 <= L < 2^20 and |H| <= 2^20; every limb product is below 2^40 and a sum of <= 4096 of them below 2^52, so each
    chunk's float64 einsum is exact; the chunk sums (integers < 2^52) are added in int64 and the limbs combined
    in python ints.
    """
    K = Af.shape[1]
    out = []
    batch = max(1, (1 << 22) // max(K, 1))
    for u0 in range(0, ii.size, batch):
        ia, jb = ii[u0:u0 + batch], jj[u0:u0 + batch]
        a = np.ldexp(Af[ia], 24)
        b = np.ldexp(Bf[jb], 24)
        ah = np.floor(np.ldexp(a, -20))
        al = a - np.ldexp(ah, 20)
        bh = np.floor(np.ldexp(b, -20))
        bl = b - np.ldexp(bh, 20)
        sums = {}
        for name, x, y in (("hh", ah, bh), ("hl", ah, bl), ("lh", al, bh), ("ll", al, bl)):
            tot = np.zeros(ia.size, dtype=np.int64)
            for k0 in range(0, K, 4096):
                tot += np.einsum("uk,uk->u", x[:, k0:k0 + 4096], y[:, k0:k0 + 4096]).astype(np.int64)
            sums[name] = tot.tolist()
        for u in range(ia.size):
            out.append((sums["hh"][u] << 40) + ((sums["hl"][u] + sums["lh"][u]) << 20) + sums["ll"][u])
    return out


def _nonfinite_fix(S, Af, Bf, rows, cols):
    """IEEE sums for the elements whose row of A or column of B holds a non-finite value."""
    S = S.copy()
    if rows.size == 0 and cols.size == 0:
        return S
    with np.errstate(invalid="ignore", over="ignore"):
        for i in rows:
            S[i, :] = np.sum(Af[i][None, :] * Bf, axis=1)
        for j in cols:
            S[:, j] = np.sum(Af * Bf[j][None, :], axis=1)
    return S


# --------------------------------------------------------------------------------------------------------------
# gemm_fp16
# --------------------------------------------------------------------------------------------------------------


def gemm_fp16(A, B) -> Reference:
    """Reference for the gemm_n3072_k2048 workload: C = A @ B.T in fp16, correctly rounded (RNE, once).

    Args:
        A: float16 array (or torch tensor) [M, K].
        B: float16 array (or torch tensor) [N, K].

    Returns:
        :class:`Reference` with ``out`` float16 [M, N]. ``exact`` is the float64 matmul (products exact, sum
        within ``exact_err`` = (K + 4) 2^-52 ||a_i|| ||b_j|| of the exact sum); ``out`` is certified, with an
        exact integer recomputation of any element the float64 bound cannot decide. ``exact_fraction`` gives any
        element exactly.

    Raises:
        TypeError: A or B is not float16.
        ValueError: not 2-D, or K differs (message gives both shapes).

    Source: FlashInfer-Bench gemm_n3072_k2048 (docs/verify.md; C = A @ B.T, fp16 in and out); the
    certified rounding as in the module docstring; Higham (2002) §3.1 for the float64 error bound.
    """
    A = _check_2d(A, "A", ("float16",))
    B = _check_2d(B, "B", ("float16",))
    if A.shape[1] != B.shape[1]:
        raise ValueError(f"A [M, K] and B [N, K] must share K, got A {A.shape} and B {B.shape}")
    M, K = A.shape
    N = B.shape[0]
    fmt = OUTPUT_FORMATS["float16"]
    Af = A.astype(np.float64)
    Bf = B.astype(np.float64)
    finite_a = np.isfinite(Af).all(axis=1)
    finite_b = np.isfinite(Bf).all(axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        S = Af @ Bf.T
    rows = np.flatnonzero(~finite_a)
    cols = np.flatnonzero(~finite_b)
    S = _nonfinite_fix(S, Af, Bf, rows, cols)
    Afin = Af if rows.size == 0 else np.where(np.isfinite(Af), Af, 0.0)
    Bfin = Bf if cols.size == 0 else np.where(np.isfinite(Bf), Bf, 0.0)
    # Cauchy-Schwarz bound on |A||B| (cheap: no second matmul), inflated for its own rounding.
    na = np.sqrt(np.einsum("ik,ik->i", Afin, Afin))
    nb = np.sqrt(np.einsum("ik,ik->i", Bfin, Bfin))
    nab = np.outer(na, nb)
    err = ((K + 4) * 2.0**-52) * nab

    # Exactness proof where it holds: values on 2^-qa Z and 2^-qb Z, and ||a_i|| ||b_j|| (>= sum |a||b|, the
    # Cauchy-Schwarz inequality) at most 2^(53 - qa - qb): then every float64 summation order is exact
    # (terms on one grid, magnitudes below 2^53 of it), err = 0 and no certification is needed (small-integer inputs,
    # e.g. the
    # exact-accumulation families, whose outputs tie often).
    qa, qb = _fp16_grid_exponent(A), _fp16_grid_exponent(B)
    if qa is not None and qb is not None:  # (an all-zero operand has err = 0 already)
        err[nab * (1 + 2.0**-30) <= 2.0 ** (53 - qa - qb)] = 0.0
    err[~np.isfinite(S)] = 0.0

    # Exact path (undecided elements): fp16 values are integers times 2^-24, products times 2^-48.
    def exact_many(ii, jj):
        return _exact_dots_fp16(Af, Bf, ii, jj), -48

    out, n_exact = _certify(S, err, fmt, exact_many)

    def fraction(index):
        (n,), s = exact_many(np.array([index[0]]), np.array([index[1]]))
        return Fraction(n, 1 << -s)

    return Reference(
        out=out.astype(np.float16),
        exact=S,
        exact_err=err,
        K=K,
        output_format=fmt,
        description={
            "workload": "gemm_fp16",
            "M": M, "N": N, "K": K,
            "A": "float16 [M, K]", "B": "float16 [N, K]", "out": "float16 [M, N] = RNE(A @ B.T)",
            "elements_recomputed_exactly": n_exact,
        },
        _absprod_fn=lambda: _absprod_dense(Af, Bf),
        _fraction_fn=fraction,
    )


def _absprod_dense(Af, Bf):
    with np.errstate(invalid="ignore", over="ignore"):
        return np.abs(Af) @ np.abs(Bf).T


# --------------------------------------------------------------------------------------------------------------
# sparse_gemm_fp4_fp8
# --------------------------------------------------------------------------------------------------------------


def _e4m3_table() -> np.ndarray:
    """float64 value of every E4M3FN byte (0x7F / 0xFF are NaN)."""
    try:
        from .formats import E4M3FN, decode

        return np.asarray(decode(np.arange(256, dtype=np.uint8), E4M3FN, dtype=np.float64), dtype=np.float64)
    except (ImportError, AttributeError, TypeError):
        return np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def _as_e4m3_bytes(b, name: str) -> np.ndarray:
    b = to_numpy(b, name)
    if not isinstance(b, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or torch tensor, got {type(b).__name__}")
    if b.dtype.name == "float8_e4m3fn":
        return b.view(np.uint8)
    if b.dtype == np.uint8:
        return b
    if b.dtype == np.int8:
        return b.view(np.uint8)
    raise TypeError(
        f"{name} must hold E4M3FN bytes: uint8 (or int8 read as unsigned) or ml_dtypes.float8_e4m3fn, "
        f"got dtype {b.dtype}"
    )


def sparse_gemm_fp4_fp8(a_vals, a_meta, b_fp8) -> Reference:
    """Reference for sparse_gemm_fp4_fp8: 2:4-sparse E2M1 A times dense E4M3FN B.T, bf16 out, RNE once.

    C[m, n] = sum_g (v0 * B[n, 4g + idx0] + v1 * B[n, 4g + idx1]) with, per byte pair (docs/quantization.md, "2:4 sparse
    A"): v0 = E2M1(vals & 0xF), v1 = E2M1(vals >> 4), idx0 = meta & 3, idx1 = (meta >> 2) & 3, meta bits 7:4
    ignored. Defined for every byte (duplicate and descending indices included): the expansion is
    :func:`fp4ref.packing.decompress_2to4`.

    Exactness: every product lies on 2^-10 Z with |v0 b| + |v1 b| <= 12 * 448 per group, so for K < 2^32 every
    float64 summation order is exact (every term on the 2^-10 grid, sums far below 2^53 of it): ``exact`` is exact and
    ``out`` is its RNE.

    Args:
        a_vals: uint8 or int8 (read as unsigned bytes) [M, K/4]; torch int8/uint8 accepted.
        a_meta: same shape and dtype rules.
        b_fp8: E4M3FN bytes [N, K]: uint8 / int8, or ml_dtypes.float8_e4m3fn (torch float8_e4m3fn accepted).
            0x7F / 0xFF are NaN: a NaN selected by the metadata gives NaN in that output (even times a zero
            value); an unselected NaN is ignored.

    Returns:
        :class:`Reference`, ``out`` ml_dtypes.bfloat16 [M, N].

    Raises:
        TypeError: wrong dtypes (e.g. float8_e5m2 for b_fp8).
        ValueError: shapes (a_vals/a_meta differ, K != 4 * a_vals.shape[1], not 2-D, K >= 2^32).

    Source: FlashInfer-Bench sparse_gemm_fp4_fp8_n2048_k2048 (docs/verify.md); semantics in docs/quantization.md, "2:4
    sparse packing".
    """
    vals = to_numpy(a_vals, "a_vals")
    meta = to_numpy(a_meta, "a_meta")
    for nm, arr in (("a_vals", vals), ("a_meta", meta)):
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"{nm} must be a numpy array or torch tensor, got {type(arr).__name__}")
        if arr.dtype not in (np.uint8, np.int8):
            raise TypeError(f"{nm} must be uint8 or int8 (raw bytes), got dtype {arr.dtype}")
        if arr.ndim != 2:
            raise ValueError(f"{nm} must be 2-D [M, K/4], got shape {arr.shape}")
    if vals.shape != meta.shape:
        raise ValueError(f"a_vals and a_meta must have the same shape, got {vals.shape} and {meta.shape}")
    b = _as_e4m3_bytes(b_fp8, "b_fp8")
    if b.ndim != 2:
        raise ValueError(f"b_fp8 must be 2-D [N, K], got shape {b.shape}")
    M, G = vals.shape
    N, K = b.shape
    if K != 4 * G:
        raise ValueError(
            f"b_fp8 [N, K] must have K = 4 * a_vals.shape[1] = {4 * G}, got b_fp8 {b.shape} and a_vals {vals.shape}"
        )
    if K >= 2**32:
        raise ValueError(f"K={K} is beyond the float64 exactness limit 2^32 of this reference")
    fmt = OUTPUT_FORMATS["bfloat16"]
    A = decompress_2to4(vals, meta).astype(np.float64)
    table = _e4m3_table()
    Bv = table[b]
    nan_b = np.isnan(Bv)
    has_nan = bool(nan_b.any())
    if has_nan:
        Bv = np.where(nan_b, 0.0, Bv)
    S = A @ Bv.T  # exact (see docstring)
    out = round_float64(S, fmt)
    out[out == 0] = 0.0  # exact zero -> +0.0 (S is exact, so out == 0 iff S == 0 here: |S| >= 2^-10 else)
    exact = S.copy()
    exact[exact == 0] = 0.0
    if has_nan:
        # Which B positions each row selects (any value): decompress with every value 0.5 (code 1).
        sel = decompress_2to4(np.full_like(vals.view(np.uint8), 0x11), meta) != 0
        hit = (sel.astype(np.float64) @ nan_b.T.astype(np.float64)) > 0
        out[hit] = np.nan
        exact[hit] = np.nan

    def absprod():
        abs_vals = vals.view(np.uint8) & np.uint8(0x77)  # clear both sign bits: |v0|, |v1| (a duplicate adds)
        Aa = decompress_2to4(abs_vals, meta).astype(np.float64)
        ap = Aa @ np.abs(Bv).T
        if has_nan:
            ap[hit] = np.nan
        return ap

    return Reference(
        out=out.astype(ml_dtypes.bfloat16),
        exact=exact,
        exact_err=0.0,
        K=K,
        output_format=fmt,
        description={
            "workload": "sparse_gemm_fp4_fp8",
            "M": M, "N": N, "K": K,
            "a_vals": f"{vals.dtype} [M, K/4]", "a_meta": f"{meta.dtype} [M, K/4]", "b_fp8": "E4M3FN bytes [N, K]",
            "out": "bfloat16 [M, N] = RNE(sum_g v0*B[4g+idx0] + v1*B[4g+idx1])",
        },
        _absprod_fn=absprod,
    )


# --------------------------------------------------------------------------------------------------------------
# NVFP4
# --------------------------------------------------------------------------------------------------------------

# E2M1 code -> 2 * value (an integer in -12..12); -0 (code 8) -> 0.
_E2M1_X2 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int64)


def _e4m3_scale_ints() -> np.ndarray:
    """UE4M3 block-scale byte (sign bit ignored) -> value * 2^9 as float64 integer (0 .. 229376); NaN for 0x7F."""
    t = _e4m3_table()[np.arange(256) & 0x7F]
    return np.ldexp(t, 9)


def _f64_mant(x: float) -> tuple[int, int]:
    """x = m * 2^e with python ints (x finite)."""
    n, d = float(x).as_integer_ratio()
    return n, -(d.bit_length() - 1)


@lru_cache(maxsize=1)
def _e2m1_pair_table() -> np.ndarray:
    """complex128 [256]: byte -> (2 e2m1(low nibble)) + 1j (2 e2m1(high nibble)); viewed as float64 pairs this
    decodes packed bytes (element 2i low) with one gather."""
    b = np.arange(256)
    t = np.empty(256, dtype=np.complex128)
    t.real = _E2M1_X2[b & 0x0F]
    t.imag = _E2M1_X2[b >> 4]
    return t


def _nvfp4_int_operand(codes, scales, K: int, name: str):
    """Packed codes [R, K/2] + scale bytes [R, K/16] -> (XI float64 [R, K] of integers 2 e2m1 * 2^9 ue4m3,
    NaN row mask). value = XI * 2^-10 * global_decode."""
    R = codes.shape[0]
    e = _e2m1_pair_table()[codes].view(np.float64).reshape(R, K)
    sv = _e4m3_scale_ints()[scales]  # sign bit ignored; NaN for 0x7F / 0xFF
    nan_s = np.isnan(sv)
    nan_rows = nan_s.any(axis=1)
    if nan_rows.any():
        sv = np.where(nan_s, 0.0, sv)
    e.reshape(R, K // 16, 16)[...] *= sv[:, :, None]
    return e, nan_rows


def _int_matmul_exact(XI: np.ndarray, WI: np.ndarray) -> np.ndarray:
    """Exact XI @ WI.T for float64 integer matrices, as int64 (|result| < 2^62 required; checked).

    One float64 matmul when the Cauchy-Schwarz bound ||x_i|| ||w_j|| (>= sum |x||w|) is below 2^53, so every
    summation order is exact (all terms on one grid, sums below 2^53 of it); otherwise X is split into 11-bit limbs
    X = XH * 2^11 + XL and each limb product (terms < 2^(bits) small enough) is exact.
    """
    K = XI.shape[1]
    nx = np.sqrt(np.einsum("ik,ik->i", XI, XI)) * (1 + 2.0**-30)
    nw = np.sqrt(np.einsum("ik,ik->i", WI, WI)) * (1 + 2.0**-30)
    mx = float(nx.max()) if nx.size else 0.0
    mw = float(nw.max()) if nw.size else 0.0
    if mx * mw < 2.0**53:
        return (XI @ WI.T).astype(np.int64)
    # limb split of X; each limb's dot with W must satisfy the same CS test
    XH = np.floor(np.ldexp(XI, -11))
    XL = XI - np.ldexp(XH, 11)  # 0 <= XL < 2^11
    nxh = float(np.sqrt(np.einsum("ik,ik->i", XH, XH)).max()) * (1 + 2.0**-30)
    nxl = float(np.sqrt(np.einsum("ik,ik->i", XL, XL)).max()) * (1 + 2.0**-30)
    if nxh * mw >= 2.0**53 or nxl * mw >= 2.0**53 or mx * mw >= 2.0**61:
        raise ValueError(f"K={K}: operands too large for the exact two-limb NVFP4 path")
    return (XH @ WI.T).astype(np.int64) * (1 << 11) + (XL @ WI.T).astype(np.int64)


def _nvfp4_core(xc, xs, xg: float, wc, ws, wg: float, K: int, desc: dict) -> Reference:
    fmt = OUTPUT_FORMATS["bfloat16"]
    for nm, g in (("x global decode scale", xg), ("weight global decode scale", wg)):
        if not math.isfinite(g):
            raise ValueError(f"{nm} must be finite, got {g!r}")
    XI, nan_x = _nvfp4_int_operand(xc, xs, K, "x")
    WI, nan_w = _nvfp4_int_operand(wc, ws, K, "weight")
    CI = _int_matmul_exact(XI, WI)  # exact: C = CI * 2^-20 * xg * wg
    mg_x, eg_x = _f64_mant(xg)
    mg_w, eg_w = _f64_mant(wg)
    G = float(xg) * float(wg)  # may round in float64 if the mantissas are wide: accounted for below
    S = np.ldexp(CI.astype(np.float64) * G, -20)
    # |S - C| <= 3 * 2^-53 |S| (CI -> float64, the product G, the product CI*G; ldexp exact; no underflow for
    # |C| >= 2^-20 * |G| unless G is tiny: then add an absolute term).
    err = np.abs(S) * (4 * 2.0**-53) + 2.0**-1070
    err[CI == 0] = 0.0
    n_scale = mg_x * mg_w
    s_exp = eg_x + eg_w - 20

    def exact_many(ii, jj):
        return [int(c) * n_scale for c in CI[ii, jj].tolist()], s_exp

    out, n_exact = _certify(S, err, fmt, exact_many)
    nan_mask = nan_x[:, None] | nan_w[None, :]
    exact = S.copy()
    exact[CI == 0] = 0.0
    if nan_mask.any():
        out[nan_mask] = np.nan
        exact[nan_mask] = np.nan
    desc = dict(desc, elements_recomputed_exactly=n_exact)

    def fraction(index):
        (n,), s = exact_many(np.array([index[0]]), np.array([index[1]]))
        return Fraction(n) * Fraction(2) ** s

    def absprod():
        ap = np.ldexp((np.abs(XI) @ np.abs(WI).T) * abs(G), -20)
        ap[nan_mask] = np.nan
        return ap

    return Reference(
        out=out.astype(ml_dtypes.bfloat16),
        exact=exact,
        exact_err=np.where(nan_mask, 0.0, err),
        K=K,
        output_format=fmt,
        description=desc,
        epilogue_multiplies=2,
        epilogue_scale=float(xg) * float(wg),  # exact: two float32 significands fit float64's
        _absprod_fn=absprod,
        _fraction_fn=fraction,
    )


def _check_nvfp4_tensor(t, name: str):
    from .blockscale import NVFP4Tensor

    if not isinstance(t, NVFP4Tensor):
        raise TypeError(f"{name} must be an fp4ref.blockscale.NVFP4Tensor, got {type(t).__name__}")
    from .blockscale import _nvfp4_parts, _shape_and_axis

    shape, ax = _shape_and_axis(t, name)  # a hand-built tensor's fields, checked (axis -1 is axis 1 here)
    if len(shape) != 2 or ax != 1:
        raise ValueError(
            f"{name} must be 2-D [rows, K] quantized along its last axis, got shape {shape} axis {t.axis}"
        )
    # block=(16, 16) weight tiles store their scale on every row too: the same per-row arithmetic applies.
    return _nvfp4_parts(t, name)


def nvfp4_gemm(xq, wq) -> Reference:
    """Exact NVFP4 x NVFP4 GEMM, C = dequant(xq) @ dequant(wq).T, bf16 out with one RNE.

    C[m, n] = gx * gw * sum_b sx[m, b] sw[n, b] sum_{k in block b} e2m1(x[m, k]) e2m1(w[n, k]), with 16-element
    blocks along K, UE4M3 block scales (sign bit ignored) and float32 global decode scales gx, gw.

    Exactness: the elements are integers XI = 2 e2m1 * 2^9 ue4m3 (|XI| <= 12 * 229376 < 2^21.4), so
    C = (XI . WI) * 2^-20 * gx * gw. XI . WI is computed exactly: one float64 matmul when the Cauchy-Schwarz bound
    on sum |XI||WI| is below 2^53, else two 11-bit limbs (float64 alone is not exact
    for NVFP4 beyond K ~ 1190). The product with gx * gw (48 significant bits) is then certified: float64 with a
    3-ulp bound, exact python-int rounding for any undecided element.

    Policies: a NaN scale byte (0x7F / 0xFF) makes every output of its row (x) or column (w) NaN (IEEE NaN * 0);
    exact zero -> +0.0; overflow -> +-inf (RNE).

    Args:
        xq: :class:`fp4ref.blockscale.NVFP4Tensor`, shape [M, K] quantized along axis 1 (or -1).
        wq: :class:`fp4ref.blockscale.NVFP4Tensor`, shape [N, K] quantized along axis 1 (or -1).

    Returns:
        :class:`Reference`, ``out`` ml_dtypes.bfloat16 [M, N]; ``epilogue_multiplies`` = 2 (a kernel's fp32
        gx * gw and its multiply into the accumulator).

    Raises:
        TypeError: not NVFP4Tensors; ValueError: shapes, K mismatch, non-finite global scales; a hand-built
        tensor's bad field (``xq.axis`` out of range, ``wq.block`` not an NVFP4 block, ...) names it.

    Source: NVFP4 (SOL-ExecBench nvfp4_linear_layer, docs/verify.md; NVIDIA, "Introducing NVFP4", 2025): value = e2m1 *
    e4m3 * fp32 global.
    """
    xc, xs, xg = _check_nvfp4_tensor(xq, "xq")
    wc, ws, wg = _check_nvfp4_tensor(wq, "wq")
    K = xq.shape[1]
    if wq.shape[1] != K:
        raise ValueError(f"xq [M, K] and wq [N, K] must share K, got {xq.shape} and {wq.shape}")
    return _nvfp4_core(xc, xs, xg, wc, ws, wg, K, {
        "workload": "nvfp4_gemm", "M": xq.shape[0], "N": wq.shape[0], "K": K,
        "x_recipe": xq.recipe, "w_recipe": wq.recipe, "out": "bfloat16 [M, N] = RNE(gx gw sum sx sw ex ew)",
    })


def nvfp4_linear(x, weight_fp4, weight_scales, weight_global_decode_scale, recipe="sol") -> Reference:
    """Reference for the NVFP4-linear workload (SOL-ExecBench nvfp4_linear_layer): y = x @ W.T, bf16 out.

    x is quantized per call with ``recipe`` (default "sol", the workload's own quantizer, bit for bit:
    :func:`fp4ref.blockscale.nvfp4_quantize`), then the exact NVFP4 product with BOTH global decode scales applied
    exactly and ONE RNE rounding to bf16 (see :func:`nvfp4_gemm`). The workload itself rounds to bf16 twice
    (bf16(bf16(acc) * alpha)); this reference does not (one rounding, docs/bounds.md).

    Args:
        x: bfloat16 (ml_dtypes) or float32 array / torch tensor [..., K]; must be finite.
        weight_fp4: uint8 [N, K/2] packed E2M1 codes (element 2i low nibble); torch float4_e2m1fn_x2 accepted.
        weight_scales: E4M3FN block-scale bytes [N, K/16] (uint8 or ml_dtypes.float8_e4m3fn; torch fp8 accepted).
        weight_global_decode_scale: python / numpy float (an int is its value), or a 0-d or one-element numpy array or
            torch tensor of a real dtype (its element; compressed-tensors stores it with shape [1]), rounded to float32
            (RNE) once, as a kernel holding it in an fp32 register does (the workload passes the float32 value it
            stored, so this is exact there); that float32 value must be finite and > 0.
        recipe: the quantization recipe for x ("sol" default; any of fp4ref.blockscale.NVFP4Recipe).

    Returns:
        :class:`Reference`, ``out`` ml_dtypes.bfloat16 [..., N].

    Raises:
        TypeError / ValueError: dtypes and shapes (K = 2 * weight_fp4.shape[1] = 16 * weight_scales.shape[1],
            K > 0); an unknown ``recipe``;
            ``weight_global_decode_scale`` not a real scalar (TypeError: a bool, a complex, an array or tensor
            of more than one element too), or inf, NaN or <= 0 as float32
            (ValueError: 1e39 and an int beyond float64, 10**400, too).

    Source: SOL-ExecBench nvfp4_linear_layer (docs/verify.md).
    """
    from .blockscale import _parse_recipe, nvfp4_quantize

    rec = _parse_recipe(recipe)  # its name (rec.value) goes in messages and the description, whatever was passed
    x = to_numpy(x, "x")
    wc = to_numpy(weight_fp4, "weight_fp4")
    ws = to_numpy(weight_scales, "weight_scales")
    if not isinstance(x, np.ndarray) or x.dtype.name not in ("bfloat16", "float32"):
        raise TypeError(f"x must be a bfloat16 or float32 array, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.ndim < 1:
        raise ValueError("x must have at least one dimension")
    if not isinstance(wc, np.ndarray) or wc.dtype not in (np.uint8, np.int8):
        raise TypeError(f"weight_fp4 must be uint8 packed E2M1 codes, got {getattr(wc, 'dtype', type(wc).__name__)}")
    wc = wc.view(np.uint8)
    ws = _as_e4m3_bytes(ws, "weight_scales")
    if wc.ndim != 2 or ws.ndim != 2:
        raise ValueError(f"weight_fp4 and weight_scales must be 2-D, got {wc.shape} and {ws.shape}")
    K = x.shape[-1]
    N = wc.shape[0]
    if K == 0 or K % 16:
        raise ValueError(f"x has shape {x.shape}: its last dimension K is {K}, and NVFP4 needs K a positive multiple "
                         "of 16 (the block size)")
    if wc.shape != (N, K // 2) or ws.shape != (N, K // 16):
        raise ValueError(
            f"shapes disagree: x [..., K={K}] needs weight_fp4 [N, {K // 2}] and weight_scales [N, {K // 16}], "
            f"got {wc.shape} and {ws.shape}"
        )
    wg = global_scale_float32(weight_global_decode_scale, "weight_global_decode_scale")
    lead = x.shape[:-1]
    x2 = x.reshape(int(np.prod(lead, dtype=np.int64)), K)
    bad = ~np.isfinite(x2.astype(np.float32))
    if bad.any():
        first = np.unravel_index(int(np.flatnonzero(bad)[0]), x2.shape)
        raise ValueError(f"x holds {int(bad.sum())} NaN/inf value(s) (first at row {int(first[0])}, column "
                         f"{int(first[1])}): the layer quantizes x with the {rec.value!r} recipe, which has no "
                         "NaN/inf policy, so there is no reference output for such x")
    xq = nvfp4_quantize(x2, recipe=rec)
    ref = _nvfp4_core(np.asarray(xq.codes, np.uint8), np.asarray(xq.scales, np.uint8), float(xq.global_decode_scale),
                      wc, ws, wg, K, {
                          "workload": "nvfp4_linear", "x_shape": tuple(x.shape), "N": N, "K": K,
                          "recipe": rec.value,
                          "x_global_decode_scale": float(xq.global_decode_scale),
                          "weight_global_decode_scale": wg,
                          "out": "bfloat16 [..., N] = RNE(exact NVFP4 product with both global scales)",
                      })
    if lead != (x2.shape[0],):
        shape = lead + (N,)
        ref = Reference(out=ref.out.reshape(shape), exact=ref.exact.reshape(shape),
                        exact_err=np.asarray(ref.exact_err).reshape(shape), K=K, output_format=ref.output_format,
                        description=ref.description, epilogue_multiplies=ref.epilogue_multiplies,
                        epilogue_scale=ref.epilogue_scale, _absprod_fn=lambda f=ref._absprod_fn: f().reshape(shape),
                        _fraction_fn=lambda idx, f=ref._fraction_fn: f(
                            (int(np.ravel_multi_index(idx[:-1], lead)), idx[-1])))
    return ref
