"""Reference GEMMs against fractions.Fraction, with an independent rounding by table search.

The rounding oracle here does not share code with fp4ref.gemm: it lists every finite value of the output format
(all 65536 bit patterns through ml_dtypes / numpy), finds the neighbours of the exact Fraction by bisection and
picks the nearer one by exact Fraction distance, ties to the even bit pattern; overflow follows IEEE RNE.
"""
from __future__ import annotations

import bisect
import math
import re
from fractions import Fraction
from functools import lru_cache

import ml_dtypes
import numpy as np
import pytest

from fp4ref import gemm
from fp4ref.packing import compress_2to4
from fp4ref.workloads import get_workload

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
E4M3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


@lru_cache(maxsize=None)
def _table(dtype_name):
    dt = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype_name]
    bits = np.arange(65536, dtype=np.uint16)
    with np.errstate(invalid="ignore"):
        vals = bits.view(dt).astype(np.float64)
    ok = np.isfinite(vals) & ~((vals == 0) & np.signbit(vals))
    vals, bits = vals[ok], bits[ok]
    order = np.argsort(vals, kind="stable")
    return [Fraction(float(v)) for v in vals[order]], [int(b) for b in bits[order]], float(vals.max())


def oracle_round(x: Fraction, dtype_name: str) -> float:
    vals, bits, vmax = _table(dtype_name)
    if x == 0:
        return 0.0
    p = {"bfloat16": 8, "float16": 11}[dtype_name]
    emax = {"bfloat16": 127, "float16": 15}[dtype_name]
    overflow = Fraction(vmax) + Fraction(2) ** (emax - p)  # max + ulp(max)/2
    if x >= overflow:
        return math.inf
    if x <= -overflow:
        return -math.inf
    i = bisect.bisect_left(vals, x)
    cands = [j for j in (i - 1, i) if 0 <= j < len(vals)]
    best = min(cands, key=lambda j: (abs(vals[j] - x), bits[j] & 1))
    v = float(vals[best])
    if v == 0:
        return math.copysign(0.0, -1.0 if x < 0 else 1.0)
    return v


def frac_dot(a, b):
    return sum((Fraction(float(p)) * Fraction(float(q)) for p, q in zip(a, b)), Fraction(0))


def assert_matches_oracle(ref, exact, dtype_name):
    out = ref.out.astype(np.float64)
    for idx in np.ndindex(out.shape):
        want = oracle_round(exact[idx], dtype_name)
        got = out[idx]
        # a zero's sign too: +0.0 for an exact zero, the exact value's sign where it rounds to zero (-0.0 == 0.0)
        assert got == want and (want != 0 or np.signbit(got) == np.signbit(want)), (
            f"at {idx}: got {got!r}, want {want!r} for exact {exact[idx]}"
        )


# ---------------------------------------------------------------------------------------------------------------
# round_float64 / round_exact
# ---------------------------------------------------------------------------------------------------------------


def test_round_float64_no_double_rounding():
    # ml_dtypes goes float64 -> float32 -> bfloat16 and gets 1.0 here; the single RNE gives 1 + 2^-7.
    x = 1 + 2.0**-8 + 2.0**-40
    assert gemm.round_float64(np.array([x]), "bfloat16")[0] == 1 + 2.0**-7
    assert gemm.round_float64(np.array([1 + 2.0**-8]), "bfloat16")[0] == 1.0  # exact tie -> even


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_round_float64_against_oracle_random(name):
    rng = np.random.default_rng(1)
    # Random float64 values across the format's range, including subnormal and overflow regions, plus midpoints.
    emin, emax = (-133, 128) if name == "bfloat16" else (-25, 16)
    x = rng.standard_normal(400) * np.ldexp(1.0, rng.integers(emin, emax, 400))
    tbl = _table(name)[0]
    mids = [float((tbl[i] + tbl[i + 1]) / 2) for i in rng.integers(0, len(tbl) - 1, 100)]
    x = np.concatenate([x, mids, [0.0, -0.0]])
    got = gemm.round_float64(x, name)
    for xi, gi in zip(x, got):
        assert gi == oracle_round(Fraction(float(xi)), name), xi
    # and round_exact on the same values
    for xi in x[:200]:
        n, d = Fraction(float(xi)).as_integer_ratio()
        s = -(d.bit_length() - 1)
        assert gemm.round_exact(n, s, name) == oracle_round(Fraction(float(xi)), name)


def test_round_overflow_thresholds():
    bmax = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    half_ulp = 2.0**(127 - 8)
    assert gemm.round_float64(np.array([bmax + half_ulp]), "bfloat16")[0] == np.inf
    assert gemm.round_float64(np.array([np.nextafter(bmax + half_ulp, 0)]), "bfloat16")[0] == bmax
    assert gemm.round_float64(np.array([65519.99]), "float16")[0] == 65504
    assert gemm.round_float64(np.array([-65520.0]), "float16")[0] == -np.inf
    assert gemm.round_exact(65520, 0, "float16") == np.inf
    assert gemm.round_exact(-(65520 * 2**10 - 1), -10, "float16") == -65504


# ---------------------------------------------------------------------------------------------------------------
# gemm_fp16
# ---------------------------------------------------------------------------------------------------------------


def _fp16_exact(A, B):
    return np.array([[frac_dot(A[i], B[j]) for j in range(B.shape[0])] for i in range(A.shape[0])], dtype=object)


def test_gemm_fp16_random_small():
    rng = np.random.default_rng(2)
    A = (rng.standard_normal((6, 40)) * np.ldexp(1.0, rng.integers(-20, 8, (6, 40)))).astype(np.float16)
    B = (rng.standard_normal((5, 40)) * np.ldexp(1.0, rng.integers(-20, 8, (5, 40)))).astype(np.float16)
    ref = gemm.gemm_fp16(A, B)
    ex = _fp16_exact(A, B)
    assert ref.out.dtype == np.float16 and ref.out.shape == (6, 5) and ref.K == 40
    assert_matches_oracle(ref, ex, "float16")
    for idx in np.ndindex(ex.shape):
        assert ref.exact_fraction(idx) == ex[idx]
        assert abs(Fraction(float(ref.exact[idx])) - ex[idx]) <= Fraction(float(ref.exact_err[idx]))


