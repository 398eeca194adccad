"""Accumulation models: registry, soundness against a numpy simulator (Hypothesis, adversarial magnitudes),
tightness on constructed inputs, and check()'s report fields."""
from __future__ import annotations

import math
import re
from dataclasses import replace
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fp4ref import bounds, gemm
from fp4ref import strategies as fst
from fp4ref.blockscale import NVFP4Tensor
from fp4ref.packing import pack_fp4

SIMULATED_16BIT = ["fp32_rn", "ampere_fp16", "hopper_fp16_wgmma", "blackwell_fp8", "splitk(hopper_fp16_wgmma, 64)",
                   "splitk(fp32_rn, 48)"]
SIMULATED_FP8 = ["hopper_fp8_wgmma", "hopper_fp8_wgmma_promote(128)", "hopper_fp8_wgmma_promote(32)",
                 "blackwell_fp8"]
E4M3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


# ---------------------------------------------------------------------------------------------------------------
# registry and formulas
# ---------------------------------------------------------------------------------------------------------------


def test_registry_names_and_lookup():
    for name in ["exact", "fp32_rn", "ampere_fp16", "hopper_fp16_wgmma", "hopper_fp8_wgmma", "blackwell_fp8",
                 "tc_fp32_universal"]:
        m = bounds.get_model(name)
        assert m.name == name and m.source
    p = bounds.get_model("hopper_fp8_wgmma_promote(128)")
    assert p.promote_every == 128 and p.F == 13 and p.acc_p == 14
    s = bounds.get_model("splitk(hopper_fp16_wgmma, 512)")
    assert s.chunk == 512 and s.inner.name == "hopper_fp16_wgmma"
    with pytest.raises(ValueError, match="not a known accumulation model"):
        bounds.get_model("volta")
    with pytest.raises(TypeError):
        bounds.get_model(3)
    with pytest.raises(ValueError, match="positive int"):
        bounds.hopper_fp8_wgmma_promote(0)


def test_eps_formulas_by_hand():
    u = 2.0**-24
    assert bounds.get_model("exact").eps(4096) == 0
    assert bounds.get_model("fp32_rn").eps(100) == pytest.approx(100 * u / (1 - 100 * u), rel=1e-15)
    assert bounds.get_model("tc_fp32_universal").eps(2048) == 2048 * 2.0**-22
    # Hopper fp16: t = K 2^-25 + ceil(K/16) 2^-23
    t = 2048 * 2.0**-25 + 128 * 2.0**-23
    assert bounds.get_model("hopper_fp16_wgmma").eps(2048) == pytest.approx(t / (1 - t), rel=1e-15)
    # Hopper fp8 without promotion ~ 1.06 K 2^-13 (DeepSeek-V3 report §3.3.2) and useless at K = 2048
    e8 = bounds.get_model("hopper_fp8_wgmma").eps(2048)
    t8 = 2048 * 2.0**-13 + 64 * 2.0**-13  # 1.03 K 2^-13 before the carried-error factor 1/(1 - t)
    assert e8 == pytest.approx(t8 / (1 - t8), rel=1e-15) and e8 > 0.3
    # promotion every 128: ~1.06 * 128 * 2^-13 + 16 * 2^-24
    ep = bounds.get_model("hopper_fp8_wgmma_promote(128)").eps(2048)
    t8 = 128 * 2.0**-13 + 4 * 2.0**-13
    e_in = t8 / (1 - t8)
    assert ep == pytest.approx(e_in + 16 * u / (1 - 16 * u) * (1 + e_in), rel=1e-14)
    assert ep == pytest.approx(1.0625 * 128 * 2.0**-13 + 16 * 2.0**-24, rel=0.03)
    # every fp32-accumulating tensor-core model is inside the universal bound
    for name in ["ampere_fp16", "hopper_fp16_wgmma", "blackwell_fp8", "fp32_rn"]:
        for K in (1, 16, 100, 2048, 8192):
            assert bounds.get_model(name).eps(K) <= bounds.get_model("tc_fp32_universal").eps(K)


def test_model_names_are_read_in_any_case():
    assert bounds.get_model("FP32_RN") is bounds.get_model("fp32_rn")
    assert bounds.get_model(" Hopper_BF16_WGMMA ") is bounds.get_model("hopper_fp16_wgmma")  # an alias, any case
    assert bounds.get_model("HOPPER_FP8_WGMMA_PROMOTE(128)") == bounds.get_model("hopper_fp8_wgmma_promote(128)")
    s = bounds.get_model("SplitK(FP32_RN, 128)")
    assert s == bounds.get_model("splitk(fp32_rn, 128)") and s.name == "splitk(fp32_rn, 128)"
    with pytest.raises(ValueError, match="not a known accumulation model"):
        bounds.get_model("SPLITK(volta, 128)")


@pytest.mark.parametrize("name", ["exact", "fp32_rn", "hopper_fp8_wgmma_promote(128)", "splitk(fp32_rn, 128)"])
def test_K_is_a_positive_int_for_eps_describe_and_model_for(name):
    m = bounds.get_model(name)
    assert m.eps(np.int64(100)) == m.eps(100) and "eps_acc(K=100)" in m.describe(np.int32(100))
    c = bounds.NumericContract(inputs="x", output="float16", model=name)
    for K in (2.5, np.float64(4.0), True, np.True_, "2048", None):
        with pytest.raises(TypeError, match=r"K=.*must be an int"):
            m.eps(K)
        with pytest.raises(TypeError, match=r"K=.*must be an int"):
            c.model_for(None, K)
        if K is not None:  # describe() without K leaves eps out
            with pytest.raises(TypeError, match=r"K=.*must be an int"):
                m.describe(K)
    for K in (0, -1, np.int64(0)):
        for call in (m.eps, m.describe, lambda K: c.model_for(None, K)):
            with pytest.raises(ValueError, match=r"K=.*must be >= 1"):
                call(K)


