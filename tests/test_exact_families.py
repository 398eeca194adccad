"""The exact-accumulation families provably exceed the accumulators they are meant to catch.

For each family, at the workload's GPU and CPU sizes (K as verify runs it; a few rows and columns, since the
property is per output element):

* an independent integer model (products as integers on the family's grid, prefix sums in int64) shows that every
  output element's partial sums pass the accumulator's exact range (2^13 on the 2^-1 grid for a 14-bit fp8
  accumulator; 2^11 for fp16), and that every promotion chunk stays inside it (so the promoted model is exact);
* fp4ref.bounds.simulate shows the promoted / fp32 models give the exact sums (the verdict passes), and the
  unpromoted 14-bit model (sparse) or an fp16 / bf16 accumulator (fp16 GEMM) fails the exact-accumulation verdict;
* the outputs are finite in the output format.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp4ref import bounds, gemm
from fp4ref.packing import decompress_2to4
from fp4ref.workloads import get_workload

E4M3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
SPARSE = get_workload("sparse_gemm_fp4_fp8_n2048_k2048")
FP16 = get_workload("gemm_n3072_k2048")


def _ks(w):
    return sorted({w.dims(False)[1], w.dims(True)[1]})


def _bf16(x):
    return gemm.round_float64(x, "bfloat16").astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("k", _ks(SPARSE))
def test_sparse_exact_acc_exceeds_an_unpromoted_fp8_accumulator(k):
    rng = np.random.default_rng([18, k])
    ops = SPARSE.families["exact_acc"](rng, 6, 48, k)
    ref = gemm.sparse_gemm_fp4_fp8(**ops)
    A = decompress_2to4(ops["a_vals"].view(np.uint8), ops["a_meta"].view(np.uint8)).astype(np.float64)
    B = E4M3[ops["b_fp8"].view(np.uint8)]
    assert np.all(np.isfinite(ref.out.astype(np.float64))) and np.any(ref.exact != 0)

    # Independent integer model: 2 A is an integer, B is an integer, so 2 * products are integers.
    P = (2 * A).astype(np.int64)[:, None, :] * B.astype(np.int64)[None, :, :]  # [M, N, K], units of 2^-1
    prefix = np.cumsum(P, axis=-1)
    assert np.all(np.abs(prefix).max(axis=-1) >= 2 * 2**13 * 1.5), "an element's partial sums stay in 14 bits"
    # after the partial sum first passes 2^13, products with a 2^-1 bit still follow (an accumulator with ulp >= 1
    # must drop them)
    first = np.argmax(np.abs(prefix) >= 2 * 2**13, axis=-1)
    odd_after = (P % 2 != 0) & (np.arange(k) > first[..., None])
    assert np.all(odd_after.sum(axis=-1) >= 16)
    # every 128-product chunk, in any order, stays below 2^13 (14 bits on the 2^-1 grid): promotion is exact
    chunks = np.abs(P).reshape(P.shape[0], P.shape[1], -1, 128).sum(axis=-1)
    assert chunks.max() < 2 * 2**13

    promoted = bounds.simulate(A, B, "hopper_fp8_wgmma_promote(128)")
    np.testing.assert_array_equal(promoted, ref.exact)
    np.testing.assert_array_equal(bounds.simulate(A, B, "fp32_rn"), ref.exact)
    bounds.check(_bf16(promoted), ref, "hopper_fp8_wgmma_promote(128)", exact_accumulation=True).assert_ok()

    for order in (slice(None), slice(None, None, -1)):  # in K order and reversed
        unpromoted = bounds.simulate(A[:, order], B[:, order], "hopper_fp8_wgmma")
        rep = bounds.check(_bf16(unpromoted), ref, "hopper_fp8_wgmma_promote(128)", exact_accumulation=True)
        assert not rep.ok and rep.not_equal_exact >= ref.out.size // 4, rep.summary()


def _int_scale(x):
    x = x.astype(np.float64)
    for s in range(40):
        if np.all(np.ldexp(x, s) == np.round(np.ldexp(x, s))):
            return s
    raise AssertionError("not on a power-of-two grid")


def _sequential(A, B, fmt):
    """Recursive summation in K order with every partial sum rounded (RNE) to ``fmt``: an fp16/bf16 accumulator.

    The products of fp16 values are exact in float64, and so is acc + product before the one rounding."""
    P = A.astype(np.float64)[:, None, :] * B.astype(np.float64)[None, :, :]
    acc = np.zeros(P.shape[:2])
    for j in range(P.shape[-1]):
        acc = gemm.round_float64(acc + P[..., j], fmt)
    return acc


@pytest.mark.parametrize("k", _ks(FP16))
def test_fp16_exact_acc_exceeds_fp16_and_bf16_accumulators(k):
    rng = np.random.default_rng([18, k])
    ops = FP16.families["exact_acc"](rng, 4, 24, k)
    A, B = ops["A"], ops["B"]
    ref = gemm.gemm_fp16(A, B)
    assert np.all(np.isfinite(ref.out.astype(np.float64))) and np.any(ref.exact != 0)

    # Independent integer model: the smallest power-of-two scales making A and B integers; products are then
    # integers in units of u = 2^-(ea + eb).
    ea, eb = _int_scale(A), _int_scale(B)
    ia = np.ldexp(A.astype(np.float64), ea).astype(np.int64)
    ib = np.ldexp(B.astype(np.float64), eb).astype(np.int64)
    P = ia[:, None, :] * ib[None, :, :]
    prefix = np.cumsum(P, axis=-1)
    one = 2 ** (ea + eb)
    # every element's partial sums pass 2^11 (an fp16 accumulator's ulp is >= 2 there; bf16's >= 16), and
    # many of its products are not multiples of 2
    assert np.all(np.abs(prefix).max(axis=-1) >= 2**11 * one)
    assert np.all(((P % (2 * one)) != 0).sum(axis=-1) >= 64)
    # any order: every partial sum is an integer number of units below 2^24: exact in fp32; and below 2^15
    assert np.abs(P).sum(axis=-1).max() < min(2**24, 2**15 * one)

    for model in ("fp32_rn", "hopper_fp16_wgmma"):
        np.testing.assert_array_equal(bounds.simulate(A, B, model), ref.exact, err_msg=model)
    bounds.check(ref.out.copy(), ref, "fp32_rn", exact_accumulation=True).assert_ok()
    for fmt in ("float16", "bfloat16"):
        out = gemm.round_float64(_sequential(A, B, fmt), "float16").astype(np.float16)
        rep = bounds.check(out, ref, "fp32_rn", exact_accumulation=True)
        assert not rep.ok and rep.not_equal_exact >= ref.out.size // 2, (fmt, rep.summary())


@pytest.mark.parametrize("k", _ks(SPARSE))
def test_sparse_subnormal_b_is_exact_and_shows_a_flushing_decode(k):
    """subnormal_b: every B byte an E4M3FN subnormal (exponent field 0, mantissa 1..7); in integers on the 2^-10
    grid (v = e2m1 * 2 and b = m: v * b units of 2^-10) every 128-product chunk stays below 2^13 units and every
    prefix sum below 2^24, so fp32 and fp8 wgmma promoted every 128 are exact; a decode that flushes subnormal B to
    zero fails the exact verdict (and the ordinary bound)."""
    rng = np.random.default_rng(k)
    ops = SPARSE.families["subnormal_b"](rng, 6, 48, k)
    b = ops["b_fp8"].view(np.uint8)
    assert np.all((b & 0x78) == 0) and np.all((b & 0x07) != 0)  # subnormal: exponent 0, mantissa non-zero
    ref = SPARSE.reference(**ops)
    A = decompress_2to4(ops["a_vals"].view(np.uint8), ops["a_meta"].view(np.uint8)).astype(np.float64)
    Ai = (2 * A).astype(np.int64)  # e2m1 sums on 2^-1 Z, exactly
    Bi = ((b & 0x07).astype(np.int64)) * np.where(b & 0x80, -1, 1)  # b = m * 2^-9
    P = Ai[:, None, :] * Bi[None, :, :]  # units of 2^-10
    chunks = P.reshape(P.shape[0], P.shape[1], -1, 128).sum(axis=-1)
    assert np.abs(chunks).max() < 2**13 and np.abs(np.cumsum(P, axis=-1)).max() < 2**24
    np.testing.assert_array_equal(P.sum(axis=-1) * 2.0**-10, ref.exact)
    for model in ("fp32_rn", "hopper_fp8_wgmma_promote(128)"):
        sim = bounds.simulate(A, E4M3[b], model)
        np.testing.assert_array_equal(sim, ref.exact, err_msg=model)
        bounds.check(_bf16(sim), ref, model, exact_accumulation=True).assert_ok()
    assert np.mean(ref.out.astype(np.float64) != ref.exact) > 0.25  # the outputs need rounding
    flushed = np.zeros_like(ref.out)  # every product of a flushed B is zero
    for model in ("fp32_rn", "hopper_fp8_wgmma_promote(128)"):
        assert not bounds.check(flushed, ref, model, exact_accumulation=True).ok
        assert not bounds.check(flushed, ref, model).ok


NVFP4 = get_workload("nvfp4_linear_n8192_k8192")


@pytest.mark.parametrize("k", _ks(NVFP4))
def test_nvfp4_exact_acc_is_exact_and_shows_truncating_stores(k):
    """exact_acc (NVFP4): x quantizes by the "sol" recipe to exactly the planted codes (global scale 1, block scales
    448); in integers on the 112 Z grid every prefix sum of x_deq * w_deq stays below 2^24 / 7 units, so fp32 and
    the tensor-core models sum exactly, and the global scales' product 2^-3 scales exactly: the output must be
    RNE(C), which the workload's double rounding bf16(bf16(acc) * 2^-3) also gives; a truncating store and a bf16
    accumulator fail the exact verdict."""
    from fp4ref.blockscale import nvfp4_dequantize, nvfp4_quantize
    from fp4ref.packing import unpack_fp4

    rng = np.random.default_rng(k)
    m, n = 3, 40
    ops = NVFP4.families["exact_acc"](rng, m, n, k)
    x = ops["x"].reshape(m, k).astype(np.float64)
    xq = nvfp4_quantize(ops["x"].reshape(m, k), recipe="sol")
    assert float(xq.global_decode_scale) == 1.0 and np.all(xq.scales == 126)  # E4M3FN 448
    np.testing.assert_array_equal(nvfp4_dequantize(xq, np.float64), x)  # the planted values, exactly
    e2m1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    W = e2m1[unpack_fp4(ops["weight_fp4"])]  # block scales 1.0
    assert np.all(ops["weight_scales"].view(np.uint8) == 0x38) and ops["weight_global_decode_scale"] == 0.125
    Xi, Wi = (x / 224).astype(np.int64), (2 * W).astype(np.int64)  # x on 224 Z, w on 2^-1 Z: products on 112 Z
    P = Xi[:, None, :] * Wi[None, :, :]
    assert 7 * np.abs(np.cumsum(P, axis=-1)).max() < 2**24  # 112 u = 16 * 7 u: exact in fp32
    acc = P.sum(axis=-1) * 112.0
    ref = NVFP4.reference(**ops)
    assert ref.out.shape == (1, m, n)
    exact = acc * 0.125
    for i in range(m):
        for j in range(n):
            assert ref.exact_fraction((0, i, j)) == exact[i, j]
    want = _bf16(exact)
    np.testing.assert_array_equal(ref.out.reshape(m, n).view(np.uint16), want.view(np.uint16))
    twice = _bf16(_bf16(acc).astype(np.float64) * 0.125)  # the workload's double rounding
    np.testing.assert_array_equal(twice.view(np.uint16), want.view(np.uint16))
    assert np.mean(want.astype(np.float64) != exact) > 0.5  # outputs need rounding
    for model in ("fp32_rn", "hopper_fp16_wgmma", "splitk(hopper_fp16_wgmma, 512)"):
        sim = bounds.simulate(x, W, model)
        np.testing.assert_array_equal(sim, acc, err_msg=model)
        out = _bf16(sim * 0.125).reshape(1, m, n)
        bounds.check(out, ref, model, exact_accumulation=True).assert_ok()
    truncated = (want.astype(np.float64) != exact) & (np.abs(want.astype(np.float64)) > np.abs(exact))
    assert truncated.any()
    rz = np.where(truncated, np.nextafter(want, np.zeros_like(want)), want).reshape(1, m, n)
    assert not bounds.check(rz, ref, "hopper_fp16_wgmma", exact_accumulation=True).ok
    bf16_acc = np.zeros((m, n))
    for kk in range(k):  # partial sums kept in bf16
        bf16_acc = _bf16(bf16_acc + x[:, None, kk] * W[None, :, kk]).astype(np.float64)
    assert not bounds.check(_bf16(bf16_acc * 0.125).reshape(1, m, n), ref, "hopper_fp16_wgmma",
                            exact_accumulation=True).ok
