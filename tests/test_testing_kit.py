"""Power tests: deliberately wrong implementations, each flagged by fp4ref's check on generated inputs, with what
FlashInfer-Bench's checker (atol = rtol = 1e-2) and SOL-ExecBench's (atol 0.005, rtol 0.02, 99% matched) say
about the SAME outputs. The table ``VERDICTS`` is the source of the table in docs/testing.md.

Each wrong implementation is an exact numpy emulation of the bug followed by the correct single RNE rounding,
so that only the bug differs from the reference.
"""
from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fp4ref import bounds, gemm, testing
from fp4ref import strategies as fst
from fp4ref.blockscale import NVFP4Tensor, nvfp4_quantize
from fp4ref.packing import compress_2to4, decompress_2to4

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
E4M3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


# ---------------------------------------------------------------------------------------------------------------
# wrong implementations
# ---------------------------------------------------------------------------------------------------------------


def _bf16(x):
    return gemm.round_float64(x, "bfloat16").astype(ml_dtypes.bfloat16)


def _f16(x):
    return gemm.round_float64(x, "float16").astype(np.float16)


def sparse_kernel(vals, meta, b, *, swap_nibbles=False, swap_meta_fields=False, signed_shift=False):
    """The sparse workload, exactly, with optional bugs; bf16 RNE output."""
    v = vals.view(np.uint8).astype(np.int64)
    t = meta.view(np.uint8).astype(np.int64)
    lo, hi = v & 0xF, v >> 4
    if swap_nibbles:
        lo, hi = hi, lo
    val0, val1 = E2M1[lo], E2M1[hi]
    if signed_shift:
        # hi = int8 >> 4 (arithmetic shift, no mask), decoded as (1 - 2 * (hi >> 3)) * |e2m1|: for bytes >= 0x80
        # the "sign" is -1, so the value is +3x the magnitude.
        hs = vals.view(np.int8).astype(np.int64) >> 4
        val1 = (1 - 2 * (hs >> 3)) * np.abs(E2M1[hs & 7])
    i0, i1 = t & 3, (t >> 2) & 3
    if swap_meta_fields:
        i0, i1 = i1, i0
    M, G = v.shape
    A = np.zeros((M, G, 4))
    for j in range(4):
        A[:, :, j] += np.where(i0 == j, val0, 0.0) + np.where(i1 == j, val1, 0.0)
    return _bf16(A.reshape(M, 4 * G) @ E4M3[b].T)


def fp16_accumulating_gemm(A, B):
    """C = A @ B.T accumulated in fp16 (each partial sum rounded to fp16)."""
    acc = np.zeros((A.shape[0], B.shape[0]), np.float16)
    Af, Bf = A.astype(np.float32), B.astype(np.float32)
    for k in range(A.shape[1]):
        acc = (acc.astype(np.float32) + Af[:, k:k + 1] * Bf[:, k]).astype(np.float16)
    return acc


def round_half_away(x, fmt):
    """Round float64 values to fmt, ties AWAY from zero (the bug), otherwise nearest."""
    f = gemm.OUTPUT_FORMATS[fmt]
    _, e = np.frexp(x)
    q = np.maximum(e - 1, f.emin) - (f.p - 1)
    y = np.ldexp(np.sign(x) * np.floor(np.abs(np.ldexp(x, -q)) + 0.5), q)
    return y.astype(f.dtype)


def _nvt(t, **changes):
    d = dict(codes=t.codes, scales=t.scales, global_decode_scale=t.global_decode_scale, shape=t.shape,
             recipe=t.recipe, block=t.block, axis=t.axis)
    d.update(changes)
    return NVFP4Tensor(**d)


# ---------------------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------------------


