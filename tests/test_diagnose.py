"""fp4ref.diagnose names planted bugs from their error patterns, and names nothing on correct kernels.

Each planted-bug kernel is an exact numpy emulation of one bug on a workload's own operands (at small N and K),
rounded once (RNE) to the output format, so only the bug differs from the reference.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp4ref import bounds, gemm
from fp4ref.diagnose import BUGS, diagnose
from fp4ref.verify import POISON_BITS, poison_value
from fp4ref.workloads import get_workload

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
E4M3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
GEMM = get_workload("gemm_n3072_k2048")
SPARSE = get_workload("sparse_gemm_fp4_fp8_n2048_k2048")
NVFP4 = get_workload("nvfp4_linear_n8192_k8192")


def _round(x, like):
    return gemm.round_float64(x, like.output_format.name).astype(like.out.dtype)


def _ops(w, family, m, n, k, seed=0):
    return w.families[family](np.random.default_rng(seed), m, n, k)


# ------------------------------------------------------------------------------------------ planted bugs


def truncating_store(w, ops, ref):
    r = ref.out.astype(np.float64)
    over = np.abs(r) > np.abs(ref.exact)
    return np.where(over, np.nextafter(r.astype(ref.out.dtype), np.zeros_like(ref.out)), ref.out).astype(
        ref.out.dtype)


def ties_away(w, ops, ref):
    f = gemm.OUTPUT_FORMATS[ref.output_format.name]
    x = ref.exact
    _, e = np.frexp(x)
    q = np.maximum(e - 1, f.emin) - (f.p - 1)
    return np.ldexp(np.sign(x) * np.floor(np.abs(np.ldexp(x, -q)) + 0.5), q).astype(ref.out.dtype)


def rounded_away(w, ops, ref):
    """A store that rounds away from zero: every output below the exact value in magnitude moves 1 ulp out."""
    r = ref.out.astype(np.float64)
    under = np.abs(r) < np.abs(ref.exact)
    away = np.nextafter(ref.out, np.where(ref.exact < 0, -np.inf, np.inf).astype(ref.out.dtype))
    return np.where(under, away, ref.out).astype(ref.out.dtype)


def unwritten_scattered(w, ops, ref):
    out = ref.out.copy()
    out.reshape(-1)[[3, 17, 40, 41, 90]] = np.nan  # a few elements here and there: no whole row or column
    return out


def unwritten_columns(w, ops, ref):
    out = ref.out.copy()
    out[..., -16:] = np.nan
    return out


def unwritten_rows(w, ops, ref):
    out = ref.out.copy()
    out[-1] = np.nan
    return out


def inf_flushed(w, ops, ref):
    out = ref.out.astype(np.float64)
    out[np.isinf(out)] = np.sign(out[np.isinf(out)]) * 65504.0
    return out.astype(ref.out.dtype)


def dropped_k_tail(w, ops, ref):
    A, B = ops["A"].astype(np.float64), ops["B"].astype(np.float64)
    K = A.shape[1]
    keep = K - K % 64
    return _round(A[:, :keep] @ B[:, :keep].T, ref)


def _low_precision_accumulation(partial_format):
    """A GEMM kernel whose partial sums are kept in ``partial_format`` (each exact product added, then rounded)."""
    def kernel(w, ops, ref):
        P = ops["A"].astype(np.float64)[:, None, :] * ops["B"].astype(np.float64)[None, :, :]
        acc = np.zeros(P.shape[:2])
        for j in range(P.shape[-1]):
            acc = gemm.round_float64(acc + P[..., j], partial_format)
        return acc.astype(np.float16)
    return kernel


fp16_accumulation = _low_precision_accumulation("float16")
bf16_accumulation = _low_precision_accumulation("bfloat16")


def _sparse_A(vals, meta, swap_nibbles=False, swap_meta=False, signed_shift=False):
    v, t = vals.view(np.uint8).astype(np.int64), meta.view(np.uint8).astype(np.int64)
    lo, hi = (v >> 4, v & 0xF) if swap_nibbles else (v & 0xF, v >> 4)
    v0, v1 = E2M1[lo], E2M1[hi]
    if signed_shift:  # hi = int8 >> 4 (arithmetic), decoded as (1 - 2 * (hi >> 3)) * |e2m1(hi & 7)|
        hs = vals.view(np.int8).astype(np.int64) >> 4
        v1 = (1 - 2 * (hs >> 3)) * np.abs(E2M1[hs & 7])
    i0, i1 = (((t >> 2) & 3), t & 3) if swap_meta else (t & 3, (t >> 2) & 3)
    m, g = v.shape
    A = np.zeros((m, g, 4))
    for j in range(4):
        A[:, :, j] += np.where(i0 == j, v0, 0.0) + np.where(i1 == j, v1, 0.0)
    return A.reshape(m, 4 * g)


def _sparse_bug(**kw):
    def kernel(w, ops, ref):
        return _round(_sparse_A(ops["a_vals"], ops["a_meta"], **kw) @ E4M3[ops["b_fp8"].view(np.uint8)].T, ref)
    return kernel


def unpromoted_fp8(w, ops, ref):
    A = _sparse_A(ops["a_vals"], ops["a_meta"])
    return _round(bounds.simulate(A, E4M3[ops["b_fp8"].view(np.uint8)], "hopper_fp8_wgmma"), ref)


def _nvfp4_bug(transform):
    def kernel(w, ops, ref):
        s = transform(np.asarray(ops["weight_scales"]).view(np.uint8))
        bad = w.reference(**{**ops, "weight_scales": s.view(ml_dtypes.float8_e4m3fn)})
        return bad.out
    return kernel


def _swizzled_128x4(s):
    """The plain [N, K/16] bytes read at the offsets of cuBLAS's 128x4 layout (N % 128 == 0, K/16 % 4 == 0):
    (r // 128) tiles of 512 bytes per 4 columns, then (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4."""
    n, nb = s.shape
    r, c = np.meshgrid(np.arange(n), np.arange(nb), indexing="ij")
    return s.reshape(-1)[(r // 128) * (nb // 4) * 512 + (c // 4) * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + c % 4]


def _swizzled_8x4(s):
    """The same for the 8x4 layout (N % 8 == 0): 32-byte tiles of 8 rows x 4 columns, row-major inside."""
    n, nb = s.shape
    r, c = np.meshgrid(np.arange(n), np.arange(nb), indexing="ij")
    return s.reshape(-1)[(r // 8) * (nb // 4) * 32 + (c // 4) * 32 + (r % 8) * 4 + c % 4]


def _w_decoded(ops):
    """W [N, K] decoded in float64: e2m1(code) * e4m3(block scale) * global decode scale, all exact."""
    codes = np.asarray(ops["weight_fp4"]).view(np.uint8)
    e = np.stack([E2M1[codes & 0xF], E2M1[codes >> 4]], axis=-1).reshape(codes.shape[0], -1)
    s = E4M3[np.asarray(ops["weight_scales"]).view(np.uint8) & 0x7F]
    return e * np.repeat(s, 16, axis=1) * float(np.float32(ops["weight_global_decode_scale"]))


def x_other_recipe(w, ops, ref):
    return gemm.nvfp4_linear(ops["x"], ops["weight_fp4"], ops["weight_scales"], ops["weight_global_decode_scale"],
                             recipe="te-4over6").out


def x_amax_per_row(w, ops, ref):
    x = ops["x"].reshape(-1, ops["x"].shape[-1])
    rows = [gemm.nvfp4_linear(x[i:i + 1], ops["weight_fp4"], ops["weight_scales"],
                              ops["weight_global_decode_scale"]).out for i in range(x.shape[0])]
    return np.concatenate(rows).reshape(ref.out.shape)


def x_amax_per_2_rows(w, ops, ref):
    x = ops["x"].reshape(-1, ops["x"].shape[-1])
    rows = [gemm.nvfp4_linear(x[i:i + 2], ops["weight_fp4"], ops["weight_scales"],
                              ops["weight_global_decode_scale"]).out for i in range(0, x.shape[0], 2)]
    return np.concatenate(rows).reshape(ref.out.shape)


def x_not_quantized(w, ops, ref):
    x = ops["x"].reshape(-1, ops["x"].shape[-1]).astype(np.float64)
    return _round(x @ _w_decoded(ops).T, ref).reshape(ref.out.shape)


def x_global_scale_left_out(w, ops, ref):
    # the workload's recipe: S_enc = fp32(2688 / amax), decode scale fp32(1 / S_enc)
    s_enc = np.float32(2688.0) / np.float32(np.max(np.abs(ops["x"].astype(np.float32))))
    return _round(ref.exact / np.float64(np.float32(1.0) / s_enc), ref)


def w_global_scale_left_out(w, ops, ref):
    return _round(ref.exact / np.float64(np.float32(ops["weight_global_decode_scale"])), ref)


def w_global_scale_twice(w, ops, ref):
    return _round(ref.exact * np.float64(np.float32(ops["weight_global_decode_scale"])), ref)


def w_global_scale_reciprocal(w, ops, ref):
    g = np.float64(np.float32(ops["weight_global_decode_scale"]))
    return _round(ref.exact / (g * g), ref)


def scales_read_ue8m0(w, ops, ref):
    """The weight's scale bytes taken as UE8M0 exponents 2^(byte - 127); x quantized right ("sol")."""
    from fp4ref.blockscale import nvfp4_dequantize, nvfp4_quantize

    x = ops["x"].reshape(-1, ops["x"].shape[-1])
    xd = nvfp4_dequantize(nvfp4_quantize(x, recipe="sol"), dtype=np.float64)
    codes = np.asarray(ops["weight_fp4"]).view(np.uint8)
    lo, hi = codes & 0xF, codes >> 4
    wc = np.stack([E2M1[lo], E2M1[hi]], axis=-1).reshape(codes.shape[0], -1)
    s = np.asarray(ops["weight_scales"]).view(np.uint8).astype(np.int64)
    wd = (wc.reshape(wc.shape[0], -1, 16) * np.ldexp(1.0, s - 127)[..., None]).reshape(wc.shape)
    return _round((xd @ wd.T * np.float64(np.float32(ops["weight_global_decode_scale"])))[None], ref)


def duplicate_overwrite(w, ops, ref):
    """A 2:4 decode that writes v0 then v1 into the group, so a duplicate index keeps v1 only."""
    v, t = ops["a_vals"].view(np.uint8).astype(np.int64), ops["a_meta"].view(np.uint8).astype(np.int64)
    v0, v1, i0, i1 = E2M1[v & 0xF], E2M1[v >> 4], t & 3, (t >> 2) & 3
    m, g = v.shape
    A = np.zeros((m, g, 4))
    for j in range(4):
        A[:, :, j] = np.where(i1 == j, v1, np.where(i0 == j, v0, 0.0))
    return _round(A.reshape(m, 4 * g) @ E4M3[ops["b_fp8"].view(np.uint8)].T, ref)


def bf16_rounded_output(w, ops, ref):
    return gemm.round_float64(gemm.round_float64(ref.exact, "bfloat16"), "float16").astype(np.float16)


def right(w, ops, ref):
    return ref.out.copy()


def fp32_sequential(w, ops, ref):
    """A correct fp32-accumulating kernel (not bitwise equal to the correctly rounded output everywhere)."""
    P = ops["A"].astype(np.float32)[:, None, :] * ops["B"].astype(np.float32)[None, :, :]
    acc = np.zeros(P.shape[:2], np.float32)
    for j in range(P.shape[-1]):
        acc = acc + P[..., j]
    return acc.astype(np.float16)


# (workload, family, M, N, K, kernel, expected bug, check kwargs)
PLANTED = {
    "truncating store": (GEMM, "exact_acc", 4, 64, 256, truncating_store, "rounded_toward_zero", {}),
    "ties away": (GEMM, "exact_acc", 8, 64, 2048, ties_away, "ties_away_from_zero", {}),
    "last N tile unwritten": (GEMM, "public", 4, 80, 64, unwritten_columns, "unwritten_tail_columns", {}),
    "last row unwritten": (GEMM, "public", 5, 64, 64, unwritten_rows, "unwritten_tail_rows", {}),
    "inf flushed to max": (GEMM, "extreme", 6, 32, 2048, inf_flushed, "nonfinite_flushed", {}),
    "K tail dropped": (GEMM, "public", 4, 64, 200, dropped_k_tail, "dropped_k_tail", {}),
    "fp16 accumulation": (GEMM, "exact_acc", 2, 32, 512, fp16_accumulation, "fp16_accumulation", {}),
    "bf16 accumulation": (GEMM, "exact_acc", 2, 32, 512, bf16_accumulation, "bf16_accumulation", {}),
    "rounded away from zero": (GEMM, "exact_acc", 4, 64, 256, rounded_away, "rounded_away_from_zero", {}),
    "scattered elements unwritten": (GEMM, "public", 4, 64, 64, unwritten_scattered, "unwritten_elements", {}),
    "swapped nibbles": (SPARSE, "public", 4, 64, 256, _sparse_bug(swap_nibbles=True), "swapped_nibbles", {}),
    "swapped meta fields": (SPARSE, "public", 4, 64, 256, _sparse_bug(swap_meta=True), "swapped_meta_fields", {}),
    "signed shift": (SPARSE, "public", 4, 64, 256, _sparse_bug(signed_shift=True), "signed_shift", {}),
    "unpromoted fp8": (SPARSE, "exact_acc", 3, 32, 2048, unpromoted_fp8, "unpromoted_fp8_accumulation",
                       {"model": "hopper_fp8_wgmma_promote(128)"}),
    "block scale missing": (NVFP4, "public", 2, 48, 256, _nvfp4_bug(lambda s: np.full_like(s, 0x38)),
                            "missing_block_scale", {}),
    "block scale of the previous block": (NVFP4, "public", 2, 48, 256, _nvfp4_bug(lambda s: np.roll(s, 1, axis=1)),
                                          "block_scale_wrong_block", {}),
    "plain scales read as 128x4": (NVFP4, "public", 2, 128, 256, _nvfp4_bug(_swizzled_128x4),
                                   "block_scales_read_swizzled", {}),
    "plain scales read as 8x4": (NVFP4, "public", 2, 48, 256, _nvfp4_bug(_swizzled_8x4),
                                 "block_scales_read_swizzled", {}),
    "x quantized with another recipe": (NVFP4, "public", 2, 48, 256, x_other_recipe, "activation_other_recipe", {}),
    "x amax per row": (NVFP4, "public", 4, 48, 256, x_amax_per_row, "activation_amax_not_global", {}),
    "x amax per 2 rows": (NVFP4, "public", 4, 48, 256, x_amax_per_2_rows, "activation_amax_not_global", {}),
    "x not quantized": (NVFP4, "public", 2, 48, 256, x_not_quantized, "activation_not_quantized", {}),
    "x global scale left out": (NVFP4, "public", 2, 48, 256, x_global_scale_left_out, "missing_global_scale", {}),
    "weight global scale left out": (NVFP4, "public", 2, 48, 256, w_global_scale_left_out, "missing_global_scale",
                                     {}),
    "weight global scale twice": (NVFP4, "public", 2, 48, 256, w_global_scale_twice, "global_scale_misapplied", {}),
    "weight global scale inverted": (NVFP4, "public", 2, 48, 256, w_global_scale_reciprocal,
                                     "global_scale_misapplied", {}),
    "scales read as UE8M0": (NVFP4, "public", 2, 48, 256, scales_read_ue8m0, "block_scales_read_ue8m0", {}),
    "duplicate index overwrites": (SPARSE, "public", 4, 64, 256, duplicate_overwrite, "duplicate_index_overwrite",
                                   {}),
    "output rounded to bf16": (GEMM, "public", 4, 64, 256, bf16_rounded_output, "bf16_rounded_output", {}),
}

# what the evidence of a planted bug must say, where a bug has several forms
EVIDENCE = {
    "plain scales read as 128x4": "128x4 layout", "plain scales read as 8x4": "8x4 layout",
    "x quantized with another recipe": "recipe 'te-4over6'", "x amax per row": "tiles of 1 row:",
    "x amax per 2 rows": "tiles of 2 rows:",
    "x global scale left out": "x's global decode scale", "weight global scale left out": "the weight's global",
    "weight global scale twice": "the weight's global decode scale applied twice",
    "weight global scale inverted": "the weight's global decode scale's reciprocal",
}


def _checked(w, family, m, n, k, kernel, kw):
    ops = _ops(w, family, m, n, k)
    ref = w.reference(**ops)
    out = kernel(w, ops, ref)
    rep = bounds.check(out, ref, kw.get("model", bounds.DEFAULT_MODEL), poison=float("nan"),
                       exact_accumulation=family in w.exact_families)
    return ops, ref, out, rep


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_bug_is_named(name):
    w, family, m, n, k, kernel, bug, kw = PLANTED[name]
    ops, ref, out, rep = _checked(w, family, m, n, k, kernel, kw)
    assert not rep.ok, rep.summary()
    found = diagnose(out, ref, workload=w, operands=ops)
    names = {d.bug for d in found}
    # swapping the nibbles of a value byte and swapping the index fields of its meta byte give the same product;
    # an unpromoted RZ accumulator whose every wrong element is the neighbour toward zero is a truncating store too
    same = {"swapped_nibbles", "swapped_meta_fields"}
    also = {"unpromoted_fp8_accumulation": {"rounded_toward_zero"}}.get(bug, set())
    assert bug in names and (names <= same if bug in same else names <= {bug} | also), (name,
                                                                                       [str(d) for d in found])
    assert all(d.evidence for d in found)
    if name in EVIDENCE:
        assert EVIDENCE[name] in found[0].evidence and " or " not in found[0].evidence.split(":")[0], str(found[0])


CORRECT = {
    "gemm exact_acc": (GEMM, "exact_acc", 4, 64, 256, right),
    "gemm public, fp32 sequential": (GEMM, "public", 4, 64, 256, fp32_sequential),
    "gemm extreme": (GEMM, "extreme", 6, 32, 256, right),
    "sparse public": (SPARSE, "public", 4, 64, 256, right),
    "sparse exact_acc": (SPARSE, "exact_acc", 2, 32, 2048, right),
    "nvfp4 adversarial": (NVFP4, "adversarial", 2, 48, 256, right),
}


@pytest.mark.parametrize("name", list(CORRECT))
def test_correct_kernel_gets_no_diagnosis(name):
    w, family, m, n, k, kernel = CORRECT[name]
    ops, ref, out, rep = _checked(w, family, m, n, k, kernel, {"model": "fp32_rn" if "fp32" in name else
                                                                bounds.DEFAULT_MODEL})
    assert rep.ok, rep.summary()
    assert diagnose(out, ref, workload=w, operands=ops) == []


def test_a_truncating_store_is_named_so_where_a_recomputation_explains_only_most_of_the_sample():
    """A truncating bf16 store on the sparse exact_acc family: every wrong element is the neighbour toward zero,
    while an unpromoted 14-bit accumulator recomputed on the sample matched ~90% of it (seed 3 named that bug and
    not the store). The pattern that explains every wrong element wins."""
    for seed, m in ((3, 1), (0, 5), (1, 16)):
        ops = SPARSE.families["exact_acc"](np.random.default_rng(seed), m, 128, 2048)
        ref = SPARSE.reference(**ops)
        out = truncating_store(SPARSE, ops, ref)
        names = [d.bug for d in diagnose(out, ref, workload=SPARSE, operands=ops)]
        assert "rounded_toward_zero" in names, (seed, m, names)


def test_a_tiny_or_all_zero_output_is_not_given_a_recomputed_bug():
    """Hypothesis shrinks a failure to a 1 x 1 output: one truncated element matched some recomputed bug 100% (an
    RZ store was named fp16_accumulation). A bug needs >= 4 sampled elements it explains and the reference does
    not; an all-zero output is named zero_output, not a bug that happens to compute zeros on that family."""
    for w, k, seed in ((GEMM, 256, 11), (SPARSE, 2048, 0), (SPARSE, 2048, 14)):  # each was named a bug before
        ops = w.families["exact_acc"](np.random.default_rng(seed), 1, 1, k)
        ref = w.reference(**ops)
        out = truncating_store(w, ops, ref)
        assert not np.array_equal(out.view(np.uint16), ref.out.view(np.uint16))
        assert diagnose(out, ref, workload=w, operands=ops) == [], (w.name, seed)
    ops = _ops(GEMM, "exact_acc", 4, 64, 256)
    ref = GEMM.reference(**ops)
    found = diagnose(np.zeros_like(ref.out), ref, workload=GEMM, operands=ops)
    assert [d.bug for d in found] == ["zero_output"] and "all 256 outputs are zero" in found[0].evidence


def test_a_poison_of_its_own_bits_tells_unwritten_from_computed_nans():
    """fp4ref verify fills outputs with a NaN of its own payload (POISON_BITS): elements holding those bits are
    unwritten, other NaNs were computed. A dense product over the sparse workload's nan_b operands multiplies B's
    NaN bytes at pruned positions by zero (the reference ignores them): check counts NaN mismatches, not unwritten
    elements, and diagnose names the dense product instead of an unwritten tile."""
    poison = poison_value(SPARSE.output_dtype)
    assert np.asarray(poison).view(np.uint16) == POISON_BITS[SPARSE.output_dtype] and np.isnan(poison)
    ops = _ops(SPARSE, "nan_b", 4, 64, 256)
    ref = SPARSE.reference(**ops)
    dense = _sparse_bug()(SPARSE, ops, ref)  # numpy's NaN: other bits than the poison's
    computed = np.isnan(dense.astype(np.float64)) & ~np.isnan(ref.exact)
    assert computed.any()
    rep = bounds.check(dense, ref, poison=poison)
    assert rep.unwritten == 0 and rep.nan_mismatch == int(computed.sum()) and not rep.ok
    assert bounds.check(dense, ref, poison=float("nan")).unwritten == int(computed.sum())  # any NaN: "unwritten"
    found = diagnose(dense, ref, workload=SPARSE, operands=ops, poison=poison)
    assert [d.bug for d in found] == ["unselected_nan_propagated"], [str(d) for d in found]
    assert [d.bug for d in diagnose(dense, ref, poison=poison)] == ["computed_nan"]  # without the operands
    # the poison's own bits where the kernel wrote nothing: unwritten, by both
    ops = _ops(SPARSE, "public", 4, 64, 256)
    ref = SPARSE.reference(**ops)
    out = ref.out.copy()
    out[..., -16:] = poison
    assert bounds.check(out, ref, poison=poison).unwritten == out[..., -16:].size
    assert [d.bug for d in diagnose(out, ref, workload=SPARSE, operands=ops, poison=poison)] == [
        "unwritten_tail_columns"]


def test_operands_that_do_not_reproduce_ref_are_an_error_even_with_fitting_shapes():
    """Square shapes let A and B be swapped (or another A, or rows= that are not ref's) without a shape error: the
    correct output recomputed from the operands on the sample must be ref's, bit for bit, else a ValueError (it was
    a silent "no known bug")."""
    ops = _ops(GEMM, "exact_acc", 64, 64, 256)
    ref = GEMM.reference(**ops)
    out = fp16_accumulation(GEMM, ops, ref)
    assert {d.bug for d in diagnose(out, ref, workload=GEMM, operands=ops)} == {"fp16_accumulation"}
    other = _ops(GEMM, "exact_acc", 64, 64, 256, seed=1)
    for bad in ({"A": ops["B"], "B": ops["A"]}, {"A": other["A"], "B": ops["B"]}):
        with pytest.raises(ValueError, match=r"^operands do not reproduce ref: on \d+ of \d+ sampled elements"):
            diagnose(out, ref, workload=GEMM, operands=bad)
    nv = _ops(NVFP4, "public", 6, 48, 256)
    sub = NVFP4.slice_rows(nv, [1, 3])
    ref2 = NVFP4.reference(**sub)
    diagnose(ref2.out.copy(), ref2, workload=NVFP4, operands=nv, rows=[1, 3])
    with pytest.raises(ValueError, match="operands do not reproduce ref"):
        diagnose(ref2.out.copy(), ref2, workload=NVFP4, operands=nv, rows=[0, 2])


def test_diagnose_rejects_a_shape_mismatch():
    ops = _ops(GEMM, "public", 2, 16, 32)
    ref = GEMM.reference(**ops)
    with pytest.raises(ValueError, match="shape"):
        diagnose(ref.out[:1], ref)
    with pytest.raises(ValueError, match="output_rounding="):
        diagnose(ref.out, ref, output_rounding="rz")
    with pytest.raises(ValueError, match="operands"):
        diagnose(ref.out, ref, workload=GEMM)
    # the workload by name is the workload; other types and operands that are no mapping of the arguments are named
    assert diagnose(ref.out, ref, workload=GEMM.name, operands=ops) == []
    with pytest.raises(ValueError, match=r"workload='gemm' is not a known workload"):
        diagnose(ref.out, ref, workload="gemm", operands=ops)
    with pytest.raises(TypeError, match=r"workload=3: expected a fp4ref\.workloads\.Workload or its name"):
        diagnose(ref.out, ref, workload=3, operands=ops)
    with pytest.raises(TypeError, match=r"operands: expected a mapping from the workload's argument names \['A', "
                                        r"'B'\] to arrays, got tuple"):
        diagnose(ref.out, ref, workload=GEMM, operands=(ops["A"], ops["B"]))
    with pytest.raises(ValueError, match=r"operands lacks \['A'\] of gemm_n3072_k2048's arguments"):
        diagnose(ref.out, ref, workload=GEMM, operands={"X": ops["A"], "B": ops["B"]})
    with pytest.raises(ValueError, match=r"operands has \['C'\], which are not gemm_n3072_k2048's arguments"):
        diagnose(ref.out, ref, workload=GEMM, operands={**ops, "C": ops["A"]})  # a misspelt one: not ignored


def test_a_workload_of_another_output_dtype_than_ref_is_refused():
    """diagnose(gemm_ref.out, gemm_ref, workload=<the sparse workload>, operands=<fitting sparse operands>) returned
    [] (a float16 reference diagnosed as a bfloat16 workload), and the reverse too: a ValueError naming workload."""
    m, n, k = 2, 16, 32
    g_ops = _ops(GEMM, "public", m, n, k)
    s_ops = _ops(SPARSE, "public", m, n, k)
    g_ref, s_ref = GEMM.reference(**g_ops), SPARSE.reference(**s_ops)
    assert g_ref.out.dtype != s_ref.out.dtype and g_ref.out.shape == s_ref.out.shape and g_ref.K == s_ref.K
    for ref, w, ops, want, got in ((g_ref, SPARSE, s_ops, "bfloat16", "float16"),
                                   (s_ref, GEMM, g_ops, "float16", "bfloat16")):
        for wl in (w, w.name):
            with pytest.raises(ValueError, match=rf"^workload='{w.name}' outputs {want}, but ref's output is {got}"):
                diagnose(ref.out, ref, workload=wl, operands=ops)
        with pytest.raises(ValueError, match=rf"^workload='{w.name}' outputs {want}"):  # before asking for operands
            diagnose(ref.out, ref, workload=w)
    assert diagnose(g_ref.out, g_ref, workload=GEMM, operands=g_ops) == []
    assert diagnose(s_ref.out, s_ref, workload=SPARSE, operands=s_ops) == []


def test_an_unknown_workload_is_named_before_the_operands_are_asked_for():
    """diagnose(out, ref, workload="nope") said "workload and operands go together"; the name is the mistake, so it
    is a ValueError naming it and the known workloads, with or without operands (a wrong type: a TypeError)."""
    ref = GEMM.reference(**_ops(GEMM, "public", 2, 16, 32))
    known = r"\['gemm_n3072_k2048', 'nvfp4_linear_n8192_k8192', 'sparse_gemm_fp4_fp8_n2048_k2048'\]"
    for operands in (None, {"A": 0, "B": 0}):
        with pytest.raises(ValueError, match=rf"^workload='nope' is not a known workload; expected one of {known}$"):
            diagnose(ref.out, ref, workload="nope", operands=operands)
    with pytest.raises(TypeError, match=r"workload=3: expected a fp4ref\.workloads\.Workload or its name"):
        diagnose(ref.out, ref, workload=3)
    with pytest.raises(ValueError, match="workload and operands go together"):  # a known name still needs them
        diagnose(ref.out, ref, workload=GEMM.name)


def _fp16_unfused(A, B):
    """acc = fp16(acc + fp16(a * b)), step by step in numpy float16 arithmetic (each product rounded first)."""
    acc = np.zeros((A.shape[0], B.shape[0]), np.float16)
    for j in range(A.shape[1]):
        prod = A[:, j][:, None] * B[:, j][None, :]  # float16 * float16 -> float16: the product rounded
        assert prod.dtype == np.float16
        acc = acc + prod
    return acc


def test_unfused_fp16_accumulation_is_named():
    # fp16 randn operands at K = 300, N = 16: rounding each product to fp16 before the add changes most outputs
    # against the fused form (the exact product added to the fp16 sum); either is fp16 accumulation
    ops = _ops(GEMM, "public", 4, 16, 300)
    ref = GEMM.reference(**ops)
    unfused = _fp16_unfused(ops["A"], ops["B"])
    fused = fp16_accumulation(GEMM, ops, ref)
    assert np.mean(unfused != fused) > 0.5
    for out, variant in ((unfused, "unfused"), (fused, "fused")):
        assert not bounds.check(out, ref, bounds.DEFAULT_MODEL).ok
        found = diagnose(out, ref, workload=GEMM, operands=ops)
        assert [d.bug for d in found] == ["fp16_accumulation"], (variant, [str(d) for d in found])
        assert found[0].evidence.startswith(f"{variant}, "), found[0].evidence
    # the correctly rounded output, and a correct fp32-accumulating kernel, get no diagnosis on the same operands
    assert diagnose(ref.out, ref, workload=GEMM, operands=ops) == []
    assert diagnose(fp32_sequential(GEMM, ops, ref), ref, workload=GEMM, operands=ops) == []


def test_ref_and_operands_are_checked_and_torch_operands_are_read():
    """ref=None raised an AttributeError, list operands a raw TypeError inside the recomputation, and torch
    operands an AttributeError (no .astype), although the kit accepts torch tensors: now a TypeError naming ref /
    the operand, and torch tensors read as numpy arrays of the same bits (the same diagnosis as numpy)."""
    torch = pytest.importorskip("torch")
    ops = _ops(GEMM, "public", 4, 64, 256)
    ref = GEMM.reference(**ops)
    with pytest.raises(TypeError, match=r"^ref: expected the fp4ref\.gemm\.Reference the output failed against, "
                                        r"got NoneType$"):
        diagnose(ref.out, None)
    with pytest.raises(TypeError, match=r"^operands\['A'\]: expected a numpy array or a torch tensor, got list$"):
        diagnose(ref.out, ref, workload=GEMM, operands={"A": ops["A"].tolist(), "B": ops["B"]})
    out = _fp16_unfused(ops["A"], ops["B"])  # a planted bug, so the recomputation really runs
    want = diagnose(out, ref, workload=GEMM, operands=ops)
    assert [d.bug for d in want] == ["fp16_accumulation"]
    torch_ops = {k: torch.from_numpy(v.copy()) for k, v in ops.items()}
    assert diagnose(out, ref, workload=GEMM, operands=torch_ops) == want


def _k_tail_case():
    """fp16 A [8, 256], B [64, 256], and the output of a kernel that drops the last 64 K elements."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((8, 256)).astype(np.float16)
    B = rng.standard_normal((64, 256)).astype(np.float16)
    return A, B, gemm.gemm_fp16(A, B), gemm.gemm_fp16(A[:, :192], B[:, :192]).out


def test_operands_that_do_not_fit_the_reference_are_named():
    """Operands of other shapes than the reference's M, N, K gave a raw IndexError (A and B swapped) or a silent
    "no known bug" (a shorter K): a candidate's error was swallowed. Now each operand's shape is checked against
    the reference up front, a ValueError naming the operand and the shape expected."""
    A, B, ref, out = _k_tail_case()
    assert [d.bug for d in diagnose(out, ref, workload=GEMM, operands={"A": A, "B": B})] == ["dropped_k_tail"]
    with pytest.raises(ValueError, match=r"^operands\['A'\] has shape \(64, 256\); expected \(8, 256\) \(\[M, K\] "
                                         r"for the reference's output \(8, 64\), K = 256\)$"):
        diagnose(out, ref, workload=GEMM, operands={"A": B, "B": A})
    with pytest.raises(ValueError, match=r"^operands\['A'\] has shape \(8, 128\); expected \(8, 256\)"):
        diagnose(out, ref, workload=GEMM, operands={"A": A[:, :128], "B": B[:, :128]})
    with pytest.raises(ValueError, match=r"^operands\['B'\] has shape \(32, 256\); expected \(64, 256\)"):
        diagnose(out, ref, workload=GEMM, operands={"A": A, "B": B[:32]})
    # the sparse workload: b_fp8 [N, K] with another K
    ops = _ops(SPARSE, "public", 4, 64, 256)
    sref = SPARSE.reference(**ops)
    with pytest.raises(ValueError, match=r"^operands\['b_fp8'\] has shape \(64, 128\); expected \(64, 256\)"):
        diagnose(sref.out, sref, workload=SPARSE, operands={**ops, "b_fp8": ops["b_fp8"][:, :128]})


def test_nvfp4_operands_are_checked_and_a_shape_1_global_scale_is_its_element():
    """NVFP4: a global decode scale of shape (1,) (compressed-tensors' layout, which NVFP4Tensor reads as its
    element) and an x of another K both gave "no known bug"; now the first is read as its element (the same
    diagnosis as the float), the second is a ValueError naming operands['x'], as is an x holding NaN (no reference
    exists for it: the quantizer refuses it) and a global scale of more than one element a TypeError."""
    w, family, m, n, k, kernel, bug, kw = PLANTED["block scale missing"]
    ops, ref, out, _ = _checked(w, family, m, n, k, kernel, kw)
    g = ops["weight_global_decode_scale"]
    want = diagnose(out, ref, workload=NVFP4, operands=ops)
    assert [d.bug for d in want] == ["missing_block_scale"]
    assert diagnose(out, ref, workload=NVFP4, operands={**ops, "weight_global_decode_scale":
                                                         np.array([g], np.float32)}) == want
    with pytest.raises(ValueError, match=r"^operands\['x'\] has shape \(1, 2, 128\); expected \(1, 2, 256\) "
                                         r"\(\[\.\.\., M, K\] for the reference's output \(1, 2, 48\), K = 256\)$"):
        diagnose(out, ref, workload=NVFP4, operands={**ops, "x": ops["x"][..., :128]})
    with pytest.raises(TypeError, match=r"^operands\['weight_global_decode_scale'\] must be a real number"):
        diagnose(out, ref, workload=NVFP4, operands={**ops, "weight_global_decode_scale": np.array([g, g])})
    with pytest.raises(ValueError, match=r"^operands\['weight_global_decode_scale'\]=-1\.0: expected a finite "
                                         r"positive float"):
        diagnose(out, ref, workload=NVFP4, operands={**ops, "weight_global_decode_scale": -1.0})
    # the whole x (rows given) with a NaN in a row the reference does not cover: its amax, with which the
    # reference's rows are quantized, is NaN, so no reference exists for these operands
    x = np.concatenate([ops["x"], ops["x"]], axis=1)
    x[0, 3, 5] = np.nan
    with pytest.raises(ValueError, match=r"^operands\['x'\] holds NaN/inf"):
        diagnose(out, ref, workload=NVFP4, operands={**ops, "x": x}, rows=[0, 1])


def test_operand_dtypes_are_checked_and_scalars_only_where_the_workload_has_one():
    """b_fp8 as float32 was read through .view(uint8) as 4 x K bytes (a raw numpy broadcast error), and a_vals=1.0
    passed the check (a real scalar was allowed for every operand) to fail as "'float' object is not
    subscriptable". Now each operand's dtype is checked, a TypeError naming it; a scalar only for the global
    decode scale, the one scalar operand."""
    ops = _ops(SPARSE, "public", 4, 64, 256)
    ref = SPARSE.reference(**ops)
    with pytest.raises(TypeError, match=r"^operands\['b_fp8'\] must hold E4M3FN bytes: uint8 \(or int8 read as "
                                        r"unsigned\) or ml_dtypes\.float8_e4m3fn, got dtype float32$"):
        diagnose(ref.out, ref, workload=SPARSE, operands={**ops, "b_fp8": ops["b_fp8"].astype(np.float32)})
    with pytest.raises(TypeError, match=r"^operands\['a_vals'\]: expected a numpy array or a torch tensor, "
                                        r"got float$"):
        diagnose(ref.out, ref, workload=SPARSE, operands={**ops, "a_vals": 1.0})
    with pytest.raises(TypeError, match=r"^operands\['a_meta'\] must be uint8 or int8 \(raw bytes\), got dtype "
                                        r"int16$"):
        diagnose(ref.out, ref, workload=SPARSE, operands={**ops, "a_meta": ops["a_meta"].astype(np.int16)})
    A, B, gref, out = _k_tail_case()
    with pytest.raises(TypeError, match=r"^operands\['B'\] must have dtype float16, got float32$"):
        diagnose(out, gref, workload=GEMM, operands={"A": A, "B": B.astype(np.float32)})
    with pytest.raises(TypeError, match=r"^operands\['A'\]: expected a numpy array or a torch tensor, got float$"):
        diagnose(out, gref, workload=GEMM, operands={"A": 1.0, "B": B})
    nops = _ops(NVFP4, "public", 2, 48, 256)
    nref = NVFP4.reference(**nops)
    with pytest.raises(TypeError, match=r"^operands\['x'\] must be bfloat16 \(ml_dtypes\) or float32, got dtype "
                                        r"float16$"):
        diagnose(nref.out, nref, workload=NVFP4, operands={**nops, "x": nops["x"].astype(np.float16)})
    with pytest.raises(TypeError, match=r"^operands\['weight_scales'\]: expected a numpy array or a torch tensor"):
        diagnose(nref.out, nref, workload=NVFP4, operands={**nops, "weight_scales": 1.0})
    with pytest.raises(TypeError, match=r"^operands\['weight_fp4'\] must be uint8 packed E2M1 codes, got dtype "
                                        r"float32$"):
        diagnose(nref.out, nref, workload=NVFP4, operands={**nops, "weight_fp4": nops["weight_fp4"].astype("f4")})


def test_an_error_in_a_recomputation_is_not_swallowed(monkeypatch):
    """A candidate's ValueError / TypeError / IndexError was swallowed (the candidate skipped), which turned
    operands that do not fit into a silent "no known bug". Every operand is now checked first, so a candidate
    that raises is a mistake, and it surfaces."""
    import fp4ref.diagnose as dg

    def broken(A, B, K):
        return [("dropped_k_tail", "", lambda: A[:, :K + 1][:, K])]  # an IndexError

    monkeypatch.setattr(dg, "_dense_variants", broken)
    A, B, ref, out = _k_tail_case()
    with pytest.raises(IndexError):
        diagnose(out, ref, workload=GEMM, operands={"A": A, "B": B})


def test_rows_is_checked():
    """rows (the operand rows a row-subset reference covers) was not checked: indices past the operands' M, or
    fewer than the output's rows, gave a raw IndexError, floats numpy's "arrays used as indices must be of
    integer type", and -1 silently wrapped to the last row (no diagnosis). Now a TypeError / ValueError names
    rows; a valid subset still diagnoses."""
    A, B, _, _ = _k_tail_case()
    A2 = np.concatenate([A, A[::-1] * np.float16(0.5)])  # the whole input: 16 rows; the reference covers 8
    rows = [1, 3, 4, 6, 9, 11, 12, 15]
    ref = gemm.gemm_fp16(A2[rows], B)
    out = gemm.gemm_fp16(A2[rows, :192], B[:, :192]).out
    ops = {"A": A2, "B": B}
    assert [d.bug for d in diagnose(out, ref, workload=GEMM, operands=ops, rows=rows)] == ["dropped_k_tail"]
    assert [d.bug for d in diagnose(out, ref, workload=GEMM, operands=ops, rows=np.array(rows, np.uint16))] == [
        "dropped_k_tail"]
    with pytest.raises(ValueError, match=r"^rows holds 8 index\(es\) outside \[0, 16\) \(the operands hold M = 16 "
                                         r"rows\), the first rows\[0\] = 100$"):
        diagnose(out, ref, workload=GEMM, operands=ops, rows=list(range(100, 108)))
    with pytest.raises(ValueError, match=r"^rows has 2 entries; expected one per output row: 8 \(out and the "
                                         r"reference have shape \(8, 64\)\)$"):
        diagnose(out, ref, workload=GEMM, operands=ops, rows=[0, 1])
    with pytest.raises(TypeError, match=r"^rows: expected a 1-D sequence or array of integer row indices, got an "
                                        r"element 0\.0 \(float\)$"):
        diagnose(out, ref, workload=GEMM, operands=ops, rows=[0.0] * 8)
    with pytest.raises(ValueError, match=r"^rows holds 1 index\(es\) outside \[0, 16\) .*, the first rows\[7\] = -1; "
                                         r"negative indices are not read from the end$"):
        diagnose(out, ref, workload=GEMM, operands=ops, rows=rows[:7] + [-1])
    with pytest.raises(TypeError, match=r"^rows: .* got an array of dtype bool$"):  # a mask is no list of indices
        diagnose(out, ref, workload=GEMM, operands=ops, rows=np.isin(np.arange(16), rows))
    with pytest.raises(ValueError, match=r"^rows: .* got an array of shape \(2, 4\)$"):
        diagnose(out, ref, workload=GEMM, operands=ops, rows=np.array(rows).reshape(2, 4))
    with pytest.raises(TypeError, match=r"^rows: .* got int$"):
        diagnose(out, ref, workload=GEMM, operands=ops, rows=3)
    # without operands rows is not read, but it is still checked (its length, its type, no negative index)
    with pytest.raises(ValueError, match=r"^rows has 2 entries"):
        diagnose(out, ref, rows=[0, 1])


def test_out_must_have_the_reference_dtype():
    """out was cast to float64 whatever its dtype: int32, bool, or the float32 exact values all gave "no known bug"
    where fp4ref.bounds.check refuses them. Now the same rule (and message) as bounds.check: a TypeError."""
    A, B, ref, out = _k_tail_case()
    ops = {"A": A, "B": B}
    for bad in (out.astype(np.int32), out.astype(bool), ref.exact.astype(np.float32)):
        with pytest.raises(TypeError, match=rf"^out must have the reference's output dtype float16, got {bad.dtype}$"):
            diagnose(bad, ref, workload=GEMM, operands=ops)
        with pytest.raises(TypeError, match="^out must have the reference's output dtype float16"):
            bounds.check(bad, ref)  # the rule diagnose shares
    with pytest.raises(TypeError, match=r"^out must be a numpy array or torch tensor, got list$"):
        diagnose(out.tolist(), ref)
    # the right dtype, numpy or torch, is diagnosed as before
    want = diagnose(out, ref, workload=GEMM, operands=ops)
    assert [d.bug for d in want] == ["dropped_k_tail"]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        assert diagnose(torch.from_numpy(out.copy()), ref, workload=GEMM, operands=ops) == want
    # bf16 outputs (sparse, NVFP4): ml_dtypes bfloat16 is the dtype; float32 is refused there too
    sops = _ops(SPARSE, "public", 4, 64, 256)
    sref = SPARSE.reference(**sops)
    assert diagnose(sref.out, sref, workload=SPARSE, operands=sops) == []
    with pytest.raises(TypeError, match=r"^out must have the reference's output dtype bfloat16, got float32$"):
        diagnose(sref.out.astype(np.float32), sref, workload=SPARSE, operands=sops)


def test_sparse_nan_b_is_diagnosed_without_the_accumulator_candidate():
    """b with NaN bytes (the sparse workload's nan_b family): the 14-bit accumulator simulator models finite
    arithmetic and refuses NaN operands, so that candidate is left out (diagnose raised through it); a correct
    output names no bug, and a planted truncating store is still named."""
    ops = _ops(SPARSE, "nan_b", 4, 64, 256)
    assert np.isnan(E4M3[ops["b_fp8"].view(np.uint8)]).any()
    with pytest.raises(ValueError, match=r"^b holds NaN or inf"):
        bounds.simulate(_sparse_A(ops["a_vals"], ops["a_meta"]), E4M3[ops["b_fp8"].view(np.uint8)], "exact")
    ref = SPARSE.reference(**ops)
    assert diagnose(ref.out.copy(), ref, workload=SPARSE, operands=ops) == []
    names = {d.bug for d in diagnose(truncating_store(SPARSE, ops, ref), ref, workload=SPARSE, operands=ops)}
    assert names == {"rounded_toward_zero"}, names


def test_a_truncating_store_that_also_flushes_an_overflow_gets_both_names():
    """A truncating store turns an overflow into 65504 as well: diagnose named only nonfinite_flushed (it stopped
    there); the finite elements are analysed too now."""
    rng = np.random.default_rng(5)
    A = rng.standard_normal((4, 64)).astype(np.float16)
    B = rng.standard_normal((16, 64)).astype(np.float16)
    A[0], B[0] = 64, 64  # element (0, 0): 64 * 64 * 64 = 262144 overflows fp16
    ref = gemm.gemm_fp16(A, B)
    assert np.isinf(ref.out[0, 0])
    out = truncating_store(GEMM, {}, ref)
    out[0, 0] = np.float16(65504)
    found = diagnose(out, ref)
    assert [d.bug for d in found] == ["nonfinite_flushed", "rounded_toward_zero"], found
    # the evidence names the values as numbers (not numpy's "np.float64(...)" repr)
    assert found[0].evidence.endswith("e.g. (0, 0): out 65504.0, reference inf"), found[0].evidence