def test_bound_of_an_empty_sum_has_no_accumulation_term():
    """K = 0 (an empty reduction) is a valid GEMM: its bound holds no accumulation error, whatever the model."""
    ref = gemm.gemm_fp16(np.zeros((2, 0), np.float16), np.zeros((3, 0), np.float16))
    assert ref.K == 0
    for name in ("fp32_rn", "tc_fp32_universal", "splitk(fp32_rn, 128)"):
        terms = bounds.bound(ref, name)
        assert terms.eps_acc == 0 and not terms.accumulation.any()
        assert bounds.check(np.zeros((2, 3), np.float16), ref, name).ok


def _sparse_ref(K, seed=0):
    from fp4ref.packing import compress_2to4

    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (2, K)).astype(np.uint8)
    codes[:, 2::4] = 0
    codes[:, 3::4] = 0
    vals, meta = compress_2to4(codes)
    return gemm.sparse_gemm_fp4_fp8(vals, meta, rng.integers(0, 0x7E, (4, K)).astype(np.uint8))


def test_a_model_with_no_finite_bound_at_K_is_refused_not_passed():
    """hopper_fp8_wgmma's eps_acc(K) is inf from K = 7943: every element's bound was inf, check passed an output of
    12345 everywhere with "max err/bound 0". It is a ValueError (bound, check, assert_gemm_close), before any
    element is compared, naming the model, K and the first K the model gives out at (3971: eps_acc >= 1 there)."""
    from fp4ref import testing

    ref = _sparse_ref(8192)
    wrong = np.full(ref.out.shape, 12345.0, ml_dtypes.bfloat16)
    msg = r"'hopper_fp8_wgmma' gives no useful bound at K=8192: .* K >= 3971, .*100% error.*promote.*splitk"
    for call in (lambda: bounds.check(wrong, ref, "hopper_fp8_wgmma"),
                 lambda: bounds.check(ref.out.copy(), ref, "hopper_fp8_wgmma"),  # the right output as well
                 lambda: bounds.check(wrong, ref, "hopper_fp8_wgmma", exact_accumulation=True),
                 lambda: bounds.bound(ref, "hopper_fp8_wgmma"),
                 lambda: testing.assert_gemm_close(wrong, ref, "hopper_fp8_wgmma")):
        with pytest.raises(ValueError, match=msg):
            call()
    # split-K over it inherits it, also at K = 8000 inside one chunk (eps was NaN there: 0 * inf)
    ref8000 = _sparse_ref(8000)
    with pytest.raises(ValueError, match=r"'splitk\(hopper_fp8_wgmma, 8192\)' gives no useful bound at K=8000"):
        bounds.check(ref8000.out.copy(), ref8000, "splitk(hopper_fp8_wgmma, 8192)")
    # a model with a finite bound at that K still checks: the promoted fp8 model fails the wrong output
    rep = bounds.check(wrong, ref, "hopper_fp8_wgmma_promote(128)")
    assert not rep.ok and rep.n_violations > 0


def _positive_fp16_ref(K, seed=0):
    rng = np.random.default_rng(seed)
    A = np.abs(rng.standard_normal((2, K))).astype(np.float16)
    B = np.abs(rng.standard_normal((3, K))).astype(np.float16)
    return gemm.gemm_fp16(A, B)


def test_a_model_whose_eps_reaches_1_is_refused_an_all_zero_output_passed():
    """eps_acc(K) >= 1 is already vacuous: |exact| <= |A||B|, so out = 0 is within eps_acc(K) |A||B| of it. For
    hopper_fp8_wgmma, t = (K + ceil(K/32)) 2^-13 and eps = t / (1 - t) >= 1 once t >= 1/2: K = 3971
    (3971 + 125 = 4096 = 2^12). check passed all zeros there for all-positive inputs; it is refused now."""
    ref = _positive_fp16_ref(3971)
    assert ref.K == 3971
    with pytest.raises(ValueError, match=r"'hopper_fp8_wgmma' gives no useful bound at K=3971: its eps_acc\(K\) is "
                                         r">= 1 for every K >= 3971, .*100% error.*all-zero output would pass"):
        bounds.check(np.zeros_like(ref.out), ref, "hopper_fp8_wgmma")
    with pytest.raises(ValueError, match=r"'hopper_fp8_wgmma' gives no useful bound at K=3971"):
        bounds.bound(ref, "hopper_fp8_wgmma")
    # fp32_rn: gamma_K(2^-24) = 1 at K = 2^23 (the message names it; the eps is computed, no reference built)
    with pytest.raises(ValueError, match=r"'fp32_rn' gives no useful bound at K=8388608: .* K >= 8388608,"):
        raise ValueError(bounds.no_bound_message("fp32_rn", 2**23))


def test_a_model_just_below_its_vacuous_K_still_checks():
    # K = 3970: t = (3970 + ceil(3970/32)) 2^-13 = 4095/8192, eps = t / (1 - t) = 4095/4097 < 1, so check runs
    ref = _positive_fp16_ref(3970)
    assert bounds.bound(ref, "hopper_fp8_wgmma").eps_acc == pytest.approx(4095 / 4097, rel=1e-14)
    rep = bounds.check(ref.out.copy(), ref, "hopper_fp8_wgmma")
    assert rep.ok and rep.bitwise_equal_fraction == 1.0 and rep.K == 3970
    # the bound is still a bound: -C is 2|C| away from C (all products positive: |C| = |A||B|), beyond it
    assert not bounds.check(-ref.out, ref, "hopper_fp8_wgmma").ok