def sparse_inputs(seed, M=16, N=64, K=256, canonical=True):
    rng = np.random.default_rng(seed)
    if canonical:
        codes = rng.integers(0, 16, (M, K)).astype(np.uint8)
        keep = np.zeros((M, K // 4, 4), bool)
        pos = np.argsort(rng.random((M, K // 4, 4)), axis=-1)[..., :2]
        np.put_along_axis(keep, pos, True, axis=-1)
        codes = np.where(keep.reshape(M, K), codes, 0).astype(np.uint8)
        vals, meta = compress_2to4(codes)
    else:
        vals = rng.integers(-128, 128, (M, K // 4), dtype=np.int8)
        meta = rng.integers(-128, 128, (M, K // 4), dtype=np.int8)
    b = rng.standard_normal((N, K)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return vals, meta, b


def fp16_inputs(seed, M=8, N=64, K=2048):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((N, K)).astype(np.float16)


# ---------------------------------------------------------------------------------------------------------------
# the cases: (name, function returning (out, ref, check kwargs)), and the public checkers' verdicts
# ---------------------------------------------------------------------------------------------------------------


def case_nibble_swap():
    vals, meta, b = sparse_inputs(1)
    return sparse_kernel(vals, meta, b, swap_nibbles=True), gemm.sparse_gemm_fp4_fp8(vals, meta, b), {}


def case_meta_swap():
    vals, meta, b = sparse_inputs(2)
    return sparse_kernel(vals, meta, b, swap_meta_fields=True), gemm.sparse_gemm_fp4_fp8(vals, meta, b), {}


def case_signed_shift():
    vals, meta, b = sparse_inputs(3, canonical=False)  # the public benchmark's random int8 bytes
    return sparse_kernel(vals, meta, b, signed_shift=True), gemm.sparse_gemm_fp4_fp8(vals, meta, b), {}


def case_ties_away():
    A, B = fst.exact_accumulation_fp16_arrays(np.random.default_rng(4), 8, 64, 2048)
    ref = gemm.gemm_fp16(A, B)
    return round_half_away(ref.exact, "float16"), ref, {"model": "fp32_rn", "exact_accumulation": True}


def _nvfp4_pair(seed, M=8, N=64, K=256):
    rng = np.random.default_rng(seed)
    xq = nvfp4_quantize(rng.standard_normal((M, K)).astype(np.float32), recipe="sol")
    wq = nvfp4_quantize(rng.standard_normal((N, K)).astype(np.float32), recipe="sol")
    return xq, wq


def case_block_scale_dropped():
    xq, wq = _nvfp4_pair(5)
    s = wq.scales.copy()
    s[:, 3] = 0x38  # block 3's scale read as 1.0
    return gemm.nvfp4_gemm(xq, _nvt(wq, scales=s)).out, gemm.nvfp4_gemm(xq, wq), {}


def case_scale_wrong_block():
    xq, wq = _nvfp4_pair(6)
    s = np.roll(wq.scales, 1, axis=1)  # block b uses block b-1's scale
    return gemm.nvfp4_gemm(xq, _nvt(wq, scales=s)).out, gemm.nvfp4_gemm(xq, wq), {}


def case_fp16_accumulation():
    A, B = fp16_inputs(7)
    return fp16_accumulating_gemm(A, B), gemm.gemm_fp16(A, B), {"model": "hopper_fp16_wgmma"}


def case_fp8_no_promotion():
    # sparse workload at K = 2048 on the exact-accumulation family for fp8 promoted every 128 (every 128-product
    # chunk is exact in the 14-bit accumulator, the total needs ~18 bits), positive operands; the kernel declares
    # promotion every 128 but never promotes.
    vals, meta, b = fst.exact_accumulation_sparse_arrays(np.random.default_rng(8), 4, 32, 2048, promote_every=128,
                                                         positive=True)
    A = decompress_2to4(vals, meta).astype(np.float64)
    out = _bf16(bounds.simulate(A, E4M3[b], "hopper_fp8_wgmma"))
    return out, gemm.sparse_gemm_fp4_fp8(vals, meta, b), {"model": "hopper_fp8_wgmma_promote(128)",
                                                          "exact_accumulation": True}


def test_fp8_promoted_control_is_exact_on_its_family():
    vals, meta, b = fst.exact_accumulation_sparse_arrays(np.random.default_rng(8), 4, 32, 2048, promote_every=128,
                                                         positive=True)
    A = decompress_2to4(vals, meta).astype(np.float64)
    ref = gemm.sparse_gemm_fp4_fp8(vals, meta, b)
    acc = bounds.simulate(A, E4M3[b], "hopper_fp8_wgmma_promote(128)")
    np.testing.assert_array_equal(acc, ref.exact)  # promoted: exact on this family
    bounds.check(_bf16(acc), ref, "hopper_fp8_wgmma_promote(128)", exact_accumulation=True).assert_ok()


def case_last_n_tile_skipped():
    # N = 2000 with BLOCK_N = 64: the last partial tile (16 columns, 0.8% of the output) is never written.
    A, B = fp16_inputs(9, M=8, N=2000, K=256)
    ref = gemm.gemm_fp16(A, B)
    out = np.full(ref.out.shape, np.nan, np.float16)  # poisoned buffer
    out[:, :1984] = ref.out[:, :1984]
    return out, ref, {"model": "hopper_fp16_wgmma", "poison": float("nan")}


def case_last_k_tile_skipped():
    # K = 2040 with BLOCK_K = 64: the last 56 columns of K are never accumulated.
    A, B = fp16_inputs(10, M=8, N=64, K=2040)
    ref = gemm.gemm_fp16(A, B)
    out = _f16(A[:, :1984].astype(np.float64) @ B[:, :1984].astype(np.float64).T)
    return out, ref, {"model": "hopper_fp16_wgmma"}


def case_row_mask_off_by_one():
    # rows masked with `m < M - 1`: the last of M = 128 rows (0.78% of the output) is never written.
    A, B = fp16_inputs(11, M=128, N=64, K=64)
    ref = gemm.gemm_fp16(A, B)
    out = np.full(ref.out.shape, np.nan, np.float16)
    out[:-1] = ref.out[:-1]
    return out, ref, {"model": "hopper_fp16_wgmma", "poison": float("nan")}


#: name -> (case, FlashInfer-Bench passes?, SOL-ExecBench passes?)   (fp4ref's check fails on every one)
def case_overflow_saturated():
    # a store that saturates: where the exact result overflows fp16 (row 0: 64 x 64 x 64 = 262144), the kernel
    # writes 65504 instead of inf; every other element is the correctly rounded one.
    A, B = fp16_inputs(12, M=4, N=16, K=64)
    A[0], B[0] = np.float16(64), np.float16(64)
    ref = gemm.gemm_fp16(A, B)
    assert np.isinf(ref.out[0, 0]) and np.isfinite(ref.out[1:]).all()
    out = np.where(np.isinf(ref.out), np.copysign(np.float16(65504), ref.out), ref.out).astype(np.float16)
    return out, ref, {"model": "hopper_fp16_wgmma"}


VERDICTS = {
    "nibble order swapped": (case_nibble_swap, False, False),
    "meta index fields swapped": (case_meta_swap, False, False),
    "signed shift of int8 bytes": (case_signed_shift, False, False),
    "ties rounded away": (case_ties_away, True, True),
    "block scale dropped": (case_block_scale_dropped, False, False),
    "block scale applied to the wrong block": (case_scale_wrong_block, False, False),
    "fp16 accumulation": (case_fp16_accumulation, False, False),
    "Hopper fp8 without promotion, K=2048": (case_fp8_no_promotion, False, True),
    "last partial N tile skipped": (case_last_n_tile_skipped, False, False),
    "last partial K tile skipped": (case_last_k_tile_skipped, False, False),
    "off-by-one row mask": (case_row_mask_off_by_one, False, False),
    # FlashInfer-Bench: inf - 65504 = inf, relative error inf / inf = NaN, and NaN > rtol is false: the element
    # matches; SOL-ExecBench fails any output whose reference holds inf
    "overflow saturated to the fp16 max": (case_overflow_saturated, True, False),
}


@pytest.mark.parametrize("name", list(VERDICTS))
def test_wrong_implementation_is_flagged(name):
    case, fib_expected, sol_expected = VERDICTS[name]
    out, ref, kw = case()
    rep = bounds.check(out, ref, **kw)
    assert not rep.ok, f"{name}: fp4ref's check did not flag it: {rep.summary()}"
    with pytest.raises(AssertionError):
        rep.assert_ok()
    assert bool(testing.fib_allclose(out, ref)) is fib_expected, (name, testing.fib_allclose(out, ref))
    assert bool(testing.sol_allclose(out, ref)) is sol_expected, (name, testing.sol_allclose(out, ref))
    if name == "Hopper fp8 without promotion, K=2048":  # docs/testing.md's table quotes the counts
        assert testing.fib_allclose(out, ref).n_fail == 127 and testing.sol_allclose(out, ref).matched_fraction == 1


def test_correct_implementations_pass_the_same_checks():
    """Controls: the correctly rounded outputs pass fp4ref's check, and the public checkers where the output is
    finite (so the flags above are the bugs'). Where it overflows, both public checkers fail the correct output
    that holds inf (any NaN/inf in the output fails both), and FlashInfer-Bench passes the saturating kernel."""
    for name, (case, _, _) in VERDICTS.items():
        _, ref, kw = case()
        rep = bounds.check(ref.out.copy(), ref, **kw)
        assert rep.ok, (name, rep.summary())
        finite = bool(np.isfinite(ref.out.astype(np.float64)).all())
        assert bool(testing.fib_allclose(ref.out, ref)) is finite, name
        assert bool(testing.sol_allclose(ref.out, ref)) is finite, name


# ---------------------------------------------------------------------------------------------------------------
# Hypothesis-driven variants: the bug is caught on every drawn input, not just on a lucky seed
# ---------------------------------------------------------------------------------------------------------------


@given(data=st.data())
def test_nibble_swap_caught_on_drawn_sparse_inputs(data):
    shape = data.draw(fst.gemm_shapes(max_m=8, max_n=8, min_k=16, max_k=64, k_multiple_of=4))
    vals, meta = data.draw(fst.sparse_a_operands(shape.M, shape.K, canonical=False, int8=True))
    b = data.draw(fst.e4m3_bytes((shape.N, shape.K)))
    ref = gemm.sparse_gemm_fp4_fp8(vals, meta, b)
    good = sparse_kernel(vals, meta, b)
    bounds.check(good, ref, "fp32_rn", exact_accumulation=True).assert_ok()
    bad = sparse_kernel(vals, meta, b, swap_nibbles=True)
    lo, hi = vals.view(np.uint8) & 0xF, vals.view(np.uint8) >> 4
    idx0, idx1 = meta.view(np.uint8) & 3, (meta.view(np.uint8) >> 2) & 3
    differs = np.any((E2M1[lo] != E2M1[hi]) & (idx0 != idx1))
    if differs and np.any(np.asarray(bad.astype(np.float64)) != ref.out.astype(np.float64)):
        assert not bounds.check(bad, ref, "fp32_rn", exact_accumulation=True).ok


@given(data=st.data())
def test_ties_away_caught_on_drawn_exact_accumulation_inputs(data):
    shape = data.draw(fst.gemm_shapes(max_m=4, max_n=16, min_k=64, max_k=512))
    A, B = data.draw(fst.exact_accumulation_fp16(shape.M, shape.N, shape.K))
    ref = gemm.gemm_fp16(A, B)
    bounds.check(ref.out.copy(), ref, "hopper_fp16_wgmma", exact_accumulation=True).assert_ok()
    bad = round_half_away(ref.exact, "float16")
    has_tie = np.any(bad.astype(np.float64) != ref.out.astype(np.float64))
    assert bounds.check(bad, ref, "hopper_fp16_wgmma", exact_accumulation=True).ok is not has_tie


# ---------------------------------------------------------------------------------------------------------------
# docs/testing.md's pattern, run against a torch CPU stand-in kernel (fp32 matmul, one RNE to fp16)
# ---------------------------------------------------------------------------------------------------------------


def _standin_gemm_fp16(A, B, out=None):
    torch = pytest.importorskip("torch")
    c = torch.matmul(A.float(), B.float().T).half()
    if out is None:
        return c
    out.copy_(c)
    return out


STANDIN_CONTRACT = bounds.NumericContract(inputs="float16", output="float16", model="fp32_rn")


@given(shape=fst.gemm_shapes(max_m=16, max_n=32, max_k=256, n_multiple_of=8, k_multiple_of=8), data=st.data())
def test_docs_pattern_bound(shape, data):
    torch = pytest.importorskip("torch")
    A = data.draw(fst.fp16_matrices((shape.M, shape.K)))
    B = data.draw(fst.fp16_matrices((shape.N, shape.K)))
    out = torch.full((shape.M, shape.N), float("nan"), dtype=torch.float16)
    _standin_gemm_fp16(torch.from_numpy(A), torch.from_numpy(B), out=out)
    testing.assert_gemm_close(out, gemm.gemm_fp16(A, B), STANDIN_CONTRACT.model_for(None, shape.K),
                              output_rounding=STANDIN_CONTRACT.rounding_for(False), poison=float("nan"))


@given(shape=fst.gemm_shapes(max_m=8, max_n=32, min_k=64, max_k=512, n_multiple_of=8, k_multiple_of=8),
       data=st.data())
def test_docs_pattern_exact(shape, data):
    torch = pytest.importorskip("torch")
    A, B = data.draw(fst.exact_accumulation_fp16(shape.M, shape.N, shape.K))
    out = _standin_gemm_fp16(torch.from_numpy(A), torch.from_numpy(B))
    testing.assert_gemm_close(out, gemm.gemm_fp16(A, B), "tc_fp32_universal", exact_accumulation=True)


def test_docs_testing_page_snippets_run_as_written():
    """The two property tests of docs/testing.md, executed verbatim against the project's gemm_fp16 (in the CPU
    interpreter here), a few Hypothesis examples each."""
    import re
    from pathlib import Path

    from hypothesis import settings

    text = (Path(__file__).resolve().parent.parent / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)[:2]
    assert "def test_my_gemm(" in blocks[0] and "def test_my_gemm_exact(" in blocks[1]
    ns: dict = {}
    previous = settings._current_profile  # the snippets' @settings(...) inherit the profile loaded when they run
    settings.register_profile("fp4ref-docs-snippets", parent=settings.get_profile(previous), max_examples=3)
    settings.load_profile("fp4ref-docs-snippets")
    try:
        exec(compile(blocks[0] + "\n" + blocks[1], "docs/testing.md", "exec"), ns)
        ns["test_my_gemm"]()
        ns["test_my_gemm_exact"]()
    finally:
        settings.load_profile(previous)


def test_docs_testing_page_nvfp4_linear_snippet_runs_as_written():
    """docs/testing.md's nvfp4_linear pattern, executed verbatim with a stand-in kernel (the reference's own
    output): x from fst.nvfp4_inputs, the weight arguments from nvfp4_quantize of a weight matrix. (The text
    paired nvfp4_linear with fst.nvfp4_inputs alone, which draws only x: "weight_fp4 must be uint8 packed E2M1
    codes, got bfloat16".)"""
    import re
    from pathlib import Path

    from hypothesis import settings

    pytest.importorskip("torch")
    text = (Path(__file__).resolve().parent.parent / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    block = next(b for b in blocks if "def test_my_nvfp4_linear(" in b)
    head = blocks[0].split("\n@settings", 1)[0]  # the first snippet's imports (torch, hypothesis, fp4ref)
    head = "\n".join(ln for ln in head.splitlines() if "fp4ref.kernels" not in ln)  # no Triton kernel needed
    block = "\n".join(ln for ln in block.splitlines() if "fp4ref.kernels" not in ln)  # the stand-in's instead
    calls = []

    def my_nvfp4_linear(x, weight_fp4, weight_scales, weight_global_decode_scale):
        calls.append(1)
        return gemm.nvfp4_linear(x, weight_fp4, weight_scales, weight_global_decode_scale).out

    contract = bounds.NumericContract(inputs="x bfloat16; W NVFP4", output="bfloat16", model="fp32_rn")
    ns: dict = {"my_nvfp4_linear": my_nvfp4_linear, "NVFP4_CONTRACT": contract}
    previous = settings._current_profile
    settings.register_profile("fp4ref-docs-nvfp4", parent=settings.get_profile(previous), max_examples=3)
    settings.load_profile("fp4ref-docs-nvfp4")
    try:
        exec(compile(head + "\n" + block, "docs/testing.md", "exec"), ns)
        ns["test_my_nvfp4_linear"]()
    finally:
        settings.load_profile(previous)
    assert calls


def test_docs_testing_page_nvfp4_linear_snippet_runs_with_the_projects_kernel():
    """docs/testing.md's nvfp4_linear pattern with fp4ref.kernels.nvfp4_linear swapped in, run as written (in the
    CPU interpreter here), a few Hypothesis examples. The text asserted RNE outputs, which the interpreter's
    truncating bf16 stores break (the contract's rounding_for(True) is "faithful"), and drew N not a multiple of
    16, which the kernel refuses."""
    import re
    from pathlib import Path

    from hypothesis import settings

    pytest.importorskip("torch")
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the kernel on CPU tensors: needs the Triton CPU interpreter")
    from fp4ref.kernels.nvfp4_linear import nvfp4_linear

    text = (Path(__file__).resolve().parent.parent / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    block = next(b for b in blocks if "def test_my_nvfp4_linear(" in b)
    head = blocks[0].split("\n@settings", 1)[0]  # the first snippet's imports (os, torch, hypothesis, fp4ref)
    ns: dict = {"my_nvfp4_linear": nvfp4_linear}  # (the snippet imports it itself; kept for a text that does not)
    code = head + "\n" + block
    previous = settings._current_profile
    settings.register_profile("fp4ref-docs-nvfp4-kernel", parent=settings.get_profile(previous), max_examples=4)
    settings.load_profile("fp4ref-docs-nvfp4-kernel")
    try:
        exec(compile(code, "docs/testing.md", "exec"), ns)
        ns["test_my_nvfp4_linear"]()
    finally:
        settings.load_profile(previous)
    assert ns["my_nvfp4_linear"] is nvfp4_linear


def test_assert_gemm_close_message_names_the_rule():
    A, B = fp16_inputs(12, M=4, N=8, K=64)
    ref = gemm.gemm_fp16(A, B)
    bad = ref.out.copy()
    bad[1, 2] = -bad[1, 2] if bad[1, 2] != 0 else np.float16(1)
    with pytest.raises(AssertionError) as ei:
        testing.assert_gemm_close(bad, ref, "hopper_fp16_wgmma")
    msg = str(ei.value)
    assert "hopper_fp16_wgmma" in msg and "(1, 2)" in msg and "Elements over the bound: 1 / 32" in msg


def test_assert_gemm_close_message_on_non_finite_outputs_names_an_element():
    """An all-NaN output (no finite element to rank) and a single NaN: the message gives the first NaN's index,
    never "at None", and never calls a correct element the worst."""
    A, B = fp16_inputs(12, M=4, N=8, K=64)
    ref = gemm.gemm_fp16(A, B)
    with pytest.raises(AssertionError) as ei:
        testing.assert_gemm_close(np.full(ref.out.shape, np.nan, ref.out.dtype), ref)
    msg = str(ei.value)
    assert "None" not in msg, msg
    assert ("Max err/bound: inf (a NaN/Inf mismatch or unwritten element, the first at (0, 0)); no element is "
            "finite in both out and the reference;") in msg, msg
    bad = ref.out.copy()
    bad[1, 2] = np.nan
    with pytest.raises(AssertionError) as ei:
        testing.assert_gemm_close(bad, ref)
    msg = str(ei.value)
    rep = bounds.check(bad, ref)
    assert rep.first_nonfinite == (1, 2) and rep.worst is not None
    assert (f"Max err/bound: inf (a NaN/Inf mismatch or unwritten element, the first at (1, 2)); the worst finite "
            f"element is at {rep.worst};") in msg, msg
    assert rep.worst_passes and "Bound terms at the worst finite element (it passes): " in msg  # not an offender
    assert bounds.check(ref.out.copy(), ref).first_nonfinite is None


def test_summary_leads_with_what_failed_and_how_many():
    out, ref, kw = case_ties_away()
    rep = bounds.check(out, ref, **kw)
    n = int(np.sum(out.astype(np.float64) != ref.out.astype(np.float64)))  # the ties, rounded the other way
    assert 0 < n < out.size
    s = rep.summary()
    assert s.startswith(f"FAILED: {n} / {out.size} (") and s.index("not equal to the correctly rounded") < s.index(
        "--"), s
    assert rep.failures()[0].startswith(f"{n} / {out.size}")
    ok = bounds.check(ref.out.copy(), ref, **kw)
    assert ok.summary().startswith("OK -- ") and ok.failures() == []
    # several kinds: the count of each, the exact-accumulation rule first
    bad = ref.out.copy()
    bad[0, :3] = np.nan
    rep2 = bounds.check(bad, ref, poison=float("nan"), model="fp32_rn", exact_accumulation=True)
    assert rep2.summary().startswith(f"FAILED: 3 / {out.size} (") and "3 / " in rep2.failures()[1]
    assert "unwritten" in rep2.failures()[1]


@pytest.mark.parametrize("checker", [testing.fib_allclose, testing.sol_allclose])
def test_public_checkers_refuse_tolerances_that_would_pass_everything(checker):
    """A NaN tolerance compares False with every error, so the checkers would pass -ref against ref: refused, as
    are negative and infinite tolerances and a ``required`` share outside [0, 1]; bools and strings are TypeErrors.
    Valid edge values keep their meaning: zero tolerances pass ref against itself and fail -ref."""
    ref = np.array([1.0, -2.0, 3.5, 0.25], np.float32)
    for name, bad, err in (("atol", float("nan"), ValueError), ("rtol", float("nan"), ValueError),
                           ("atol", -1e-3, ValueError), ("rtol", float("inf"), ValueError),
                           ("atol", True, TypeError), ("rtol", "0.01", TypeError)):
        with pytest.raises(err, match=rf"^{name}="):
            checker(-ref, ref, **{name: bad})
    if checker is testing.sol_allclose:
        for bad in (-1, 2, float("nan")):
            with pytest.raises(ValueError, match=r"^required=.*in \[0, 1\]"):
                checker(-ref, ref, required=bad)
        with pytest.raises(TypeError, match=r"^required=False"):
            checker(-ref, ref, required=False)
    assert checker(ref, ref, atol=0, rtol=np.float32(0)).ok
    assert not checker(-ref, ref, atol=0.0, rtol=0.0).ok
    with pytest.raises(TypeError, match=r"^out must be a floating array .*, got dtype <U1"):
        checker("a", ref)


def test_public_checkers_count_what_they_report():
    """fib_allclose and sol_allclose's counts on a hand-made output (ref 1..8, fp32): element 1 off by 0.03 (fails
    FlashInfer-Bench's rule: > atol 0.01 and > rtol 0.01 of 2; matches SOL's 0.005 + 0.02 * 2 = 0.045), element 3
    off by 0.1 (fails both), element 5 NaN, element 7 +inf (fail both, non-finite)."""
    ref = np.arange(1, 9, dtype=np.float32)
    out = ref.copy()
    out[1] += 0.03
    out[3] += 0.1
    out[5], out[7] = np.nan, np.inf
    fib = testing.fib_allclose(out, ref)
    assert (fib.ok, fib.checker, fib.n_fail, fib.n_nonfinite_out) == (False, "flashinfer-bench", 4, 2)
    assert fib.matched_fraction == 4 / 8 and fib.max_abs_err == pytest.approx(0.1, abs=1e-6)
    sol = testing.sol_allclose(out, ref)
    assert (sol.ok, sol.checker, sol.n_fail, sol.n_nonfinite_out) == (False, "sol-execbench", 3, 2)
    assert sol.matched_fraction == 5 / 8 and sol.max_abs_err == pytest.approx(0.1, abs=1e-6)
    # SOL-ExecBench fails any NaN/inf before it counts: 5 of 8 matched is not enough to pass at required=0.6 then
    assert not testing.sol_allclose(out, ref, required=0.6).ok and not testing.fib_allclose(out, ref, atol=1.0)
    finite = np.where(np.isfinite(out), out, ref)
    assert testing.sol_allclose(finite, ref, required=0.6).ok and testing.sol_allclose(finite, ref).n_fail == 1


def test_sol_execbench_sanity_rules():
    """SOL-ExecBench's check_tensor_sanity: NaN/inf in either tensor fails, even where the output equals the
    reference's inf; an all-zero output fails where the reference is not all zero, though every element is within
    atol here (|0 - 0.001| <= 0.005); the float32 squares decide "zero" (2^-80 squares to 0 in float32)."""
    ref = np.array([1.0, np.inf, 2.0], np.float32)
    assert not testing.sol_allclose(ref.copy(), ref).ok
    small = np.full(8, 0.001, np.float32)
    assert testing.sol_allclose(np.zeros(8, np.float32), small).matched_fraction == 1.0
    assert not testing.sol_allclose(np.zeros(8, np.float32), small).ok
    assert testing.sol_allclose(np.full(8, 0.0005, np.float32), small).ok
    assert testing.sol_allclose(np.zeros(8, np.float32), np.zeros(8, np.float32)).ok
    assert testing.sol_allclose(np.zeros(8, np.float32), np.full(8, 2.0**-80, np.float32)).ok  # its norm is 0
    # one element: torch's vector_norm is |x| (no square), so 1e-30 is a non-zero reference and 0 fails
    assert not testing.sol_allclose(np.zeros(1, np.float32), np.full(1, 1e-30, np.float32)).ok


def test_public_checkers_say_why_they_fail_and_take_ml_dtypes_floats():
    """``reason`` names the rule that failed; fp8 outputs (ml_dtypes) are floating arrays the benchmarks accept."""
    ref = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    assert (testing.fib_allclose(ref, ref).reason, testing.sol_allclose(ref, ref).reason) == ("", "")
    assert testing.fib_allclose(ref + 1, ref).reason == "tolerance" == testing.sol_allclose(ref + 1, ref).reason
    bad = ref.copy()
    bad[0] = np.inf
    assert testing.fib_allclose(bad, ref).reason == "non-finite" == testing.sol_allclose(ref, bad).reason
    assert testing.sol_allclose(np.zeros(4, np.float32), np.full(4, 1e-3, np.float32)).reason == "all-zero output"
    assert testing.fib_allclose(ref.astype(np.float16), ref).reason == "dtype"
    f8 = ref.astype(ml_dtypes.float8_e4m3fn)
    assert testing.fib_allclose(f8, f8.copy()).ok and testing.sol_allclose(f8, f8.copy()).ok
    with pytest.raises(TypeError, match=r"^ref must be a floating array"):
        testing.fib_allclose(ref, ref.astype(np.int32))


def test_public_checkers_fail_an_output_of_another_dtype():
    """Both benchmarks compare dtypes first (INCORRECT_DTYPE): the reference's values as float32 against a bf16
    reference fail, although every value is equal."""
    ref = np.array([1.0, 2.0, 3.0, 4.0], np.float32).astype(ml_dtypes.bfloat16)
    out = ref.astype(np.float32)
    for checker in (testing.fib_allclose, testing.sol_allclose):
        assert checker(ref.copy(), ref).ok and not checker(out, ref).ok, checker
        assert checker(out, ref).n_fail == 0  # (no element differs: the dtype alone fails it)


def test_fib_checks_non_finite_outputs_in_their_own_dtype():
    """FlashInfer-Bench looks for inf / NaN before its float32 cast: a float64 output of 1e39 (inf once cast) equal
    to its reference is finite there, and inf - inf = NaN then fails no comparison."""
    out = np.array([1e39, 1.0])
    assert testing.fib_allclose(out, out.copy()).ok and testing.fib_allclose(out, out.copy()).n_nonfinite_out == 0
    assert not testing.fib_allclose(np.array([np.inf, 1.0]), out).ok


def test_report_sqnr_is_10_log10_of_signal_over_noise():
    """Report.sqnr_db = 10 log10(sum C^2 / sum (out - C)^2), by Fractions on a 1 x 2 fp16 GEMM whose exact values
    are 3 and 5 (A = [[1, 1]], B = [[1, 2], [2, 3]]) and an output off by 1/2 and 1/4."""
    from fractions import Fraction
    import math

    A = np.array([[1, 1]], np.float16)
    B = np.array([[1, 2], [2, 3]], np.float16)
    ref = gemm.gemm_fp16(A, B)
    out = np.array([[3.5, 4.75]], np.float16)
    sig = Fraction(3) ** 2 + Fraction(5) ** 2
    noise = Fraction(1, 2) ** 2 + Fraction(1, 4) ** 2
    rep = bounds.check(out, ref, "fp32_rn")
    assert rep.sqnr_db == pytest.approx(10 * math.log10(sig / noise), rel=1e-12)
    assert bounds.check(ref.out.copy(), ref, "fp32_rn").sqnr_db == math.inf


def test_fib_relative_error_is_relative_to_the_reference():
    ref, out = np.array([1.0634765625]), np.array([1.07421875])
    assert not testing.fib_allclose(out, ref).ok  # d / |ref| = 0.010101 > rtol
    assert testing.fib_allclose(ref, out).ok  # d / |1.0742| = 0.0099999 <= rtol: the rule is not symmetric


def test_sol_passes_at_exactly_the_required_share():
    ref = np.ones(100)
    out = ref.copy()
    out[0] = 2.0
    r = testing.sol_allclose(out, ref)
    assert r.matched_fraction == 0.99 and r.ok  # "at least 99%"
    out[1] = 2.0
    assert not testing.sol_allclose(out, ref).ok


def test_assert_gemm_close_reports_an_element_left_at_the_poison_value():
    """A poison value one ulp from the right result is within the bound: only the poison rule sees the element the
    kernel never wrote."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((2, 2048)).astype(np.float16)
    B = rng.standard_normal((8, 2048)).astype(np.float16)
    ref = gemm.gemm_fp16(A, B)
    out = ref.out.copy()
    p = np.nextafter(ref.out[0, 0], np.float16(np.inf))
    out[0, 0] = p
    assert bounds.check(out, ref).ok
    with pytest.raises(AssertionError, match="nwritten"):
        testing.assert_gemm_close(out, ref, poison=float(p))


def test_assert_gemm_close_demands_the_correctly_rounded_output_on_exact_inputs():
    out, ref, _ = case_ties_away()
    testing.assert_gemm_close(out, ref, "fp32_rn")  # ties rounded away: within the bound
    with pytest.raises(AssertionError, match="correctly rounded"):
        testing.assert_gemm_close(out, ref, "fp32_rn", exact_accumulation=True)