def test_gemm_fp16_ties_cancellation_subnormal_overflow():
    # Row 0: exact output ties of fp16 (1 + 2^-11 is halfway between 1 and 1 + 2^-10): 1*1 + 2^-11*1 -> 1.0 (even);
    # row 1: 1 + 3*2^-11 -> 1 + 2^-9 (even); row 2: huge cancellation 2^15 - 2^15 + 2^-24 -> 2^-24 (subnormal);
    # row 3: 60000 + 60000 -> overflow -> inf; row 4: 0.5 * 2^-24 = 2^-25: a tie between 0 and the smallest
    # subnormal -> +0 (even); row 5: -2^-25 -> -0 (IEEE sign); row 6: 1 + 2^-11 + 2^-48 -> 1 + 2^-10 (the tie
    # broken by a tiny term); row 7: the tie of row 0 plus a cancelling pair 2^15 - 2^15, whose norm defeats the
    # float64 exactness proof, so the certification cannot decide it and the exact integer path must.
    K = 6
    A = np.zeros((8, K), np.float16)
    B = np.zeros((1, K), np.float16)
    B[0] = [1.0, 1.0, 1.0, 2.0**-24, 1.0, 1.0]
    A[0] = [1.0, 2.0**-11, 0, 0, 0, 0]
    A[1] = [1.0, 3 * 2.0**-11, 0, 0, 0, 0]
    A[2] = [2.0**15, -(2.0**15), 2.0**-24, 0, 0, 0]
    A[3] = [60000, 60000, 0, 0, 0, 0]
    A[4] = [0, 0, 0, 0.5, 0, 0]  # 0.5 * 2^-24 = 2^-25
    A[5] = [0, 0, 0, -0.5, 0, 0]
    A[6] = [1.0, 2.0**-11, 0, 2.0**-24, 0, 0]
    A[7] = [1.0, 2.0**-11, 0, 0, 2.0**15, -(2.0**15)]
    Bm = np.vstack([B, B * np.float16(-1)])
    ref = gemm.gemm_fp16(A, Bm)
    ex = _fp16_exact(A, Bm)
    assert_matches_oracle(ref, ex, "float16")
    out = ref.out.astype(np.float64)
    assert out[0, 0] == 1.0 and out[1, 0] == 1 + 2.0**-9 and out[2, 0] == 2.0**-24
    assert out[3, 0] == np.inf and out[3, 1] == -np.inf
    assert out[4, 0] == 0.0 and not np.signbit(out[4, 0]) and np.signbit(out[4, 1])  # -2^-25 -> -0 (IEEE sign)
    assert out[6, 0] == 1 + 2.0**-10 and out[7, 0] == 1.0 and out[7, 1] == -1.0
    assert ref.description["elements_recomputed_exactly"] >= 2  # row 7 went through the integer path


def test_gemm_fp16_exact_integer_path_many_elements():
    # Cancelling pairs defeat the exactness proof; ties then force the exact path for every element. Checked
    # against Fraction sums (the vectorized limb arithmetic, including K > 4096 chunking).
    rng = np.random.default_rng(11)
    K = 4100
    A = np.zeros((3, K), np.float16)
    B = np.zeros((4, K), np.float16)
    A[:, 0] = 1.0
    A[:, 1] = 2.0**-11
    A[:, 2], A[:, 3] = 2.0**15, -(2.0**15)
    A[:, 4:] = (rng.integers(-8, 9, (3, K - 4)) * 2.0**-24).astype(np.float16)
    B[:, :4] = 1.0
    B[:, 4:] = (rng.integers(-8, 9, (4, K - 4)) * 2.0**-24).astype(np.float16)
    ref = gemm.gemm_fp16(A, B)
    assert ref.description["elements_recomputed_exactly"] == 12
    ex = _fp16_exact(A, B)
    assert_matches_oracle(ref, ex, "float16")
    for idx in np.ndindex(ex.shape):
        assert ref.exact_fraction(idx) == ex[idx]


def test_gemm_fp16_exact_zero_is_positive():
    A = np.array([[1.0, -1.0], [-0.0, -0.0]], np.float16)
    B = np.array([[1.0, 1.0]], np.float16)
    ref = gemm.gemm_fp16(A, B)
    assert np.all(ref.out == 0) and not np.any(np.signbit(ref.out))


def test_gemm_fp16_nonfinite_ieee():
    A = np.array([[np.inf, 1.0], [np.inf, 1.0], [np.nan, 0.0], [1.0, 2.0]], np.float16)
    B = np.array([[1.0, 1.0], [0.0, 1.0], [-1.0, np.inf]], np.float16)
    ref = gemm.gemm_fp16(A, B)
    out = ref.out.astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = np.array([[sum(float(a) * float(b) for a, b in zip(r, c)) for c in B] for r in A])
    np.testing.assert_array_equal(out, want)  # inf*0 = NaN; inf + -inf = NaN
    assert np.isnan(out[1, 1]) and out[0, 0] == np.inf and np.isnan(out[0, 2])


def test_gemm_fp16_rejects_bad_input():
    A = np.zeros((2, 4), np.float16)
    with pytest.raises(TypeError, match="A must have dtype float16"):
        gemm.gemm_fp16(A.astype(np.float32), A)
    with pytest.raises(ValueError, match="share K"):
        gemm.gemm_fp16(A, np.zeros((3, 5), np.float16))
    with pytest.raises(ValueError, match="2-D"):
        gemm.gemm_fp16(A[0], A)


def test_gemm_fp16_does_not_modify_inputs():
    rng = np.random.default_rng(3)
    A = rng.standard_normal((3, 8)).astype(np.float16)
    B = rng.standard_normal((2, 8)).astype(np.float16)
    a0, b0 = A.copy(), B.copy()
    gemm.gemm_fp16(A, B)
    np.testing.assert_array_equal(A, a0)
    np.testing.assert_array_equal(B, b0)


# ---------------------------------------------------------------------------------------------------------------
# sparse_gemm_fp4_fp8
# ---------------------------------------------------------------------------------------------------------------


