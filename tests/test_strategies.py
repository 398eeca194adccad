"""fp4ref.strategies: what each strategy draws, argument validation at build time, and the exact-accumulation
families' guarantee (checked with the model simulator and fractions)."""
from __future__ import annotations

import importlib
import math
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from fp4ref import bounds, gemm
from fp4ref import strategies as fst
from fp4ref.packing import CANONICAL_META, decompress_2to4

E4M3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def test_import_without_hypothesis_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # as if not installed (restored after the test)
    monkeypatch.delitem(sys.modules, "fp4ref.strategies")
    with pytest.raises(ModuleNotFoundError, match=r"^fp4ref\.strategies needs hypothesis, which is not installed: "
                                                  r"pip install 'fp4ref\[testing\]'$") as info:
        importlib.import_module("fp4ref.strategies")
    assert info.value.name == "hypothesis" and isinstance(info.value.__cause__, ModuleNotFoundError)


@given(fst.gemm_shapes(min_m=3, max_m=40, max_n=50, min_k=16, max_k=256, k_multiple_of=16, n_multiple_of=8))
def test_gemm_shapes_respect_bounds_and_multiples(s):
    assert 3 <= s.M <= 40 and 8 <= s.N <= 50 and s.N % 8 == 0 and 16 <= s.K <= 256 and s.K % 16 == 0
    assert s._fields == ("M", "N", "K")


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(min_m=5, max_m=2), "min_m=5 is larger than max_m=2"),
        (dict(min_k=17, max_k=31, k_multiple_of=16), "no multiple of k_multiple_of=16"),
        (dict(min_n=0), "min_n=0 must be >= 1"),
        (dict(max_k=1.5), "max_k=1.5 must be an int"),
    ],
)
def test_gemm_shapes_validate_when_built(kwargs, msg):
    with pytest.raises(InvalidArgument, match=msg):
        fst.gemm_shapes(**kwargs)


@given(fst.e2m1_codes((4, 6), allow_negative_zero=False))
def test_e2m1_codes(c):
    assert c.dtype == np.uint8 and c.shape == (4, 6) and c.max() <= 15 and not np.any(c == 8)


@given(fst.e4m3_bytes((5, 7)), fst.e4m3_bytes((64,), allow_nan=True), fst.e4m3_bytes((32,), allow_negative=False))
def test_e4m3_bytes(a, b, c):
    assert a.dtype == np.uint8 and a.shape == (5, 7)
    assert not np.any((a & 0x7F) == 0x7F)
    assert not np.any(c & 0x80)
    assert b.shape == (64,)


def test_e4m3_bytes_nan_appears_when_allowed():
    seen = set()

    @given(fst.e4m3_bytes((64,), allow_nan=True))
    def inner(b):
        seen.update(int(x) for x in b)

    inner()
    assert 0x7F in seen or 0xFF in seen


@given(fst.meta_bytes((8, 8)), fst.meta_bytes((256,), canonical=False))
def test_meta_bytes(canon, anyb):
    assert set(np.unique(canon).tolist()) <= set(CANONICAL_META)
    assert anyb.dtype == np.uint8


@given(fst.sparse_a_operands(3, 32, int8=True))
def test_sparse_a_operands(ops):
    vals, meta = ops
    assert vals.dtype == np.int8 and meta.dtype == np.int8 and vals.shape == meta.shape == (3, 8)


_FIND = settings(max_examples=300, database=None)


def _finds(strategy, *conditions):
    """Each condition is met by some draw of ``strategy`` (hypothesis.find raises NoSuchExample otherwise): a
    strategy that degenerates, e.g. to all-zero arrays, fails here instead of silently weakening every property
    test that draws from it."""
    for cond in conditions:
        find(strategy, cond, settings=_FIND)