def test_vacuous_from_is_the_first_K_with_eps_at_least_1():
    # by brute force from the formulas: the smallest K with t = (K + ceil(K/32)) 2^-13 >= 1/2 (hopper fp8:
    # t / (1 - t) >= 1), K 2^-24 >= 1/2 (fp32 RN: gamma_K(2^-24) >= 1), K 2^-22 >= 1 (tc_fp32_universal); a split-K
    # model gives out where its chunk's model does, or where gamma_{ceil(K/C)-1}(2^-24) reaches 1, gamma_{ceil(K/C)}
    # with exact chunks (each partial is rounded to fp32 too: splitk(exact, 4096): ceil(K/4096) >= 2^23,
    # K = 4096 * (2^23 - 1) + 1)
    fp8 = next(K for K in range(1, 10**4) if 2 * (K + -(-K // 32)) >= 2**13)
    assert fp8 == 3971
    want = {"hopper_fp8_wgmma": fp8, "fp32_rn": 2**23, "tc_fp32_universal": 2**22,
            "splitk(hopper_fp8_wgmma, 8192)": fp8, "splitk(hopper_fp8_wgmma, 4096)": fp8,
            "splitk(exact, 4096)": 4096 * (2**23 - 1) + 1, "hopper_fp8_wgmma_promote(10000)": fp8, "exact": None}
    for name, first in want.items():
        m = bounds.get_model(name)
        assert m.vacuous_from() == first, name
        if first is not None:
            assert m.eps(first) >= 1 and m.eps(first - 1) < 1, name


# ---------------------------------------------------------------------------------------------------------------
# soundness: the simulator never exceeds the model's bound
# ---------------------------------------------------------------------------------------------------------------


def _accumulator_violation(acc, A64, B64, model, K):
    exact = np.array([[math.fsum(A64[i] * B64[j]) for j in range(B64.shape[0])] for i in range(A64.shape[0])])
    P = np.abs(A64) @ np.abs(B64).T
    eps = bounds.get_model(model).eps(K)
    err = np.abs(acc - exact)
    return err, eps * P


@pytest.mark.parametrize("model", SIMULATED_16BIT)
@given(shape=fst.gemm_shapes(max_m=3, max_n=3, max_k=300), data=st.data())
def test_simulated_16bit_models_within_bound(model, shape, data):
    A = data.draw(fst.fp16_matrices((shape.M, shape.K), max_exponent=6, min_exponent=-12))
    B = data.draw(fst.fp16_matrices((shape.N, shape.K), max_exponent=6, min_exponent=-12))
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    acc = bounds.simulate(A, B, model)
    err, lim = _accumulator_violation(acc, A64, B64, model, shape.K)
    assert np.all(err <= lim), (model, float(np.max(err - lim)))
    # and end to end through check(): RNE output, and a truncated (faithful) output
    ref = gemm.gemm_fp16(A, B)
    out = gemm.round_float64(acc, "float16").astype(np.float16)
    bounds.check(out, ref, model).assert_ok()
    tr = np.trunc(np.ldexp(acc, -(np.maximum(np.frexp(acc)[1] - 1, -14) - 10)))
    out_rz = np.ldexp(tr, np.maximum(np.frexp(acc)[1] - 1, -14) - 10)
    out_rz = np.clip(out_rz, -65504, 65504).astype(np.float16)
    bounds.check(out_rz, ref, model, output_rounding="faithful").assert_ok()


@pytest.mark.parametrize("model", SIMULATED_FP8)
@given(shape=fst.gemm_shapes(max_m=3, max_n=3, max_k=400), data=st.data())
def test_simulated_fp8_models_within_bound(model, shape, data):
    a = data.draw(fst.e4m3_bytes((shape.M, shape.K)))
    b = data.draw(fst.e4m3_bytes((shape.N, shape.K)))
    A64, B64 = E4M3[a], E4M3[b]
    acc = bounds.simulate(A64, B64, model)
    err, lim = _accumulator_violation(acc, A64, B64, model, shape.K)
    assert np.all(err <= lim), (model, float(np.max(err - lim)))


# ---------------------------------------------------------------------------------------------------------------
# tightness: constructed inputs reach a stated fraction of each bound
# ---------------------------------------------------------------------------------------------------------------


def _tight_pair(K, t_a, t_b):
    a = np.full((1, K), t_a)
    b = np.full((1, K), t_b)
    a[0, 0] = b[0, 0] = 1.0
    return a, b


@pytest.mark.parametrize(
    "model, t_a, t_b, fmt, want, K",
    [
        # 1 followed by products just under the half-ulp of 1 in fp32 (2^-24): each one is lost by RN.
        ("fp32_rn", (1 - 2.0**-10) * 2.0**-12, 2.0**-12, np.float16, 0.99, 1024),
        # 1 then products just under 2^-F: all truncated by the alignment; ratio ~ k / (k + 2^F u_R).
        ("ampere_fp16", (1 - 2.0**-10) * 2.0**-12, 2.0**-12, np.float16, 0.79, 1024),  # 8/10
        ("hopper_fp16_wgmma", (1 - 2.0**-10) * 2.0**-12, 2.0**-13, np.float16, 0.79, 1024),  # 16/20
        # e4m3 subnormal products 0.875 * 2^-13; 0.875 * 32/33 = 0.848 before the 1/(1 - t) factor (K small)
        ("hopper_fp8_wgmma", 7 * 2.0**-9, 2.0**-7, None, 0.80, 128),
    ],
)
def test_tightness(model, t_a, t_b, fmt, want, K):
    a, b = _tight_pair(K, t_a, t_b)
    if fmt is not None:
        assert np.all(a.astype(fmt).astype(np.float64) == a) and np.all(b.astype(fmt).astype(np.float64) == b)
    else:  # representable in E4M3FN
        assert np.isin(a, E4M3).all() and np.isin(b, E4M3).all()
    acc = bounds.simulate(a, b, model)
    exact = Fraction(1) + (K - 1) * Fraction(t_a) * Fraction(t_b)
    err = abs(Fraction(float(acc[0, 0])) - exact)
    P = exact  # all terms positive
    ratio = float(err / (Fraction(bounds.get_model(model).eps(K)) * P))
    assert want <= ratio <= 1.0, ratio


# ---------------------------------------------------------------------------------------------------------------
# check(): report fields
# ---------------------------------------------------------------------------------------------------------------


def _fp16_case(seed=0, M=6, N=7, K=64):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(np.float16)
    B = rng.standard_normal((N, K)).astype(np.float16)
    return A, B, gemm.gemm_fp16(A, B)


def test_check_correct_output_is_ok_and_equal():
    A, B, ref = _fp16_case()
    rep = bounds.check(ref.out.copy(), ref, "exact", exact_accumulation=True)
    assert rep.ok and rep.bitwise_equal_fraction == 1.0 and rep.max_ulps == 0 and rep.sqnr_db > 60
    assert rep.n_violations == 0 and rep.unwritten == 0 and rep.nan_mismatch == 0


def test_check_counts_ulps_only_over_finite_pairs():
    """An all-NaN output has no element finite in both: the report says so instead of "max 0 ulp"; one finite
    element 3 ulps off gives max 3 over 1 pair."""
    A, B, ref = _fp16_case()
    rep = bounds.check(np.full_like(ref.out, np.nan), ref, "fp32_rn")
    assert not rep.ok and rep.finite_pairs == 0
    assert "no element finite in both" in rep.summary() and " 0 ulp" not in rep.summary()
    out = np.full_like(ref.out, np.nan)
    out[1, 2] = (ref.out[1, 2:3].view(np.uint16) + 3).view(np.float16)[0]
    rep = bounds.check(out, ref, "fp32_rn")
    assert rep.finite_pairs == 1 and rep.max_ulps == 3 and "max 3 ulp" in rep.summary()


def test_check_reports_one_ulp_off_under_exact_accumulation():
    A, B, ref = _fp16_case()
    out = ref.out.copy()
    bits = out.view(np.uint16)
    bits[2, 3] += 1
    rep = bounds.check(out, ref, "fp32_rn", exact_accumulation=True)
    assert not rep.ok and rep.not_equal_exact == 1 and rep.max_ulps == 1
    with pytest.raises(AssertionError, match=r"\(2, 3\)"):
        rep.assert_ok()
    # the same output is fine under the bound alone (1 ulp is inside u_out |C| + accumulation)
    # only if the bound allows it; either way the report says where
    assert rep.violations[0][0] == (2, 3)


def test_exact_accumulation_message_says_when_the_worst_element_passes():
    """Under exact accumulation the largest err/bound may be a correctly rounded element (1 + 2^-11 + 2^-20 rounds
    to 1 + 2^-10, err/bound ~ 1) while the offender, the other neighbour of 1.75 + 2^-11 - 2^-20, stays within
    its bound: the message must not present that passing element as the element at fault."""
    A = np.array([[1.0, 2.0**-11, 2.0**-20], [1.75, 2.0**-11, -(2.0**-20)]], np.float16)
    ref = gemm.gemm_fp16(A, np.ones((1, 3), np.float16))
    out = ref.out.copy()
    out.view(np.uint16)[1, 0] += 1
    rep = bounds.check(out, ref, "exact", exact_accumulation=True)
    assert not rep.ok and rep.not_equal_exact == 1 and rep.n_violations == 0
    assert rep.worst == (0, 0) and rep.worst_passes and [v[0] for v in rep.violations] == [(1, 0)]
    msg = rep.message()
    assert f"Max err/bound: {rep.max_err_over_bound:.6g} at (0, 0), an element that passes (the offenders are " \
           "listed below);" in msg, msg
    assert "Bound terms at the worst element (it passes): out=1.00098, correctly_rounded=1.00098" in msg, msg
    # an offender that is also the worst element keeps the plain wording
    out.view(np.uint16)[1, 0] += 1
    rep = bounds.check(out, ref, "exact", exact_accumulation=True)
    assert rep.worst == (1, 0) and not rep.worst_passes
    assert "at (1, 0); vs" in rep.message() and "Bound terms at the worst element: " in rep.message()


def test_faithful_exact_accumulation_takes_the_side_from_the_exact_value():
    """An NVFP4 product whose float64 ``exact`` (2^26) is not the exact value 2^26 - 2^-66: the global scales 1 +
    2^-23 and 1 - 2^-23 multiply to 1 - 2^-46 times the integer 2^46 + 1 (64 codes of 4.0 times 4.0 at block scale
    256, plus 0.5 x 0.5 at 2^-9). A faithful store may give RD = 2^26 - 2^18 (bf16) or RU = 2^26, never 2^26 + 2^19;
    the side of 2^26 comes from the exact value, not from its float64 approximation."""
    codes = np.zeros((1, 80), np.uint8)
    codes[0, :64], codes[0, 64] = 6, 1  # E2M1 4.0 x 64, 0.5
    scales = np.array([[0x78] * 4 + [0x01]], np.uint8)  # E4M3 256 x 4, 2^-9

    def operand(g):
        return NVFP4Tensor(pack_fp4(codes), scales, np.float32(g), (1, 80), "raw", (1, 16), 1)

    ref = gemm.nvfp4_gemm(operand(1 + 2.0**-23), operand(1 - 2.0**-23))
    assert ref.exact_fraction((0, 0)) == 2**26 - Fraction(1, 2**66) and float(ref.exact[0, 0]) == 2.0**26
    for value, ok in ((2.0**26 - 2.0**18, True), (2.0**26, True), (2.0**26 + 2.0**19, False),
                      (2.0**26 - 2.0**19, False)):
        out = np.array([[value]], ml_dtypes.bfloat16)
        rep = bounds.check(out, ref, "exact", output_rounding="faithful", exact_accumulation=True)
        assert rep.ok == ok and rep.not_equal_exact == (not ok), value


def test_check_unwritten_and_nan_mismatch():
    A, B, ref = _fp16_case()
    out = ref.out.copy()
    out[0, :] = np.nan  # "unwritten" row under a NaN poison
    rep = bounds.check(out, ref, "fp32_rn", poison=float("nan"))
    assert not rep.ok and rep.unwritten == out.shape[1] and rep.nan_mismatch == 0
    rep2 = bounds.check(out, ref, "fp32_rn")
    assert rep2.nan_mismatch == out.shape[1] and rep2.unwritten == 0
    out3 = ref.out.copy()
    out3[1, 1] = np.float16(12345.0)
    rep3 = bounds.check(out3, ref, "fp32_rn", poison=12345.0)
    assert rep3.unwritten == 1


def test_check_inf_rules():
    # exact sum 65536 > 65520: overflow; a kernel giving inf is right, 65504 is not.
    A = np.array([[256.0, 0.0]], np.float16)
    B = np.array([[256.0, 1.0]], np.float16)
    ref = gemm.gemm_fp16(A, B)
    assert ref.out[0, 0] == np.inf
    assert bounds.check(ref.out.copy(), ref, "fp32_rn").ok
    bad = np.array([[-np.inf]], np.float16)
    assert bounds.check(bad, ref, "fp32_rn").inf_mismatch == 1
    fin = np.array([[65504.0]], np.float16)
    assert bounds.check(fin, ref, "fp32_rn").inf_mismatch == 1


def test_an_empty_output_says_n_a_not_0_percent_equal():
    """M = 0: there is nothing to compare; the summary said "0.00% equal to the correctly rounded output" (and a
    perfect SQNR of inf dB). It says n/a for the shares and numbers of zero elements."""
    ref = gemm.gemm_fp16(np.zeros((0, 64), np.float16), np.ones((3, 64), np.float16))
    rep = bounds.check(ref.out.copy(), ref, "fp32_rn")
    assert rep.ok and rep.size == 0 and rep.shape == (0, 3)
    assert rep.summary() == ("OK -- fp32_rn (rne), K=64, 0 elements: nothing to compare (max err/bound, ulps, equal "
                             "share and SQNR n/a)")
    assert "%" not in rep.summary() and "dB" not in rep.summary()
    assert "n/a (0 elements)" in rep.message() and "equal: " not in rep.message()
    # one element still gets its numbers
    ref1 = gemm.gemm_fp16(np.ones((1, 64), np.float16), np.ones((1, 64), np.float16))
    assert "100.00% equal to the correctly rounded output" in bounds.check(ref1.out.copy(), ref1, "fp32_rn").summary()


def test_check_rejects_wrong_dtype_and_shape():
    A, B, ref = _fp16_case()
    with pytest.raises(TypeError, match="float16"):
        bounds.check(ref.out.astype(np.float32), ref, "fp32_rn")
    with pytest.raises(ValueError, match="shape"):
        bounds.check(ref.out[:2], ref, "fp32_rn")
    with pytest.raises(ValueError, match="output_rounding"):
        bounds.check(ref.out, ref, "fp32_rn", output_rounding="rz")


def test_check_epilogue_terms_widen_the_bound():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    w = rng.standard_normal((3, 32)).astype(np.float32)
    from fp4ref.blockscale import nvfp4_quantize

    ref = gemm.nvfp4_gemm(nvfp4_quantize(x, recipe="sol"), nvfp4_quantize(w, recipe="sol"))
    b2 = bounds.bound(ref, "fp32_rn").total
    b0 = bounds.bound(ref, "fp32_rn", epilogue_multiplies=0).total
    assert np.all(b2 > b0)
    assert ref.epilogue_multiplies == 2


def _nvfp4_one_block(gx, gw, code=0x77, scale=0x7E):
    """An NVFP4 x [1, 16] and W [1, 16] of one block each: all elements E2M1 ``code`` with block scale ``scale``
    and global decode scales gx, gw (fp32 values given as floats)."""
    def t(g):
        return NVFP4Tensor(codes=np.full((1, 8), code, np.uint8), scales=np.full((1, 1), scale, np.uint8),
                           global_decode_scale=np.float32(g), shape=(1, 16), recipe="raw", block=(1, 16), axis=1)
    return gemm.nvfp4_gemm(t(gx), t(gw))


def _declared_epilogue(acc, gx, gw):
    """What a kernel with the declared NVFP4 epilogue outputs: RNE_bf16(fp32(acc * fp32(gx * gw))) in numpy fp32."""
    with np.errstate(under="ignore", over="ignore"):
        g = np.float32(gx) * np.float32(gw)
        return np.array([[np.float32(acc) * g]], np.float32).astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("gx, gw", [(2.0**-70, 2.0**-80),  # fp32(G) flushes to 0
                                    (1.5 * 2.0**-75, 2.0**-74),  # 1.5 * 2^-149: a tie, rounded to 2^-148
                                    (2.0**-60, 2.0**-75)])  # subnormal, exact
def test_a_subnormal_global_scale_product_is_bounded(gx, gw):
    # every product is 6 * 448 squared: acc = 16 * 2688^2 exactly (an fp32); C = acc * gx * gw
    ref = _nvfp4_one_block(gx, gw)
    acc = 16 * 2688.0**2
    assert ref.exact[0, 0] == acc * gx * gw and ref.epilogue_scale == gx * gw
    out = _declared_epilogue(acc, gx, gw)
    rep = bounds.check(out, ref, "hopper_fp16_wgmma")
    assert rep.ok, rep.summary()
    # the term is what lets it pass: without the scale's own error the same output fails (but for the exact case)
    bare = replace(ref, epilogue_scale=None)
    assert bounds.check(out, bare, "hopper_fp16_wgmma").ok == (float(out[0, 0]) == float(ref.out[0, 0]))


def test_a_normal_global_scale_product_adds_nothing_and_an_overflowing_one_is_refused():
    ref = _nvfp4_one_block(2.0**-20, 2.0**-30)
    assert np.array_equal(bounds.bound(ref, "fp32_rn").total, bounds.bound(replace(ref, epilogue_scale=None),
                                                                           "fp32_rn").total)
    big = _nvfp4_one_block(2.0**65, 2.0**64, code=0x11, scale=0x08)  # G = 2^129: fp32(G) = inf; C = 16 * 2^-18 G
    assert np.isfinite(float(big.out[0, 0]))
    with pytest.raises(ValueError, match="overflows fp32"):
        bounds.check(big.out.copy(), big, "fp32_rn")
    assert bounds.bound(big, "fp32_rn", epilogue_multiplies=0).total.shape == (1, 1)  # no scalar applied: no G


def test_splitk_of_exact_chunks_counts_the_rounding_of_each_partial():
    u = 2.0**-24
    m = bounds.get_model("splitk(exact, 2)")
    assert m.eps(4) == pytest.approx(2 * u / (1 - 2 * u), rel=1e-15)  # n = 2 chunks: gamma_2
    assert bounds.get_model("splitk(exact, 1)").eps(1) == pytest.approx(u / (1 - u), rel=1e-15)
    # (1 + 2^-23)^2 rounded to fp32; and 1 + t + t in chunks [1, t], [t, 0] (t just below half an ulp of 1)
    a = np.array([[1 + 2.0**-23]], np.float32)
    err = abs(bounds.simulate(a, a, "splitk(exact, 1)")[0] - (1 + 2.0**-23) ** 2)
    assert 0 < err <= bounds.get_model("splitk(exact, 1)").eps(1) * (1 + 2.0**-23) ** 2
    t = 2.0**-24 * (1 - 2.0**-16)
    a, b = np.array([[1, t, t, 0]], np.float32), np.ones((1, 4), np.float32)
    P = 1 + 2 * float(np.float32(t))
    assert abs(bounds.simulate(a, b, "splitk(exact, 2)")[0] - P) <= m.eps(4) * P
    # simulate rounds each exact partial to fp32 ONCE: 1 + 2^-24 + 2^-80 is above the fp32 midpoint 1 + 2^-24, so
    # 1 + 2^-23 (through fsum's float64 1 + 2^-24, a tie, it would be 1.0); and the sign of a partial that cancels
    a, b = np.array([[1, 2.0**-24, 2.0**-40]]), np.array([[1, 1, 2.0**-40]])
    assert bounds.simulate(a, b, "splitk(exact, 4)")[0, 0] == 1 + 2.0**-23
    assert bounds.simulate(-a, b, "splitk(exact, 4)")[0, 0] == -(1 + 2.0**-23)


def test_check_accepts_torch():
    torch = pytest.importorskip("torch")
    A, B, ref = _fp16_case()
    rep = bounds.check(torch.from_numpy(ref.out.copy()), ref, "hopper_fp16_wgmma")
    assert rep.ok
    bf = gemm.sparse_gemm_fp4_fp8(np.zeros((2, 4), np.uint8) + 0x21, np.full((2, 4), 0x04, np.uint8),
                                  np.full((3, 16), 0x38, np.uint8))
    t = torch.from_numpy(bf.out.astype(np.float32)).to(torch.bfloat16)
    assert bounds.check(t, bf, "fp32_rn", exact_accumulation=True).ok


def test_faithful_output_may_saturate_beyond_max():
    A = np.array([[256.0, 256.0]], np.float16)
    B = np.array([[256.0, 256.0]], np.float16)  # exact 131072 > 65504
    ref = gemm.gemm_fp16(A, B)
    sat = np.array([[65504.0]], np.float16)
    assert bounds.check(sat, ref, "fp32_rn", output_rounding="faithful").ok
    assert not bounds.check(sat, ref, "fp32_rn", output_rounding="rne").ok
    assert not bounds.check(np.array([[-65504.0]], np.float16), ref, "fp32_rn", output_rounding="faithful").ok
    assert not bounds.check(np.array([[65472.0]], np.float16), ref, "fp32_rn", output_rounding="faithful").ok


def test_nonfinite_outputs_do_not_read_as_perfect():
    # From a fresh-user review: an all-inf output reported "max err/bound 0, SQNR inf dB" (verdict FAIL).
    from fp4ref import bounds as _b
    from fp4ref.gemm import gemm_fp16 as _ref

    rng = np.random.default_rng(5)
    A = rng.standard_normal((3, 32)).astype(np.float16)
    B = rng.standard_normal((4, 32)).astype(np.float16)
    ref = _ref(A, B)
    for fill in (np.inf, np.nan):
        rep = _b.check(np.full_like(ref.out, fill), ref, "hopper_fp16_wgmma")
        assert not rep.ok and rep.max_err_over_bound == np.inf and rep.sqnr_db == -np.inf
    half = ref.out.copy()
    half[0] = np.nan
    rep = _b.check(half, ref, "hopper_fp16_wgmma")
    assert not rep.ok and rep.nan_mismatch == 4 and rep.max_err_over_bound == np.inf
    assert _b.check(ref.out, ref, "hopper_fp16_wgmma").ok  # the correctly rounded output passes


@pytest.mark.parametrize("bad, err", [(10**9, ValueError), (-1, ValueError), (np.int64(17), ValueError),
                                      (1.5, TypeError), (2.0, TypeError), (True, TypeError),
                                      (float("nan"), TypeError), ("2", TypeError)])
def test_epilogue_multiplies_override_is_validated(bad, err):
    """An absurd override would make every bound infinite (any output passes) or negative: refused, never used.
    A non-int (2.0 included) is a TypeError, an int out of range a ValueError, each naming the argument."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((4, 32)).astype(np.float16)
    b = rng.standard_normal((8, 32)).astype(np.float16)
    ref = gemm.gemm_fp16(a, b)
    garbage = np.full(ref.out.shape, 1000.0, dtype=np.float16)
    with pytest.raises(err, match="^epilogue_multiplies="):
        bounds.check(garbage, ref, "fp32_rn", epilogue_multiplies=bad)
    with pytest.raises(err, match="^epilogue_multiplies="):
        bounds.bound(ref, "fp32_rn", epilogue_multiplies=bad)
    np.testing.assert_array_equal(bounds.bound(ref, "fp32_rn", epilogue_multiplies=np.int8(2)).total,
                                  bounds.bound(ref, "fp32_rn", epilogue_multiplies=2).total)
    assert not bounds.check(garbage, ref, "fp32_rn", epilogue_multiplies=bounds.MAX_EPILOGUE_MULTIPLIES).ok


@pytest.mark.parametrize("kw, match", [({"poison": "7.0"}, "poison"), ({"poison": True}, "poison"),
                                       ({"exact_accumulation": 1}, "exact_accumulation")])
def test_check_rejects_non_numeric_poison_and_non_bool_flags(kw, match):
    rng = np.random.default_rng(12)
    ref = gemm.gemm_fp16(rng.standard_normal((2, 16)).astype(np.float16),
                         rng.standard_normal((4, 16)).astype(np.float16))
    with pytest.raises(TypeError, match=match):
        bounds.check(ref.out, ref, "fp32_rn", **kw)


def test_parameterised_names_allow_inner_spaces_and_name_a_bad_parameter():
    """'splitk( fp32_rn , 16 )' was "not a known model" though 'splitk(fp32_rn,16)' parsed, and a negative or
    fractional N / C got "not a known model" while 0 got a value message: spaces inside the parentheses are free,
    and any N or C that is not a positive int is a ValueError naming the name and the parameter."""
    assert bounds.get_model("splitk( fp32_rn , 16 )") == bounds.splitk("fp32_rn", 16)
    assert bounds.get_model("hopper_fp8_wgmma_promote( 64 )") == bounds.hopper_fp8_wgmma_promote(64)
    nested = bounds.get_model("splitk(splitk(fp32_rn, 16), 64)")
    assert nested.chunk == 64 and nested.inner == bounds.splitk("fp32_rn", 16)
    for name, param in (("hopper_fp8_wgmma_promote(-1)", "-1"), ("hopper_fp8_wgmma_promote(1.5)", "1.5"),
                        ("hopper_fp8_wgmma_promote(0)", "0"), ("splitk(fp32_rn, x)", "x"),
                        ("splitk(fp32_rn, -16)", "-16"), ("hopper_fp8_wgmma_promote(\u00b2)", "\u00b2")):
        with pytest.raises(ValueError, match=rf"^model={re.escape(repr(name))}: the parameter "
                                             rf"{re.escape(repr(param))} must be a positive int"):
            bounds.get_model(name)
    with pytest.raises(ValueError, match="is not a known accumulation model"):
        bounds.get_model("promote(3)")


def test_gamma_values_and_refusals():
    """gamma_n(u) = n u / (1 - n u), correctly rounded where n u and 1 - n u are exact in float64 (u a power of two:
    one IEEE division), inf once n u >= 1;
    a negative, non-integer or bool n and a negative or NaN u are refused rather than giving a meaningless bound."""
    for n, u in ((0, 2.0**-24), (3, 2.0**-3), (7, 2.0**-11), (np.int64(512), np.float32(2.0**-24))):
        nu = int(n) * Fraction(float(u))
        assert bounds.gamma(n, u) == float(nu / (1 - nu))
    assert bounds.gamma(8, 2.0**-3) == math.inf and bounds.gamma(9, 2.0**-3) == math.inf
    for n, u, err in ((-1, 2.0**-24, ValueError), (10, -1.0, ValueError), (10, float("nan"), ValueError),
                      (10, float("inf"), ValueError), (True, 2.0**-24, TypeError), (10.5, 2.0**-24, TypeError),
                      (10, "u", TypeError)):
        with pytest.raises(err):
            bounds.gamma(n, u)


def test_accumulation_model_fields_are_checked():
    """A model built from a negative, NaN, huge or non-integer parameter gave a meaningless bound that check()
    reported OK under (epilogue_multiplies=10**8: 8144 ulp passed); every field is checked when the model is made."""
    A = bounds.AccumulationModel
    for kw, err in ((dict(kind="exact", epilogue_multiplies=10**8), ValueError),
                    (dict(kind="exact", epilogue_multiplies=-3), ValueError),
                    (dict(kind="linear", slope=-1.0), ValueError), (dict(kind="linear", slope=float("nan")), ValueError),
                    (dict(kind="linear", slope="1"), TypeError), (dict(kind="recursive", u=0.0), ValueError),
                    (dict(kind="recursive", u=1.5), ValueError), (dict(kind="block_fma", k=1.5, F=13), TypeError),
                    (dict(kind="block_fma", k=32, F=13, promote_every=2.5), TypeError),
                    (dict(kind="block_fma", k=32, F=13, promote_every=0), ValueError),
                    (dict(kind="block_fma", k=True, F=13), TypeError),
                    (dict(kind="splitk", chunk=64, inner="fp32_rn"), TypeError),
                    (dict(kind="splitk", chunk=0, inner=bounds.get_model("fp32_rn")), ValueError),
                    (dict(kind="exact", source=3), TypeError)):
        with pytest.raises(err):
            A("m", **kw)
    with pytest.raises(ValueError, match="name=''"):
        A("", "exact")
    m = A("m", "block_fma", k=np.int64(32), F=np.int32(13), acc_p=14, promote_every=np.int64(128),
          epilogue_multiplies=np.int64(2))
    assert (type(m.k), type(m.promote_every), type(m.epilogue_multiplies)) == (int, int, int)
    assert m.eps(256) == bounds.hopper_fp8_wgmma_promote(128).eps(256)
    with pytest.raises(TypeError, match="expected an AccumulationModel, got str"):
        bounds.register_model("foo")
    ref = gemm.gemm_fp16(np.ones((2, 4), np.float16), np.ones((2, 4), np.float16))
    with pytest.raises(TypeError, match="ref must be an fp4ref.gemm.Reference"):
        bounds.bound(None, "fp32_rn")


def test_parameters_and_names_beyond_range_are_named_errors():
    """Ints beyond float64 and deeply nested or very long names give the module's own errors (they gave
    OverflowError, RecursionError and Python's digit-limit error); a wrong parameter type is a TypeError."""
    assert bounds.gamma(10**400, 2.0**-24) == math.inf and bounds.gamma(10**400, 0.0) == 0.0
    with pytest.raises(ValueError, match=r"at most 2\*\*62"):
        bounds.get_model("fp32_rn").eps(10**400)
    with pytest.raises(ValueError, match="nested more than 8 deep"):
        bounds.get_model("splitk(" * 500 + "fp32_rn" + ", 2)" * 500)
    assert bounds.get_model("splitk(" * 3 + "fp32_rn" + ", 2)" * 3).eps(8) > 0
    with pytest.raises(ValueError, match="must be a positive int"):
        bounds.get_model(f"hopper_fp8_wgmma_promote({'9' * 5000})")
    for bad in (1.5, True, "8"):
        with pytest.raises(TypeError, match="promotion interval must be a positive int"):
            bounds.hopper_fp8_wgmma_promote(bad)
        with pytest.raises(TypeError, match="chunk length must be a positive int"):
            bounds.splitk("fp32_rn", bad)


def test_poison_is_compared_as_the_output_holds_it():
    """poison=0.1 is stored in fp16 as 0.0999755859375: an element equal to the reference there is written (it was
    counted unwritten against the unrounded 0.1); a big-endian output is compared in its values, not its bytes."""
    r = gemm.gemm_fp16(np.array([[0.1, 0.2]], np.float16), np.eye(2, dtype=np.float16))
    assert bounds.check(r.out, r, poison=0.1).ok
    out = np.full(r.out.shape, 0.5, np.float16)
    assert bounds.check(out, r, poison=0.5).unwritten == 2
    assert bounds.check(out.astype(">f2"), r, poison=0.5).unwritten == 2  # was 0: bytes compared across orders
    assert bounds.check(out, r, poison=10**400).unwritten == 0  # beyond float64: +inf, held by no element


def test_simulate_refuses_what_it_cannot_model_and_sums_exactly():
    """simulate adds exact products only: NaN/inf, non-float dtypes and products not provably exact in the chain's
    format are refused; the exact model is the exact sum (1 + 2^60 - 2^60 = 1, which np.sum lost)."""
    a = np.array([[1.0, 2.0**60, -(2.0**60)]])
    assert bounds.simulate(a, np.ones((1, 3)), "exact")[0, 0] == 1.0
    x = np.array([[1.5, 2.0]], np.float16)
    for bad, err, what in ((np.array([[np.nan, 1.0]]), ValueError, "NaN or inf"),
                           (np.array([[1, 2]]), TypeError, "floating array"),
                           (np.array([[True, False]]), TypeError, "floating array"),
                           (np.array([["1.5", "2"]]), TypeError, "floating array"),
                           (np.array([[1 + 1j, 2]]), TypeError, "floating array")):
        with pytest.raises(err, match=what):
            bounds.simulate(bad, x, "fp32_rn")
    f32 = np.array([[1 + 2.0**-23, 1.0]], np.float32)  # 24 + 24 significant bits: not exact in fp32
    with pytest.raises(ValueError, match=r"not provably exact in fp32"):
        bounds.simulate(f32, f32, "fp32_rn")
    with pytest.raises(ValueError, match=r"not provably exact in fp32"):
        bounds.simulate(f32, f32, "splitk(fp32_rn, 1)")
    assert bounds.simulate(f32, f32, "hopper_fp16_wgmma").shape == (1, 1)  # exact in float64: the block chain
    with pytest.raises(ValueError, match=r"not provably exact in float64"):
        bounds.simulate(np.array([[1 + 2.0**-40]]), np.array([[1 + 2.0**-40]]), "exact")
    big = x.astype(">f2")
    assert bounds.simulate(big, big, "fp32_rn") == bounds.simulate(x, x, "fp32_rn") == 1.5**2 + 4