def _sparse_exact(vals, meta, b):
    """Exact Fractions straight from the sum formula (docs/quantization.md), byte by byte."""
    M, G = vals.shape
    N = b.shape[0]
    bv = E4M3[b]
    out = np.empty((M, N), dtype=object)
    nan = np.zeros((M, N), bool)
    for m in range(M):
        for n in range(N):
            acc = Fraction(0)
            for g in range(G):
                v, t = int(vals[m, g]) & 0xFF, int(meta[m, g]) & 0xFF
                for code, idx in ((v & 0xF, t & 3), (v >> 4, (t >> 2) & 3)):
                    x = bv[n, 4 * g + idx]
                    if np.isnan(x):
                        nan[m, n] = True
                    else:
                        acc += Fraction(E2M1[code]) * Fraction(float(x))
            out[m, n] = acc
    return out, nan


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sparse_every_byte_random(seed):
    rng = np.random.default_rng(seed)
    M, N, G = 5, 4, 6
    vals = rng.integers(-128, 128, (M, G), dtype=np.int8)  # the benchmark's randint int8: any byte
    meta = rng.integers(-128, 128, (M, G), dtype=np.int8)
    b = rng.integers(0, 256, (N, 4 * G), dtype=np.uint8)
    b[(b & 0x7F) == 0x7F] = 0x38  # no NaN here (tested separately)
    ref = gemm.sparse_gemm_fp4_fp8(vals, meta, b)
    ex, nan = _sparse_exact(vals, meta, b)
    assert not nan.any()
    assert ref.out.dtype == ml_dtypes.bfloat16 and ref.is_exact and ref.K == 4 * G
    assert_matches_oracle(ref, ex, "bfloat16")
    for idx in np.ndindex(ex.shape):
        assert Fraction(float(ref.exact[idx])) == ex[idx]


def test_sparse_nan_selected_only():
    # One group: meta 0x04 selects columns 0 and 1. NaN in column 2 (unselected) is ignored; NaN in column 1
    # poisons the row even when the value there is zero.
    vals = np.array([[0x02], [0x02]], np.uint8)  # v0 = 1.0 (code 2), v1 = 0 (code 0)
    meta = np.array([[0x04], [0x04]], np.uint8)
    b = np.array([[0x38, 0x38, 0x7F, 0x38], [0x38, 0xFF, 0x38, 0x38]], np.uint8)
    ref = gemm.sparse_gemm_fp4_fp8(vals, meta, b)
    out = ref.out.astype(np.float64)
    assert out[0, 0] == 1.0 and np.isnan(out[0, 1])
    assert np.isnan(ref.exact[1, 1])


def test_sparse_ties_and_large_k_exact():
    # bf16 ties: sum = 256 + 1 = 257 is halfway between 256 and 258 -> 256 (even); 259 -> 260.
    G = 4
    b = np.full((1, 4 * G), 0x38, np.uint8)  # all 1.0
    # v0 = 6 (code 7), v1 = 2 (code 4) per group -> 8 per group; use E4M3 values to build 257 exactly:
    # B[0] columns: 0 -> 256 (0x78), 1 -> 1 (0x38); meta 0x04 picks columns 0, 1; vals (1.0, 1.0) = 0x22.
    b[0, 0] = 0x78  # 256
    vals = np.zeros((2, G), np.uint8)
    meta = np.full((2, G), 0x04, np.uint8)
    vals[0, 0] = 0x22  # 1*256 + 1*1 = 257
    vals[1, 0] = 0x52  # 1*256 + 3*1 = 259
    ref = gemm.sparse_gemm_fp4_fp8(vals, meta, b)
    out = ref.out.astype(np.float64)
    assert out[0, 0] == 256.0 and out[1, 0] == 260.0
    # exact-zero sign: all-zero A row
    vals2 = np.zeros((1, G), np.uint8)
    vals2[0, 0] = 0x88  # -0, -0
    ref2 = gemm.sparse_gemm_fp4_fp8(vals2, np.full((1, G), 0x04, np.uint8), b)
    assert ref2.out[0, 0] == 0 and not np.signbit(ref2.out.astype(np.float32)[0, 0])


def test_sparse_matches_compress_roundtrip_and_accepts_float8():
    rng = np.random.default_rng(5)
    dense_codes = rng.integers(0, 16, (4, 32)).astype(np.uint8)
    dense_codes.reshape(4, 8, 4)[:, :, 1:3] = 0  # keep positions 0 and 3
    vals, meta = compress_2to4(dense_codes)
    b = rng.standard_normal((3, 32)).astype(ml_dtypes.float8_e4m3fn)
    r1 = gemm.sparse_gemm_fp4_fp8(vals, meta, b)
    r2 = gemm.sparse_gemm_fp4_fp8(vals, meta, b.view(np.uint8))
    np.testing.assert_array_equal(r1.out.astype(np.float32), r2.out.astype(np.float32))
    dense = np.array(E2M1)[dense_codes]
    want = dense @ b.astype(np.float64).T  # exact here: small K
    np.testing.assert_array_equal(r1.exact, want)


def test_sparse_rejects_bad_input():
    v = np.zeros((2, 4), np.uint8)
    with pytest.raises(TypeError, match="b_fp8"):
        gemm.sparse_gemm_fp4_fp8(v, v, np.zeros((3, 16), ml_dtypes.float8_e5m2))
    with pytest.raises(ValueError, match="K = 4"):
        gemm.sparse_gemm_fp4_fp8(v, v, np.zeros((3, 12), np.uint8))
    with pytest.raises(ValueError, match="same shape"):
        gemm.sparse_gemm_fp4_fp8(v, v[:1], np.zeros((3, 16), np.uint8))
    with pytest.raises(TypeError, match="a_vals"):
        gemm.sparse_gemm_fp4_fp8(v.astype(np.int16), v, np.zeros((3, 16), np.uint8))


def test_absprod_sparse_duplicate_index_adds_magnitudes():
    vals = np.array([[0x9A]], np.uint8)  # v0 = -1.0 (code 0xA), v1 = -0.5 (0x9)
    meta = np.array([[0x00]], np.uint8)  # both at column 0: A = -1.5
    b = np.array([[0xB8, 0x38, 0x38, 0x38]], np.uint8)  # -1.0
    ref = gemm.sparse_gemm_fp4_fp8(vals, meta, b)
    assert ref.exact[0, 0] == 1.5 and ref.absprod[0, 0] == 1.5
    vals = np.array([[0x92]], np.uint8)  # v0 = +1.0, v1 = -0.5 -> A = 0.5, |A||B| = 1.5
    ref = gemm.sparse_gemm_fp4_fp8(vals, meta, b)
    assert ref.exact[0, 0] == -0.5 and ref.absprod[0, 0] == 1.5


# ---------------------------------------------------------------------------------------------------------------
# NVFP4
# ---------------------------------------------------------------------------------------------------------------

from fp4ref.blockscale import NVFP4Recipe, NVFP4Tensor, nvfp4_dequantize, nvfp4_quantize  # noqa: E402
from fp4ref.packing import pack_fp4  # noqa: E402