def test_strategies_draw_the_value_classes_they_promise():
    bf16 = lambda x: x.astype(np.float32)  # noqa: E731
    _finds(fst.fp16_matrices((8, 64)),
           lambda a: np.count_nonzero(a) > a.size // 2,
           lambda a: np.any((a != 0) & (np.abs(a.astype(np.float32)) < 2.0**-14)),  # an fp16 subnormal
           lambda a: np.any(a < 0) and np.any(a > 0),
           lambda a: np.any(np.abs(a.astype(np.float32)) >= 32))  # near 2^max_exponent (6)
    _finds(fst.e4m3_bytes((64,)),
           lambda b: np.count_nonzero(b) > 32,
           lambda b: np.any(((b & 0x78) == 0) & ((b & 7) != 0)),  # a subnormal byte
           lambda b: np.any((b & 0x7F) == 0x7E),  # +-448
           lambda b: np.any(((b & 0x80) != 0) & ((b & 0x7F) != 0)))  # a negative non-zero value
    _finds(fst.packed_fp4((64,)),
           lambda b: np.count_nonzero(b & 0xF) > 16 and np.count_nonzero(b >> 4) > 16,
           lambda b: np.any((b & 7) == 7) and np.any(((b >> 4) & 8) != 0))  # +-6, a negative code
    _finds(fst.sparse_a_operands(4, 64), lambda ops: np.count_nonzero(ops[0]) > 16)
    _finds(fst.nvfp4_inputs(4, 64),
           lambda x: np.count_nonzero(bf16(x)) > 64,
           lambda x: np.any(np.isin(np.abs(bf16(x)), [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])),  # E2M1 ties
           lambda x: np.any(bf16(x) == 2688.0))
    _finds(fst.nvfp4_operands(4, 64),
           lambda o: np.count_nonzero(o.codes) > 32 and len(np.unique(o.scales)) > 4)


def test_sparse_a_operands_rejects_bad_k():
    with pytest.raises(InvalidArgument, match="multiple of 4"):
        fst.sparse_a_operands(2, 6)


@given(fst.fp16_matrices((4, 33), allow_nonfinite=True))
def test_fp16_matrices(a):
    assert a.dtype == np.float16 and a.shape == (4, 33)


def test_fp16_matrices_validate():
    with pytest.raises(InvalidArgument, match="patterns"):
        fst.fp16_matrices((2, 2), patterns=("gauss",))
    with pytest.raises(InvalidArgument, match="not smaller than"):
        fst.fp16_matrices((2, 2), min_exponent=3, max_exponent=3)


@given(fst.nvfp4_operands(3, 64, allow_nan_scale=True))
def test_nvfp4_operands(ops):
    assert ops.codes.shape == (3, 32) and ops.scales.shape == (3, 4) and ops.shape == (3, 64)
    assert ops.codes.dtype == ops.scales.dtype == np.uint8 and isinstance(ops.global_decode_scale, np.float32)
    assert ops["codes"] is ops.codes and set(ops.keys()) == {"codes", "scales", "global_decode_scale"}  # old dict


@given(fst.nvfp4_operands(2, 32), fst.nvfp4_operands(3, 32, global_scale=2.0))
def test_nvfp4_operands_go_into_nvfp4_gemm_as_they_are(xq, wq):
    from fractions import Fraction

    from fp4ref.blockscale import nvfp4_dequantize

    ref = gemm.nvfp4_gemm(xq, wq)
    assert ref.out.shape == (2, 3)
    # independent value: the dequantized operands' exact dot product (Fractions), rounded once to bf16
    x, w = nvfp4_dequantize(xq, np.float64), nvfp4_dequantize(wq, np.float64)  # exact
    for i in range(2):
        for j in range(3):
            exact = sum(Fraction(float(a)) * Fraction(float(b)) for a, b in zip(x[i], w[j]))
            err = Fraction(float(np.broadcast_to(ref.exact_err, ref.out.shape)[i, j]))
            assert abs(Fraction(float(ref.exact[i, j])) - exact) <= err


@given(fst.nvfp4_inputs(2, 64))
def test_nvfp4_inputs(x):
    assert x.dtype == ml_dtypes.bfloat16 and x.shape == (2, 64)
    assert np.all(np.isfinite(x.astype(np.float32)))


@given(fst.mx_operands(2, 64), fst.mx_operands(3, 32, elem="e4m3", allow_nan_scale=True))
def test_mx_operands(a, b):
    assert a["codes"].shape == (2, 32) and a["scales"].shape == (2, 2)
    assert b["codes"].shape == (3, 32) and b["scales"].shape == (3, 1) and not np.any((b["codes"] & 0x7F) == 0x7F)
    assert a["elem"] == "e2m1" and b["elem"] == "e4m3fn"  # the canonical name (MX_ELEMENTS, fp4ref.decode)


def test_mx_validate():
    with pytest.raises(InvalidArgument, match="multiple of block"):
        fst.mx_operands(2, 48)
    with pytest.raises(InvalidArgument, match="elem="):
        fst.mx_operands(2, 64, elem="e9m9")


def test_nvfp4_validate():
    with pytest.raises(InvalidArgument, match="multiple of 16"):
        fst.nvfp4_operands(2, 24)


# ---------------------------------------------------------------------------------------------------------------
# exact-accumulation families: exact under every fp32-accumulating model, and needing > 14 bits
# ---------------------------------------------------------------------------------------------------------------

FP32_MODELS = ["fp32_rn", "ampere_fp16", "hopper_fp16_wgmma", "blackwell_fp8", "splitk(hopper_fp16_wgmma, 64)"]


def _sig_bits(x):
    x = np.abs(np.asarray(x, dtype=np.float64))
    x = x[x > 0]
    bits = []
    for v in x:
        n, d = float(v).as_integer_ratio()
        bits.append(n.bit_length())
    return max(bits) if bits else 0


@given(shape=fst.gemm_shapes(max_m=3, max_n=4, min_k=32, max_k=2048), data=st.data())
def test_exact_accumulation_fp16_is_exact_for_every_fp32_model(shape, data):
    A, B = data.draw(fst.exact_accumulation_fp16(shape.M, shape.N, shape.K))
    ref = gemm.gemm_fp16(A, B)
    assert np.all(np.isfinite(ref.out.astype(np.float64)))
    for model in FP32_MODELS:
        np.testing.assert_array_equal(bounds.simulate(A, B, model), ref.exact, err_msg=model)
    # reversed order, too (any order)
    np.testing.assert_array_equal(bounds.simulate(A[:, ::-1], B[:, ::-1], "fp32_rn"), ref.exact)


def test_exact_accumulation_fp16_needs_more_than_14_bits_and_has_ties():
    A, B = fst.exact_accumulation_fp16_arrays(np.random.default_rng(0), 8, 64, 2048)
    ref = gemm.gemm_fp16(A, B)
    assert _sig_bits(ref.exact) > 14
    # the fp8-style 14-bit accumulator is NOT exact on it
    assert not np.array_equal(bounds.simulate(A[:2, :], B[:4], "hopper_fp8_wgmma"), ref.exact[:2, :4])
    # exact fp16 output ties occur (the exact value is the midpoint of two fp16 neighbours)
    r = ref.out.astype(np.float64)
    ulp = gemm.OUTPUT_FORMATS["float16"].ulp(r)
    assert np.any(np.abs(np.abs(ref.exact - r) - ulp / 2) == 0)


@given(shape=fst.gemm_shapes(max_m=3, max_n=4, min_k=32, max_k=2048, k_multiple_of=4), data=st.data())
def test_exact_accumulation_sparse_is_exact(shape, data):
    vals, meta, b = data.draw(fst.exact_accumulation_sparse(shape.M, shape.N, shape.K))
    ref = gemm.sparse_gemm_fp4_fp8(vals, meta, b)
    A = decompress_2to4(vals, meta).astype(np.float64)
    for model in FP32_MODELS:
        np.testing.assert_array_equal(bounds.simulate(A, E4M3[b], model), ref.exact, err_msg=model)