def _nvt(codes, scale_bytes, g):
    codes = np.asarray(codes, np.uint8)
    return NVFP4Tensor(codes=pack_fp4(codes), scales=np.asarray(scale_bytes, np.uint8),
                       global_decode_scale=np.float32(g), shape=codes.shape, recipe="test", block=(1, 16), axis=1)


def _nv_exact(xq, wq, i, j):
    xd = nvfp4_dequantize(xq, np.float64)
    wd = nvfp4_dequantize(wq, np.float64)
    return frac_dot(xd[i], wd[j])


def test_nvfp4_gemm_random_against_fraction():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    xq, wq = nvfp4_quantize(x, recipe="sol"), nvfp4_quantize(w, recipe="sol")
    ref = gemm.nvfp4_gemm(xq, wq)
    ex = np.array([[_nv_exact(xq, wq, i, j) for j in range(4)] for i in range(3)], dtype=object)
    assert_matches_oracle(ref, ex, "bfloat16")
    assert ref.epilogue_multiplies == 2


def test_nvfp4_gemm_beyond_float64_exactness_two_limbs():
    # K = 8192, every element 6 * 448: |XI| = 12 * 229376, Cauchy-Schwarz over 2^53 -> the two-limb path.
    # Exact sum = K * 36 * 448^2 (times global scales 1); one element of w changed so the result is not a power
    # of two times a short integer: the float64 sum of the dequantized values is not exact any more.
    K = 8192
    xc = np.full((1, K), 7, np.uint8)
    wc = np.full((2, K), 7, np.uint8)
    wc[1, 5] = 1  # 0.5 instead of 6
    xs = np.full((1, K // 16), 0x7E, np.uint8)  # 448
    ws = np.full((2, K // 16), 0x7E, np.uint8)
    ws[1, 3] = 0x01  # 2^-9: a subnormal block scale
    xq, wq = _nvt(xc, xs, 1.0), _nvt(wc, ws, 3.0)
    ref = gemm.nvfp4_gemm(xq, wq)
    for j in range(2):
        ex = _nv_exact(xq, wq, 0, j)
        assert ref.exact_fraction((0, j)) == ex
        assert float(ref.out.astype(np.float64)[0, j]) == oracle_round(ex, "bfloat16")


def test_nvfp4_gemm_ties_nan_scale_and_zero():
    # x row: code 2 (1.0) with scale 1.0 (0x38); w rows give sums on a bf16 tie: 256 + 1 = 257 -> 256.
    K = 16
    xc = np.zeros((3, K), np.uint8)
    xc[:, 0] = 2
    xc[:, 1] = 2
    xs = np.full((3, 1), 0x38, np.uint8)
    xs[2, 0] = 0x7F  # NaN scale -> that row is NaN
    wc = np.zeros((2, K), np.uint8)
    wc[0, 0], wc[0, 1] = 6, 2  # 4.0 and 1.0; with scale 64 (0x60): 256 + 64 -> 320
    wc[1, 0], wc[1, 1] = 6, 1  # 4, 0.5; scale 64 -> 256 + 32 = 288
    ws = np.array([[0x68], [0x68]], np.uint8)  # 64.0
    xq, wq = _nvt(xc, xs, 1.0), _nvt(wc, ws, 2.0**-6 * (1 + 2.0**-8) * 256 / 257)
    ref = gemm.nvfp4_gemm(xq, wq)
    out = ref.out.astype(np.float64)
    assert np.all(np.isnan(out[2]))
    for j in range(2):
        ex = _nv_exact(xq, wq, 0, j)
        assert out[0, j] == oracle_round(ex, "bfloat16")
    # all-zero codes -> +0
    xz = _nvt(np.full((1, K), 8, np.uint8), np.full((1, 1), 0x38, np.uint8), 1.0)
    rz = gemm.nvfp4_gemm(xz, wq)
    assert np.all(rz.out.astype(np.float32) == 0) and not np.any(np.signbit(rz.out.astype(np.float32)))


def test_nvfp4_linear_matches_quantize_then_gemm_and_torchless_shapes():
    rng = np.random.default_rng(8)
    K, N = 32, 3
    w = rng.standard_normal((N, K)).astype(np.float32)
    wq = nvfp4_quantize(w, recipe="sol")
    x = rng.standard_normal((2, 3, K)).astype(ml_dtypes.bfloat16)
    ref = gemm.nvfp4_linear(x, wq.codes, wq.scales.view(ml_dtypes.float8_e4m3fn), float(wq.global_decode_scale))
    assert ref.out.shape == (2, 3, N) and ref.out.dtype == ml_dtypes.bfloat16
    xq = nvfp4_quantize(x.reshape(6, K), recipe="sol")
    ref2 = gemm.nvfp4_gemm(xq, wq)
    np.testing.assert_array_equal(ref.out.reshape(6, N).astype(np.float32), ref2.out.astype(np.float32))
    assert ref.exact_fraction((1, 2, 1)) == _nv_exact(xq, wq, 5, 1)
    with pytest.raises(ValueError, match="shapes disagree"):
        gemm.nvfp4_linear(x, wq.codes[:, :8], wq.scales, 1.0)
    with pytest.raises(TypeError, match="x must be"):
        gemm.nvfp4_linear(x.astype(np.float16), wq.codes, wq.scales, 1.0)
    xn = x.copy()
    xn[1, 2, 5] = np.nan
    with pytest.raises(ValueError, match="row 5, column 5.*no NaN/inf policy"):  # row 5 of the [6, K] view
        gemm.nvfp4_linear(xn, wq.codes, wq.scales, 1.0)
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="weight_global_decode_scale"):
            gemm.nvfp4_linear(x, wq.codes, wq.scales, bad)


def test_torch_tensors_accepted_at_the_edges():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    A = rng.standard_normal((3, 16)).astype(np.float16)
    B = rng.standard_normal((2, 16)).astype(np.float16)
    r1 = gemm.gemm_fp16(torch.from_numpy(A), torch.from_numpy(B))
    r2 = gemm.gemm_fp16(A, B)
    np.testing.assert_array_equal(r1.out, r2.out)
    vals = rng.integers(-128, 128, (2, 4), dtype=np.int8)
    meta = rng.integers(-128, 128, (2, 4), dtype=np.int8)
    b = rng.standard_normal((3, 16)).astype(np.float32)
    bt = torch.from_numpy(b).to(torch.float8_e4m3fn)
    r3 = gemm.sparse_gemm_fp4_fp8(torch.from_numpy(vals), torch.from_numpy(meta), bt)
    r4 = gemm.sparse_gemm_fp4_fp8(vals, meta, bt.view(torch.uint8).numpy())
    np.testing.assert_array_equal(r3.out.astype(np.float32), r4.out.astype(np.float32))


def test_nvfp4_gemm_exact_bf16_ties():
    # Two blocks: w = 4.0 * 64 (block 0) and 1.0 or 3.0 * 1.0 (block 1); x = 1.0 at both: 257 -> 256, 259 -> 260.
    K = 32
    xc = np.zeros((1, K), np.uint8)
    xc[0, 0] = xc[0, 16] = 2
    wc = np.zeros((2, K), np.uint8)
    wc[:, 0] = 6
    wc[0, 16], wc[1, 16] = 2, 5
    ws = np.array([[0x68, 0x38], [0x68, 0x38]], np.uint8)  # 64.0, 1.0
    ref = gemm.nvfp4_gemm(_nvt(xc, np.full((1, 2), 0x38, np.uint8), 1.0), _nvt(wc, ws, 1.0))
    assert ref.out.astype(np.float64).tolist() == [[256.0, 260.0]]
    assert ref.description["elements_recomputed_exactly"] == 2


def test_bench_reference_runs_on_small_shapes(monkeypatch):
    from fp4ref.bench import reference as bench_reference

    monkeypatch.setattr(bench_reference, "SHAPES", {"sparse_gemm_fp4_fp8": (4, 32, 64), "nvfp4_linear": (4, 32, 64),
                                                    "gemm_fp16": (4, 24, 32)})
    rows = bench_reference.run(repeat=1)
    assert [r["workload"] for r in rows] == ["sparse_gemm_fp4_fp8", "nvfp4_linear", "gemm_fp16"]
    table = bench_reference.format_table(rows)
    assert table.count("\n") == 4 and "x |" in table


def test_fp16_grid_exponent_is_a_valid_grid():
    # every finite value times 2^q must be an integer (the exactness proof depends on it)
    rng = np.random.default_rng(12)
    for scale in (2.0**-20, 2.0**-10, 1.0, 2.0**10):
        x = (rng.standard_normal(1000) * scale).astype(np.float16)
        q = gemm._fp16_grid_exponent(x)
        t = np.ldexp(x.astype(np.float64), q)
        assert np.all(t == np.round(t)), scale
    every = np.arange(65536, dtype=np.uint16).view(np.float16)
    q = gemm._fp16_grid_exponent(every)
    fin = every[np.isfinite(every)].astype(np.float64)
    assert q == 24 and np.all(np.ldexp(fin, q) == np.round(np.ldexp(fin, q)))
    assert gemm._fp16_grid_exponent(np.zeros(3, np.float16)) is None


def test_nvfp4_gemm_overflow_at_bf16_max():
    # C = (256 + w1) * 2^120 with global scales 2^60 * 2^60; bf16 max = 255 * 2^120, ulp there 2^120:
    # w1 = -0.5 -> 255.5: exactly max + ulp/2, a tie, RNE goes to the even neighbour 2^128 -> inf;
    # w1 = -1 -> 255 = max; w1 = -1.5 -> 254.5: a tie between 254 (even) and 255 -> 254; w1 = 0 -> 2^128 -> inf.
    K = 32
    xc = np.zeros((1, K), np.uint8)
    xc[0, 0] = xc[0, 16] = 2  # 1.0, 1.0
    wc = np.zeros((4, K), np.uint8)
    wc[:, 0] = 6  # 4.0 * scale 64 = 256
    wc[0, 16], wc[1, 16], wc[2, 16], wc[3, 16] = 9, 10, 11, 0  # -0.5, -1, -1.5, 0
    ws = np.tile(np.array([[0x68, 0x38]], np.uint8), (4, 1))
    ref = gemm.nvfp4_gemm(_nvt(xc, np.full((1, 2), 0x38, np.uint8), 2.0**60), _nvt(wc, ws, 2.0**60))
    bmax = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    assert bmax == 255 * 2.0**120
    out = ref.out.astype(np.float64)[0]
    assert out.tolist() == [np.inf, bmax, 254 * 2.0**120, np.inf]
    for j in range(4):
        assert out[j] == oracle_round(ref.exact_fraction((0, j)), "bfloat16")


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fp4ref import strategies as fst  # noqa: E402


@given(shape=fst.gemm_shapes(max_m=3, max_n=3, min_k=16, max_k=64, k_multiple_of=16), data=st.data())
def test_nvfp4_gemm_drawn_operands_against_fraction(shape, data):
    xo = data.draw(fst.nvfp4_operands(shape.M, shape.K))
    wo = data.draw(fst.nvfp4_operands(shape.N, shape.K))
    xq = NVFP4Tensor(codes=xo["codes"], scales=xo["scales"], global_decode_scale=xo["global_decode_scale"],
                     shape=(shape.M, shape.K), recipe="test", block=(1, 16), axis=1)
    wq = NVFP4Tensor(codes=wo["codes"], scales=wo["scales"], global_decode_scale=wo["global_decode_scale"],
                     shape=(shape.N, shape.K), recipe="test", block=(1, 16), axis=1)
    ref = gemm.nvfp4_gemm(xq, wq)
    ex = np.array([[_nv_exact(xq, wq, i, j) for j in range(shape.N)] for i in range(shape.M)], dtype=object)
    assert_matches_oracle(ref, ex, "bfloat16")


@given(shape=fst.gemm_shapes(max_m=3, max_n=3, min_k=4, max_k=40, k_multiple_of=4), data=st.data())
def test_sparse_drawn_operands_against_fraction(shape, data):
    vals, meta = data.draw(fst.sparse_a_operands(shape.M, shape.K, canonical=False, int8=True))
    b = data.draw(fst.e4m3_bytes((shape.N, shape.K)))
    ref = gemm.sparse_gemm_fp4_fp8(vals, meta, b)
    ex, nan = _sparse_exact(vals, meta, b)
    assert_matches_oracle(ref, ex, "bfloat16")


@given(shape=fst.gemm_shapes(max_m=3, max_n=3, max_k=40), data=st.data())
def test_fp16_drawn_operands_against_fraction(shape, data):
    A = data.draw(fst.fp16_matrices((shape.M, shape.K), max_exponent=14, min_exponent=-24))
    B = data.draw(fst.fp16_matrices((shape.N, shape.K), max_exponent=14, min_exponent=-24))
    ref = gemm.gemm_fp16(A, B)
    assert_matches_oracle(ref, _fp16_exact(A, B), "float16")


def test_gemm_fp16_certification_at_binade_bottoms_and_zero():
    # Exact results at and around powers of two (where the fp16 spacing halves below) and around zero, each row
    # carrying a cancelling pair 2^15 - 2^15 so the float64 exactness proof fails and the certification decides.
    ds = [0.0, 2.0**-12, -(2.0**-12), 2.0**-13, -(2.0**-13), 3 * 2.0**-13, -3 * 2.0**-13, 2.0**-11, -(2.0**-11),
          2.0**-24, -(2.0**-24)]
    rows = []
    for base in (1.0, 2.0**-14, 2.0**-13, 0.0, 1024.0):
        for d in ds:
            rows.append([base, d * max(base, 2.0**-14), 2.0**15, -(2.0**15), 0.0])
    A = np.array(rows, dtype=np.float64).astype(np.float16)
    B = np.array([[1.0, 1.0, 1.0, 1.0, 2.0**-24], [-1.0, -1.0, 1.0, 1.0, 2.0**-24]], np.float16)
    ref = gemm.gemm_fp16(A, B)
    assert_matches_oracle(ref, _fp16_exact(A, B), "float16")
    # a sum that cancels to -2^-48 (no cancelling pair of the rows above: the float64 sum itself is 0 here, and
    # the certification must not take it for an exact zero): -0.0, not +0.0
    A = np.array([[2.0**11, -(2.0**-24), -(2.0**11)]], np.float16)
    B = np.array([[2.0**12, 2.0**-24, 2.0**12]], np.float16)
    ref = gemm.gemm_fp16(A, B)
    assert _fp16_exact(A, B)[0, 0] == -Fraction(2) ** -48
    assert_matches_oracle(ref, _fp16_exact(A, B), "float16")
    assert np.signbit(ref.out.astype(np.float64)[0, 0])


def test_nvfp4_gemm_reads_bytes_never_values():
    """Scales given as ml_dtypes float8 (or any non-integer array) were converted by VALUE (a silent wrong result);
    they are refused like nvfp4_dequantize refuses them, and a non-positive global scale is refused too."""
    import dataclasses

    from fp4ref.blockscale import nvfp4_dequantize

    rng = np.random.default_rng(21)
    xq = nvfp4_quantize(rng.standard_normal((4, 64)).astype(np.float32), recipe="sol")
    wq = nvfp4_quantize(rng.standard_normal((3, 64)).astype(np.float32), recipe="sol")
    for bad in (xq.scales.view(ml_dtypes.float8_e4m3fn), xq.scales.astype(np.float32)):
        with pytest.raises(TypeError, match="xq.scales"):
            gemm.nvfp4_gemm(dataclasses.replace(xq, scales=bad), wq)
    with pytest.raises(TypeError, match="wq.codes"):
        gemm.nvfp4_gemm(xq, dataclasses.replace(wq, codes=wq.codes.astype(np.float64)))
    with pytest.raises(ValueError, match="xq is inconsistent"):
        gemm.nvfp4_gemm(dataclasses.replace(xq, codes=xq.codes[:, :16]), wq)
    for g in (-1.0, 0.0, float("inf")):
        with pytest.raises(ValueError, match="global_decode_scale"):
            gemm.nvfp4_gemm(dataclasses.replace(xq, global_decode_scale=np.float32(g)), wq)
        with pytest.raises(ValueError, match="global_decode_scale"):
            nvfp4_dequantize(dataclasses.replace(wq, global_decode_scale=np.float32(g)))


def test_nvfp4_linear_weight_global_decode_scale_beyond_float32_is_a_value_error():
    """weight_global_decode_scale is rounded to float32 once: a value that is inf or 0 there is refused with a
    ValueError naming it, an int beyond float64 (10**400) included (it was an OverflowError from the cast), and
    1e39 (was a RuntimeWarning, then an error not naming the argument); float32's extremes are taken."""
    x = np.ones((1, 16), np.float32)
    codes = np.full((1, 8), 0x22, np.uint8)  # every element 1.0
    scales = np.full((1, 1), 0x38, np.uint8)  # 1.0
    for bad in (10**400, -10**400, 10**39, 1e39, 2.0**128, 1e-46, -1.0):
        with pytest.raises(ValueError, match=r"^weight_global_decode_scale=.*expected a finite positive"):
            gemm.nvfp4_linear(x, codes, scales, bad)
    # x (16 ones) decodes to 1.0 within the float32 rounding of its own global decode scale (relative error
    # < 2^-20), so the output is bf16(16 * g) with g the float32 value of the argument: 16 * g where bf16 holds it,
    # 0 below bf16's least subnormal 2^-133, inf beyond bf16's max
    f32 = np.finfo(np.float32)
    for g, want in ((3, 48.0), (np.int64(3), 48.0), (2.0**120, 2.0**124), (float(f32.smallest_normal), 2.0**-122),
                    (float(f32.smallest_subnormal), 0.0), (float(f32.max), math.inf)):
        out = gemm.nvfp4_linear(x, codes, scales, g).out.astype(np.float64)
        assert out.tolist() == [[want]], (g, out)
    # the workload's reference on a row subset (x's amax given) checks it the same way; an NVFP4Tensor holding it
    # is refused when decoded
    w = get_workload("nvfp4_linear_n8192_k8192")
    with pytest.raises(ValueError, match=r"^weight_global_decode_scale=\(an int of 1329 bits\)"):
        w.reference(x=x, weight_fp4=codes, weight_scales=scales, weight_global_decode_scale=10**400,
                    x_global_amax=1.0)
    assert w.reference(x=x, weight_fp4=codes, weight_scales=scales, weight_global_decode_scale=3,
                       x_global_amax=1.0).out.astype(np.float64).tolist() == [[48.0]]
    wq = NVFP4Tensor(codes=codes, scales=scales, global_decode_scale=10**400, shape=(1, 16), recipe="sol",
                     block=(1, 16), axis=1)
    with pytest.raises(ValueError, match=r"^t\.global_decode_scale=\(an int of 1329 bits\): expected a finite"):
        nvfp4_dequantize(wq)


def test_nvfp4_linear_weight_global_decode_scale_takes_a_0d_array_or_tensor():
    """weight_global_decode_scale given as a 0-d or one-element numpy array (any real dtype; compressed-tensors
    stores it with shape [1], as an NVFP4Tensor's may be) or torch tensor is its element: x (16 ones) x W (16 ones,
    scale 1.0) gives bf16(16 g); an array of two elements, a bool and a complex are TypeErrors naming it. The
    workload's row-subset reference reads x_global_amax as a 0-d array or tensor."""
    x = np.ones((1, 16), np.float32)
    codes = np.full((1, 8), 0x22, np.uint8)  # every element 1.0
    scales = np.full((1, 1), 0x38, np.uint8)  # 1.0
    cases = [(np.array(3.0), 48.0), (np.array(3, np.int16), 48.0), (np.array(2.5, np.float16), 40.0),
             (np.array(0.375, ml_dtypes.bfloat16), 6.0), (np.array(0.875, ml_dtypes.float8_e4m3fn), 14.0),
             (np.array(2.0**-20, np.float32), 2.0**-16), (np.array(2**40 + 1, np.uint64), 2.0**44),
             (np.array([1.0], np.float32), 16.0), (np.array([[0.5]]), 8.0)]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        cases += [(torch.tensor(1.0), 16.0), (torch.tensor(0.5, dtype=torch.bfloat16), 8.0),
                  (torch.tensor([[0.25, -3.0]]).abs().max(), 48.0), (torch.tensor(2, dtype=torch.int64), 32.0),
                  (torch.tensor([2.0]), 32.0)]
    for g, want in cases:
        assert gemm.nvfp4_linear(x, codes, scales, g).out.astype(np.float64).tolist() == [[want]], g
    bad = [True, np.array(True), np.array(2 + 0j), np.array([1.0, 1.0]), np.array("1"), np.array(1.0, dtype=object),
           np.array([True])]
    if torch is not None:
        bad += [torch.tensor(True), torch.tensor([1.0, 2.0]), torch.tensor(1 + 1j)]
    for b in bad:
        with pytest.raises(TypeError, match="^weight_global_decode_scale must be a real number"):
            gemm.nvfp4_linear(x, codes, scales, b)
    w = get_workload("nvfp4_linear_n8192_k8192")
    for amax in (np.array(1.0, np.float32),) + ((torch.tensor(1.0),) if torch is not None else ()):
        out = w.reference(x=x, weight_fp4=codes, weight_scales=scales, weight_global_decode_scale=np.array(3.0),
                          x_global_amax=amax).out
        assert out.astype(np.float64).tolist() == [[48.0]]


def test_rounding_helpers_refuse_what_they_would_cast():
    """round_exact takes ints (numpy ones too) and refuses floats and bools (it read 3.5 as an int and failed deep
    inside); round_float64 takes floating arrays and refuses ints, bools and strings (np.asarray(.., float64) had
    parsed '1' and rounded ints above 2^53 on the way in)."""
    assert gemm.round_exact(np.int64(3), np.int64(-1), "bfloat16") == 1.5
    assert gemm.round_exact(-(2**60 + 1), -60, "float32") == -1.0  # a big int: still one rounding
    for n, s in ((3.5, -1), (True, 0), (3, 1.0), (3, False)):
        with pytest.raises(TypeError, match=r"^(n|s)=.*expected an int"):
            gemm.round_exact(n, s, "bfloat16")
    got = gemm.round_float64(np.array([1 + 2.0**-8, 3.0], ml_dtypes.bfloat16).astype(np.float32), "bfloat16")
    assert got.dtype == np.float64 and got.tolist() == [1.0, 3.0]
    assert gemm.round_float64(np.array([1.5], ml_dtypes.bfloat16), "float16").tolist() == [1.5]
    for x in (np.array(["1"]), np.array([2**53 + 1]), np.array([True]), [1, 2]):
        with pytest.raises(TypeError, match=r"^x must be a floating array"):
            gemm.round_float64(x, "bfloat16")


# ------------------------------------------------------------------------------------ non-native byte order

def _swapped(a: np.ndarray) -> np.ndarray:
    out = a.astype(a.dtype.newbyteorder("S"))
    assert not out.dtype.isnative
    return out


def _same_reference(r1, r0):
    assert r1.out.dtype == r0.out.dtype and r1.out.shape == r0.out.shape
    assert np.array_equal(r1.out.view(np.uint8), r0.out.view(np.uint8))
    assert np.array_equal(np.asarray(r1.exact).view(np.uint64), np.asarray(r0.exact).view(np.uint64))
    assert np.array_equal(np.asarray(r1.exact_err, np.float64), np.asarray(r0.exact_err, np.float64))
    assert r1.is_exact == r0.is_exact


def test_gemm_fp16_big_endian_operands():
    # 0x78FF = (1 + 255/1024) 2^15 = 40928 and 0x0070 = 112 * 2^-24: the exact A @ A.T = 40928^2 + 12544 * 2^-48
    # spans 65 bits, so float64 is not exact. Read as native uint16, '>f2' bits made the grid test see 0x7000 (8192)
    # as the smallest magnitude and flag the inexact float64 sum is_exact=True.
    A = np.array([[0x78FF, 0x0070]], np.uint16).view(np.float16)
    want = Fraction(40928) ** 2 + Fraction(112, 2**24) ** 2
    for a in (A, _swapped(A)):
        ref = gemm.gemm_fp16(a, a)
        assert not ref.is_exact and ref.exact_fraction((0, 0)) == want
        assert np.isinf(ref.out[0, 0]) and ref.out[0, 0] > 0  # 1.675e9 overflows fp16
    _same_reference(gemm.gemm_fp16(_swapped(A), _swapped(A)), gemm.gemm_fp16(A, A))
    rng = np.random.default_rng(21)
    for _ in range(5):
        A = rng.integers(0, 1 << 16, (5, 24), dtype=np.uint64).astype(np.uint16).view(np.float16)
        B = rng.integers(0, 1 << 16, (4, 24), dtype=np.uint64).astype(np.uint16).view(np.float16)
        A[~np.isfinite(A)] = 0
        B[~np.isfinite(B)] = 0
        r0 = gemm.gemm_fp16(A, B)
        _same_reference(gemm.gemm_fp16(_swapped(A), B), r0)
        r1 = gemm.gemm_fp16(_swapped(A), _swapped(B))
        _same_reference(r1, r0)
        assert all(r1.exact_fraction(idx) == frac_dot(A[idx[0]], B[idx[1]]) for idx in [(0, 0), (4, 3)])


def test_nvfp4_big_endian_inputs():
    rng = np.random.default_rng(22)
    K, N = 32, 3
    wq = nvfp4_quantize(rng.standard_normal((N, K)).astype(np.float32), recipe="sol")
    x = rng.standard_normal((2, K)).astype(np.float32)
    g = np.float32(wq.global_decode_scale)
    r0 = gemm.nvfp4_linear(x, wq.codes, wq.scales, g)
    _same_reference(gemm.nvfp4_linear(_swapped(x), wq.codes, wq.scales, _swapped(np.array(g))), r0)
    xq = nvfp4_quantize(x, recipe="sol")
    r0 = gemm.nvfp4_gemm(xq, wq)
    xq_be = NVFP4Tensor(codes=_swapped(xq.codes.astype(np.uint16)), scales=_swapped(xq.scales.astype(np.uint16)),
                        global_decode_scale=_swapped(np.array(xq.global_decode_scale)), shape=xq.shape,
                        recipe=xq.recipe, block=xq.block, axis=xq.axis)
    _same_reference(gemm.nvfp4_gemm(xq_be, wq), r0)


def test_round_float64_big_endian():
    x = np.array([1 + 2.0**-8 + 2.0**-40, -(1 + 2.0**-11), 65520.0, 2.0**-25 * 1.5])
    for name in ("bfloat16", "float16", "float32"):
        want = gemm.round_float64(x, name)
        assert np.array_equal(gemm.round_float64(_swapped(x), name).view(np.uint64), want.view(np.uint64))


# ------------------------------------------------------------------------------------ exact_fraction's index

def test_exact_fraction_index_checks():
    A = np.array([[1, 2, 3], [0.5, -1, 4]], np.float16)
    B = np.array([[1, 1, 1], [2, 0, 0.25], [-1, 3, 0], [0, 0, 1]], np.float16)
    ref = gemm.gemm_fp16(A, B)
    assert ref.exact_fraction((1, 2)) == Fraction(-1, 2) - 3  # 0.5 * -1 + -1 * 3 + 4 * 0
    assert ref.exact_fraction((np.int64(0), np.uint8(1))) == 2 + Fraction(3, 4)
    assert ref.exact_fraction((-1, -1)) == ref.exact_fraction((1, 3)) == 4  # negative: from the end, as numpy
    assert ref.exact_fraction((-2, 0)) == 6
    for bad in ((1.7, 2.9), (True, False), (1, 2.0), (np.float64(1), 0), ("1", 0)):
        with pytest.raises(TypeError, match=r"^index=.*expected a tuple of 2 int\(s\) .*shape \(2, 4\).*got an entry"):
            ref.exact_fraction(bad)
    for bad in (1, [1, 2], np.array([1, 2]), None):
        with pytest.raises(TypeError, match=r"^index=.*expected a tuple of 2 int\(s\)"):
            ref.exact_fraction(bad)
    for bad in ((1,), (0, 1, 2), ()):
        with pytest.raises(ValueError, match=r"^index=.* has \d entries; expected a tuple of 2"):
            ref.exact_fraction(bad)
    for bad in ((2, 0), (0, 4), (-3, 0), (0, -5), (10**30, 0)):
        with pytest.raises(IndexError, match=rf"^index={re.escape(repr(bad))} is out of range for shape \(2, 4\)"):
            ref.exact_fraction(bad)


def test_exact_fraction_negative_index_nd_nvfp4_linear():
    rng = np.random.default_rng(23)
    K, N = 32, 3
    wq = nvfp4_quantize(rng.standard_normal((N, K)).astype(np.float32), recipe="sol")
    x = rng.standard_normal((2, 3, K)).astype(ml_dtypes.bfloat16)
    ref = gemm.nvfp4_linear(x, wq.codes, wq.scales, float(wq.global_decode_scale))
    xq = nvfp4_quantize(x.reshape(6, K), recipe="sol")
    for idx in np.ndindex(ref.shape):
        want = _nv_exact(xq, wq, idx[0] * 3 + idx[1], idx[2])
        neg = tuple(i - n for i, n in zip(idx, ref.shape))
        assert ref.exact_fraction(idx) == ref.exact_fraction(neg) == want, idx
    with pytest.raises(IndexError, match=r"index=\(0, 3, 0\) is out of range for shape \(2, 3, 3\)"):
        ref.exact_fraction((0, 3, 0))
    with pytest.raises(ValueError, match=r"expected a tuple of 3 int"):
        ref.exact_fraction((0, 0))
    r1 = gemm.nvfp4_linear(x[0, 0], wq.codes, wq.scales, float(wq.global_decode_scale))  # x [K]: out [N]
    assert r1.shape == (N,)
    want = _nv_exact(nvfp4_quantize(x[0, :1], recipe="sol"), wq, 0, 2)  # x[0, 0] alone: its own global amax
    assert r1.exact_fraction(-1) == r1.exact_fraction((2,)) == r1.exact_fraction(np.int32(2)) == want


def test_nvfp4_linear_k0_and_recipe_name():
    with pytest.raises(ValueError, match=r"^x has shape \(2, 0\): its last dimension K is 0"):
        gemm.nvfp4_linear(np.zeros((2, 0), np.float32), np.zeros((3, 0), np.uint8), np.zeros((3, 0), np.uint8), 1.0)
    # K = 24: weights of the matching [N, 12] / [N, 1] shapes do not make it a whole number of 16-element blocks
    with pytest.raises(ValueError, match=r"^x has shape \(1, 24\): its last dimension K is 24, .* multiple of 16"):
        gemm.nvfp4_linear(np.ones((1, 24), np.float32), np.ones((4, 12), np.uint8), np.ones((4, 1), np.uint8), 1.0)
    rng = np.random.default_rng(24)
    wq = nvfp4_quantize(rng.standard_normal((2, 16)).astype(np.float32), recipe="sol")
    x = rng.standard_normal((1, 16)).astype(np.float32)
    outs = []
    for recipe in (NVFP4Recipe.TE, "te", "TE"):
        ref = gemm.nvfp4_linear(x, wq.codes, wq.scales, 1.0, recipe=recipe)
        assert ref.description["recipe"] == "te"
        outs.append(ref.out.view(np.uint16))
    assert all(np.array_equal(o, outs[0]) for o in outs)
    assert gemm.nvfp4_linear(x, wq.codes, wq.scales, 1.0).description["recipe"] == "sol"
    with pytest.raises(ValueError, match=r"recipe='nope' is not one of"):
        gemm.nvfp4_linear(x, wq.codes, wq.scales, 1.0, recipe="nope")
    xn = x.copy()
    xn[0, 3] = np.inf
    with pytest.raises(ValueError, match=r"with the 'te' recipe"):
        gemm.nvfp4_linear(xn, wq.codes, wq.scales, 1.0, recipe=NVFP4Recipe.TE)