def test_exact_accumulation_sparse_promoted_family():
    vals, meta, b = fst.exact_accumulation_sparse_arrays(np.random.default_rng(1), 4, 8, 2048, promote_every=128,
                                                         positive=True)
    A = decompress_2to4(vals, meta).astype(np.float64)
    ref = gemm.sparse_gemm_fp4_fp8(vals, meta, b)
    np.testing.assert_array_equal(bounds.simulate(A, E4M3[b], "hopper_fp8_wgmma_promote(128)"), ref.exact)
    assert _sig_bits(ref.exact) > 14
    assert not np.array_equal(bounds.simulate(A, E4M3[b], "hopper_fp8_wgmma"), ref.exact)
    with pytest.raises(InvalidArgument):
        fst.exact_accumulation_sparse(2, 2, 6)
    assert math.isfinite(float(np.max(ref.exact)))


@pytest.mark.parametrize("n", range(1, 33))
def test_exact_accumulation_sparse_promoted_chunks_fit_the_fp8_accumulator(n):
    """The promoted family's guarantee, by brute force: for every promotion chunk of n K-columns (starting at a
    multiple of n), the largest |sum| any A bytes can put in it, over every (vals, meta) byte of every group the
    chunk touches (a duplicate index puts both values in one column), times the largest |B| the family draws,
    stays below 2^13. With n not a multiple of 4 a chunk cuts groups: at n = 7 the chunk of columns 7-13 touches
    three, and a bound of 3 n |B| per chunk let 36 x 384 = 13824 in."""
    k = 8 * n
    bmax = float(np.max(np.abs(E4M3[fst._exact_sparse_b_bytes(k, n, False)])))  # the B bytes the family draws
    # every group's 4 dense values for every vals byte and meta nibble (meta bits 7:4 are ignored)
    vb, mb = np.meshgrid(np.arange(256, dtype=np.uint8), np.arange(16, dtype=np.uint8), indexing="ij")
    dense = np.abs(decompress_2to4(vb.reshape(-1, 1), mb.reshape(-1, 1)).astype(np.float64))  # [4096, 4]
    for c0 in range(0, k, n):
        cols = np.arange(c0, min(c0 + n, k))
        worst = sum(np.max(dense[:, cols[cols // 4 == g] % 4].sum(axis=1)) for g in np.unique(cols // 4))
        assert worst * bmax < 2**13, (c0, worst, bmax)


# ---------------------------------------------------------------------------------------------------------------
# argument validation when BUILT (module docstring): shapes, exponents, scales, the plain-numpy constructions
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k, block", [(3, 1), (1, 1), (5, 5)])
def test_mx_operands_e2m1_needs_even_k(k, block):
    # e2m1 codes are packed two per byte: an odd k gave codes (1, k // 2) that no longer hold k codes
    with pytest.raises(InvalidArgument, match=rf"^k={k} must be even for elem='e2m1'"):
        fst.mx_operands(1, k, block=block)


@pytest.mark.parametrize("k, block, elem, codes, scales", [(6, 3, "e2m1", (1, 3), (1, 2)),
                                                           (3, 1, "e4m3", (1, 3), (1, 3)),
                                                           (5, 5, "e3m2", (1, 5), (1, 1))])
def test_mx_operands_shapes_follow_k_and_block(k, block, elem, codes, scales):
    op = find(fst.mx_operands(1, k, block=block, elem=elem), lambda op: True)
    assert op["codes"].shape == codes and op["scales"].shape == scales


@pytest.mark.parametrize("g", [-1, 0, -0.0, float("nan"), float("inf"), 1e-50, 1e39])
def test_nvfp4_operands_global_scale_finite_positive_when_built(g):
    with pytest.raises(InvalidArgument, match=r"^global_scale=.*expected a finite positive float"):
        fst.nvfp4_operands(2, 16, global_scale=g)


@pytest.mark.parametrize("g", [True, np.bool_(False), "x", "1.0", np.array([1.0, 2.0])])
def test_nvfp4_operands_global_scale_type_when_built(g):
    with pytest.raises(TypeError, match=r"^global_scale must be a real number") as info:
        fst.nvfp4_operands(2, 16, global_scale=g)
    assert isinstance(info.value, InvalidArgument)


@given(fst.nvfp4_operands(1, 16, global_scale=np.float64(0.1)), fst.nvfp4_operands(1, 16, global_scale=3),
       fst.nvfp4_operands(1, 16, global_scale=np.array([0.5])))
def test_nvfp4_operands_global_scale_rounded_to_float32_once(a, b, c):
    """(a one-element array, as compressed-tensors stores it, is its element: blockscale's rule)"""
    assert a.global_decode_scale == np.float32(0.1) and b.global_decode_scale == np.float32(3.0)
    assert c.global_decode_scale == np.float32(0.5) and isinstance(a.global_decode_scale, np.float32)


@pytest.mark.parametrize("max_exponent", [16, 20, 10**6])
def test_fp16_matrices_max_exponent_at_most_15(max_exponent):
    with pytest.raises(InvalidArgument, match=rf"^max_exponent={max_exponent} must be <= 15"):
        fst.fp16_matrices((2, 2), max_exponent=max_exponent)


@settings(max_examples=30, deadline=None)
@given(fst.fp16_matrices((64, 512), patterns=("wide", "rows", "huge"), max_exponent=15, min_exponent=13))
def test_fp16_matrices_finite_without_allow_nonfinite(a):
    # randn * 2^14 passes fp16's overflow threshold 65520 for |randn| > 4: such values clamp to +-65504
    assert a.dtype == np.float16 and a.shape == (64, 512) and np.all(np.isfinite(a))


@pytest.mark.parametrize("build, match", [
    (lambda: fst.fp16_matrices((2.0, 2)), r"^shape=\(2\.0, 2\) must be a tuple of non-negative ints"),
    (lambda: fst.fp16_matrices([2, 2]), r"^shape=\[2, 2\] must be a tuple"),
    (lambda: fst.fp16_matrices((2, 2, 2)), r"^shape=\(2, 2, 2\): fp16_matrices needs a 2-D shape"),
    (lambda: fst.fp16_matrices(4), r"^shape=4: fp16_matrices needs a 2-D shape"),
    (lambda: fst.e2m1_codes((2.0, 2)), r"^shape=\(2\.0, 2\)"),
    (lambda: fst.e4m3_bytes((True, 2)), r"^shape=\(True, 2\)"),
    (lambda: fst.packed_fp4(-1), r"^shape=\(-1,\)"),
    (lambda: fst.meta_bytes((2, -3)), r"^shape=\(2, -3\)"),
    (lambda: fst.sparse_a_operands(2.0, 8), r"^m=2\.0 must be an int"),
    (lambda: fst.sparse_a_operands(2, 8.0), r"^k=8\.0 must be an int"),
])
def test_shapes_validated_when_built(build, match):
    with pytest.raises(InvalidArgument, match=match):
        build()  # building raises: nothing is drawn


def test_drawn_shapes_still_checked_when_drawn():
    s = fst.fp16_matrices(st.just((2, 2, 2)))  # a strategy: its draws are checked when drawn
    with pytest.raises(InvalidArgument, match="needs a 2-D shape"):
        find(s, lambda a: True)
    assert find(fst.fp16_matrices(st.just((3, 0))), lambda a: True).shape == (3, 0)


_RNG = np.random.default_rng


@pytest.mark.parametrize("call, exc, match", [
    (lambda: fst.exact_accumulation_fp16_arrays(_RNG(0), 2, 2, 0), ValueError, r"^k=0 must be >= 1"),
    (lambda: fst.exact_accumulation_fp16_arrays(None, 2, 2, 8), TypeError, r"^rng must be a numpy Generator"),
    (lambda: fst.exact_accumulation_fp16_arrays(0, 2, 2, 8), TypeError, r"^rng must be a numpy Generator"),
    (lambda: fst.exact_accumulation_fp16_arrays(_RNG(0), -1, 2, 8), ValueError, r"^m=-1 must be >= 0"),
    (lambda: fst.exact_accumulation_fp16_arrays(_RNG(0), 2, 2.0, 8), TypeError, r"^n=2\.0 must be an int"),
    (lambda: fst.exact_accumulation_fp16_arrays(_RNG(0), 2, 2, True), TypeError, r"^k=True must be an int"),
    (lambda: fst.exact_accumulation_sparse_arrays(_RNG(0), 2, 2, 0), ValueError, r"^k=0 must be >= 1"),
    (lambda: fst.exact_accumulation_sparse_arrays(None, 2, 2, 8), TypeError, r"^rng must be a numpy Generator"),
    (lambda: fst.exact_accumulation_sparse_arrays(_RNG(0), 2, 2, 8, promote_every=0), ValueError,
     r"^promote_every=0 must be >= 1"),
    (lambda: fst.exact_accumulation_sparse_arrays(_RNG(0), 2, 2, 8, promote_every=True), TypeError,
     r"^promote_every=True must be None or an int"),
    (lambda: fst.exact_accumulation_sparse_arrays(_RNG(0), 2, 2, 6), ValueError, r"^k=6 must be a multiple of 4"),
    (lambda: fst.exact_accumulation_sparse_arrays(_RNG(0), 2, 2, 8.0), TypeError, r"^k=8\.0 must be an int"),
])
def test_exact_accumulation_arrays_validate_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_exact_accumulation_sparse_arrays_shapes():
    vals, meta, b = fst.exact_accumulation_sparse_arrays(_RNG(0), 2, 3, 12, promote_every=np.int64(128))
    assert vals.shape == meta.shape == (2, 3) and b.shape == (3, 12)
    assert vals.dtype == meta.dtype == b.dtype == np.uint8


def test_flags_must_be_bools_when_built():
    """A flag given as 1, "no" or None was read by truthiness ("no" is truthy: NaN bytes drawn); each is an
    InvalidArgument naming it when the strategy is built (TypeError for the plain-numpy helper)."""
    from hypothesis.errors import InvalidArgument

    builds = [lambda v: fst.e2m1_codes((4,), allow_negative_zero=v), lambda v: fst.e4m3_bytes((4,), allow_nan=v),
              lambda v: fst.e4m3_bytes((4,), allow_subnormal=v), lambda v: fst.e4m3_bytes((4,), allow_negative=v),
              lambda v: fst.packed_fp4((4,), allow_negative_zero=v), lambda v: fst.meta_bytes((4,), canonical=v),
              lambda v: fst.sparse_a_operands(2, 8, canonical=v), lambda v: fst.sparse_a_operands(2, 8, int8=v),
              lambda v: fst.exact_accumulation_sparse(2, 2, 8, positive=v),
              lambda v: fst.nvfp4_operands(2, 16, allow_nan_scale=v),
              lambda v: fst.mx_operands(2, 32, allow_nan_scale=v),
              lambda v: fst.fp16_matrices((2, 2), allow_nonfinite=v)]
    for build in builds:
        for bad in (1, "no", None):
            with pytest.raises(InvalidArgument, match=r"must be a bool"):
                build(bad)
        build(np.bool_(True))
        build(False)
    for kw in (dict(positive=1), dict(canonical="yes")):
        with pytest.raises(TypeError, match=r"must be a bool"):
            fst.exact_accumulation_sparse_arrays(np.random.default_rng(0), 2, 2, 8, **kw)
