"""fp4ref.kernels.gemm_fp16 (fp16 C = A @ B.T, gemm_n3072_k2048) against fp4ref's exact reference.

CPU CI: the Triton interpreter (conftest sets TRITON_INTERPRET=1). Outputs are NaN-poisoned and checked with
fp4ref.bounds.check under each config's declared model (``accumulation_model(cfg, K, interpreter=True)``) with RNE
output rounding (interpreted fp16 stores round correctly, docs/kernels.md); hand-computed values (ties of the fp16
output rounding) are checked bit for bit without fp4ref. Every CONFIGS and TMA_CONFIGS entry is compiled for sm_90
on the CPU.
GPU (skipped without CUDA): workload sizes, RNE, determinism.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp4ref.bounds import check, get_model
from fp4ref.gemm import gemm_fp16 as reference
from fp4ref.kernels import _runtime
from fp4ref.kernels import gemm_fp16 as mod
from fp4ref.kernels.gemm_fp16 import splitk, tma
from fp4ref.kernels._sm90 import SM90_MAX_SHARED_BYTES, Sm90CompileError, compile_for_sm90
from fp4ref.strategies import exact_accumulation_fp16_arrays, fp16_matrices

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
NAN = float("nan")
S = mod.SplitKConfig
T = mod.TmaConfig

# Configs exercised in the interpreter besides the table: both kernels, split-K 1..8, K tails (EVEN_K False),
# persistent TMA programs looping over several work units (4 programs on the CPU).
TEST_CONFIGS = (
    S(16, 32, 64, SPLIT_K=4),
    S(64, 64, 64, SPLIT_K=2),
    S(64, 128, 64, SPLIT_K=1),
    T(64, 64, 64, SPLIT_K=1),
    T(64, 64, 64, SPLIT_K=8),
    T(128, 128, 64, SPLIT_K=2, PROGRAMS_PER_SM=2),
    T(64, 128, 32, SPLIT_K=1, EPILOGUE_SUBTILE=2),  # C stored as two column halves
    T(32, 32, 32, STREAM_K=1, PROGRAMS_PER_SM=2),  # stream-K: tiles split across programs
)


def _run(a: np.ndarray, b: np.ndarray, config=None) -> torch.Tensor:
    """Kernel on float16 numpy operands into a NaN-poisoned output; returns the output on the CPU."""
    A = torch.from_numpy(np.ascontiguousarray(a)).to(DEVICE)
    B = torch.from_numpy(np.ascontiguousarray(b)).to(DEVICE)
    out = torch.full((a.shape[0], b.shape[0]), NAN, dtype=torch.float16, device=DEVICE)
    c = mod.gemm_fp16(A, B, config, out=out)
    assert c is out
    return c.cpu()


def _model(cfg, K: int) -> str:
    return mod.accumulation_model(cfg, K, interpreter=not ON_GPU)


def _config_for(M, N, K, config):
    return mod.pick_config(M, N, K) if config is None else config


# ---------------------------------------------------------------------------------------------------------------
# Hand-computed values (independent of fp4ref): fp16 output ties resolved to even
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "terms, expected",
    [
        ([2048.0, 1.0], 2048.0),  # 2049 is halfway between fp16 2048 and 2050: RNE keeps 2048 (even mantissa)
        ([2048.0, 3.0], 2052.0),  # 2051: halfway between 2050 and 2052 -> 2052 (even)
        ([2048.0, 1.0, 2.0**-10], 2050.0),  # just above the tie -> up
        ([-2048.0, -1.0], -2048.0),  # negative tie -> even
        ([65504.0, 8.0], 65504.0),  # below the overflow threshold 65504 + ulp/2 = 65520: stays at the max
        ([65504.0, 16.0], float("inf")),  # exactly 65520: IEEE RNE overflows to inf
        ([1.0, -1.0], 0.0),  # exact zero sum -> +0.0
    ],
)
@pytest.mark.parametrize("config", [None, TEST_CONFIGS[0], TEST_CONFIGS[4]])
def test_output_rounding_ties_by_hand(terms, expected, config):
    """Sum of a few exactly representable products (exact in fp32): the only rounding is fp32 -> fp16."""
    K = 64
    a = np.zeros((3, K), np.float16)
    b = np.zeros((8, K), np.float16)
    for j, t in enumerate(terms):  # spread the terms over K so that split-K slices each get some
        a[1, j * 17] = np.float16(t)
        b[5, j * 17] = np.float16(1.0)
    c = _run(a, b, config).float().numpy()
    assert c[1, 5] == expected and np.signbit(c[1, 5]) == np.signbit(expected)
    mask = np.ones_like(c, bool)
    mask[1, 5] = False
    assert (c[mask] == 0).all() and not np.signbit(c[mask]).any()  # untouched products: +0.0, and all written


def test_every_element_written_and_row_col_mapping():
    """C[i, j] = a_i . b_j with distinct small integers: catches swapped/mirrored tiles and unwritten tails."""
    M, N, K = 70, 136, 72  # tails in M, N and K for every test config
    a = (np.arange(M)[:, None] % 5 + np.arange(K)[None, :] % 2).astype(np.float16)
    b = (np.arange(N)[:, None] % 3 - np.arange(K)[None, :] % 2).astype(np.float16)
    expected = a.astype(np.int64) @ b.astype(np.int64).T  # exact integers, |.| <= 720 < 2048: exact in fp16
    for cfg in (None,) + TEST_CONFIGS:
        c = _run(a, b, cfg)
        np.testing.assert_array_equal(c.numpy().astype(np.int64), expected, err_msg=f"config={cfg}")


# ---------------------------------------------------------------------------------------------------------------
# Hypothesis: shapes and adversarial values, checked by fp4ref's exact reference and bound
# ---------------------------------------------------------------------------------------------------------------
@st.composite
def _operands(draw, allow_nonfinite=False):
    M = draw(st.integers(1, 200))
    N = 8 * draw(st.integers(1, 16))
    K = 8 * draw(st.integers(1, 32))
    a = draw(fp16_matrices((M, K), allow_nonfinite=allow_nonfinite))
    b = draw(fp16_matrices((N, K), allow_nonfinite=allow_nonfinite))
    config = draw(st.sampled_from((None,) + TEST_CONFIGS))
    return a, b, config


def _assert_within_declared_bound(a, b, config):
    """The kernel's output (NaN-poisoned buffer) against fp4ref's exact reference, under the launch's own model."""
    cfg = _config_for(a.shape[0], b.shape[0], a.shape[1], config)
    c = _run(a, b, config)
    check(c, reference(a, b), _model(cfg, a.shape[1]), output_rounding="rne", poison=NAN).assert_ok()


@settings(max_examples=20)
@given(_operands())
def test_matches_exact_reference_adversarial(ops):
    _assert_within_declared_bound(*ops)


@settings(max_examples=8)
@given(_operands(allow_nonfinite=True))
def test_nonfinite_inputs_follow_ieee(ops):
    """inf * 0 = NaN, inf + -inf = NaN, otherwise inf (the reference's IEEE policy); the rest within the bound."""
    _assert_within_declared_bound(*ops)


@settings(max_examples=10)
@given(st.integers(1, 160), st.integers(1, 12), st.integers(1, 24), st.integers(0, 2**32 - 1),
       st.sampled_from((None,) + TEST_CONFIGS))  # fmt: skip
def test_exact_accumulation_family_is_correctly_rounded(m, n8, k8, seed, config):
    """Inputs whose every partial sum is exact: the output must EQUAL the correctly rounded (RNE) result."""
    a, b = exact_accumulation_fp16_arrays(np.random.default_rng(seed), m, 8 * n8, 8 * k8)
    cfg = _config_for(m, 8 * n8, 8 * k8, config)
    c = _run(a, b, config)
    check(c, reference(a, b), _model(cfg, 8 * k8), output_rounding="rne", poison=NAN,
          exact_accumulation=True).assert_ok()  # fmt: skip


def test_repeat_calls_same_shape_reuse_plan_and_stay_correct():
    """The launch-plan cache (keyed by shapes/strides) must not leak results between calls with new data."""
    rng = np.random.default_rng(3)
    for _ in range(3):
        a = rng.standard_normal((40, 64)).astype(np.float16)
        b = rng.standard_normal((24, 64)).astype(np.float16)
        cfg = _config_for(40, 24, 64, None)
        check(_run(a, b), reference(a, b), _model(cfg, 64), poison=NAN).assert_ok()


# ---------------------------------------------------------------------------------------------------------------
# API: shapes, dtypes, layouts
# ---------------------------------------------------------------------------------------------------------------
def _t(shape, dtype=torch.float16):
    return torch.ones(shape, dtype=dtype, device=DEVICE)


def test_m_zero_returns_empty():
    c = mod.gemm_fp16(_t((0, 64)), _t((16, 64)))
    assert c.shape == (0, 16) and c.dtype == torch.float16
    if not ON_GPU:  # nothing launches at M = 0, but a config the device cannot run is still refused
        for cfg in (mod.GluonConfig(), mod.PersistentConfig(128, 128, 64, 4, 8, 0)):
            with pytest.raises(ValueError, match="CUDA"):
                mod.gemm_fp16(_t((0, 64)), _t((16, 64)), cfg)


@pytest.mark.parametrize(
    "A, B, exc, words",
    [
        (lambda: _t((4, 64), torch.float32), lambda: _t((16, 64)), TypeError, "A.dtype"),
        (lambda: _t((4, 64)), lambda: _t((16, 64), torch.bfloat16), TypeError, "B.dtype"),
        (lambda: np.ones((4, 64), np.float16), lambda: _t((16, 64)), TypeError, "A"),
        (lambda: _t((4, 64)), lambda: _t((16, 32)), ValueError, "K=64"),
        (lambda: _t((4, 64))[:, :60], lambda: _t((16, 64))[:, :60], ValueError, "K=60"),
        (lambda: _t((4, 64)), lambda: _t((12, 64)), ValueError, "N=12"),
        (lambda: _t((64,)), lambda: _t((16, 64)), ValueError, "2-D"),
        (lambda: _t((64, 4)).T, lambda: _t((16, 64)), ValueError, "unit stride"),
        (lambda: _t((4, 72))[:, :64], lambda: _t((16, 64)), ValueError, None),  # row stride 72: allowed
        (lambda: _t((4, 68))[:, :64], lambda: _t((16, 64)), ValueError, r"stride\(0\)=68"),
        (lambda: _t((4, 12)), lambda: _t((16, 12)), ValueError, "K=12: expected a positive multiple of 8"),
        (lambda: _t((4, 72))[:, 4:68], lambda: _t((16, 64)), ValueError, "data_ptr"),
    ],
)
def test_bad_inputs_raise(A, B, exc, words):
    a, b = A(), B()
    if words is None:  # the valid case among them
        assert mod.gemm_fp16(a, b).shape == (4, 16)
        return
    with pytest.raises(exc, match=words):
        mod.gemm_fp16(a, b)


def test_bad_out_and_config_raise():
    A, B = _t((4, 64)), _t((16, 64))
    with pytest.raises(ValueError, match="out.shape"):
        mod.gemm_fp16(A, B, out=_t((4, 8)))
    with pytest.raises(TypeError, match="out"):
        mod.gemm_fp16(A, B, out=_t((4, 16), torch.float32))
    with pytest.raises(TypeError, match="config"):
        mod.gemm_fp16(A, B, config="fast")
    with pytest.raises(TypeError, match="config"):
        mod.gemm_fp16(A, B, config={"BLOCK_M": 3})  # unhashable: must not reach the plan key first
    with pytest.raises(ValueError, match="EPILOGUE_SUBTILE=3"):
        T(64, 64, 64, EPILOGUE_SUBTILE=3)
    with pytest.raises(ValueError, match="BLOCK_N=48"):
        S(64, 48, 64)


@pytest.mark.parametrize("cls", [S, T])
@pytest.mark.parametrize("kw, exc, words", [
    (dict(BLOCK_M=128.0), TypeError, "BLOCK_M"), (dict(BLOCK_M="128"), TypeError, "BLOCK_M"),
    (dict(BLOCK_M=None), TypeError, "BLOCK_M"), (dict(num_warps=True), TypeError, "num_warps"),
    (dict(num_stages=2.5), TypeError, "num_stages"), (dict(num_stages="4"), TypeError, "num_stages"),
    (dict(num_stages=0), ValueError, "num_stages=0"), (dict(BLOCK_M=512), ValueError, "BLOCK_M=512"),
    (dict(BLOCK_K=2 ** 40), ValueError, "BLOCK_K="), (dict(num_warps=32), ValueError, "num_warps=32"),
])
def test_tl_config_fields_are_checked(cls, kw, exc, words):
    """Every field of the tl paths' configs is typed and bounded (a float or bool reached Triton before)."""
    with pytest.raises(exc, match=words):
        cls(**(dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64) | kw))


@pytest.mark.parametrize("kw, exc, words", [
    (dict(PROGRAMS_PER_SM=2.0), TypeError, "PROGRAMS_PER_SM"), (dict(EPILOGUE_SUBTILE=2.0), TypeError, "EPILOGUE"),
    (dict(EPILOGUE_SUBTILE=True), TypeError, "EPILOGUE"), (dict(STREAM_K=1.0), TypeError, "STREAM_K"),
    (dict(STREAM_K=True), TypeError, "STREAM_K"), (dict(RANGE_REVERSE="no"), TypeError, "RANGE_REVERSE"),
    (dict(RANGE_REVERSE=0), TypeError, "RANGE_REVERSE"),
])
def test_tma_config_fields_are_checked(kw, exc, words):
    with pytest.raises(exc, match=words):
        T(64, 64, 64, **kw)


def test_pick_config_takes_a_bool_interpreter():
    for bad in ("yes", 1, 0.0):
        with pytest.raises(TypeError, match="interpreter"):
            mod.pick_config(5, 16, 64, interpreter=bad)


def _small_ints(shape, seed: int) -> torch.Tensor:
    """fp16 integers in -3..3: every product and every sum over K <= 64 is exact in fp32 and in fp16."""
    return torch.from_numpy(np.random.default_rng(seed).integers(-3, 4, shape).astype(np.float16)).to(DEVICE)


def _exact(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return (A.double().cpu() @ B.double().cpu().T).half()


def test_row_strides_reach_the_kernel_and_the_plan_key():
    """A row stride of 72 (a multiple of 8: allowed) is the stride the kernel reads A / B with, and a plan cached
    for a contiguous B does not serve a B of another row stride (the plan key holds the strides)."""
    A, B = _small_ints((4, 64), 1), _small_ints((16, 64), 2)
    wide_a = _small_ints((4, 72), 3)[:, :64]
    assert torch.equal(mod.gemm_fp16(wide_a, B).cpu(), _exact(wide_a, B))
    assert torch.equal(mod.gemm_fp16(A, B).cpu(), _exact(A, B))  # the plan of a contiguous B
    wide_b = _small_ints((16, 72), 4)[:, :64]
    assert torch.equal(mod.gemm_fp16(A, wide_b).cpu(), _exact(A, wide_b))


def test_a_cached_plan_serves_only_its_config():
    """The config is part of the plan key: after a default call of a shape, an explicit config is validated as on
    a first call (GemvConfig() serves M <= 2) and an explicit N = 0 is refused, not launched."""
    A, B = _small_ints((4, 64), 1), _small_ints((16, 64), 2)
    mod.gemm_fp16(A, B)
    with pytest.raises(ValueError, match=r"serves M <= 2 \(max_m\), got M=4"):
        mod.gemm_fp16(A, B, mod.GemvConfig())
    cfg = mod.pick_config(4, 16, 64, interpreter=not ON_GPU)
    with pytest.raises(ValueError, match="N=0: expected a positive multiple of 8"):
        mod.gemm_fp16(A, _small_ints((0, 64), 2), cfg)


def test_an_output_must_be_contiguous_and_aligned():
    """gemm_fp16 writes out as a contiguous [M, N] array from a 16-byte aligned base: a transposed or offset out
    is refused (and left as it was), not written with the wrong layout."""
    A, B = _small_ints((4, 64), 1), _small_ints((16, 64), 2)
    for bad, words in ((torch.full((16, 4), NAN, dtype=torch.float16, device=DEVICE).t(), "contiguous=False"),
                       (torch.full((65,), NAN, dtype=torch.float16, device=DEVICE)[1:].view(4, 16), "data_ptr")):
        for _ in range(2):  # a first call, then with the plan of the shape cached
            with pytest.raises(ValueError, match=words):
                mod.gemm_fp16(A, B, out=bad)
            assert torch.isnan(bad).all()
            mod.gemm_fp16(A, B)


def test_split_k_path_refuses_operands_beyond_32_bit_offsets(monkeypatch):
    """The SplitKConfig kernel indexes A, B and C with 32-bit offsets: operands that extend over 2^31 elements or
    more are refused with the operand named (the limit lowered here to 2048 elements: A [16, 128] reaches it)."""
    monkeypatch.setattr(mod._runtime, "INT32_OFFSETS", 2048)
    mod._runtime.clear_plans()
    out = torch.full((16, 8), float("nan"), dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match=r"A extends over 2048 elements.*32-bit offsets"):
        mod.gemm_fp16(_t((16, 128)), _t((8, 128)), S(16, 16, 64), out=out)
    assert torch.isnan(out).all()
    assert (mod.gemm_fp16(_t((15, 128)), _t((8, 128)), S(16, 16, 64)) == 128).all()  # below the limit: served


def test_inputs_not_modified():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((9, 64)).astype(np.float16)
    b = rng.standard_normal((16, 64)).astype(np.float16)
    A, B = torch.from_numpy(a.copy()).to(DEVICE), torch.from_numpy(b.copy()).to(DEVICE)
    mod.gemm_fp16(A, B)
    assert np.array_equal(A.cpu().numpy().view(np.int16), a.view(np.int16))
    assert np.array_equal(B.cpu().numpy().view(np.int16), b.view(np.int16))


# ---------------------------------------------------------------------------------------------------------------
# Contract and table
# ---------------------------------------------------------------------------------------------------------------
def test_config_table_is_sorted_and_covers_every_m():
    for table in (mod.CONFIGS, mod.INTERPRETER_CONFIGS):
        bounds = [b for b, _ in table.rows]
        assert bounds == sorted(bounds)
    for M in (1, 16, 17, 256, 257, 972, 8192, 10**6):
        for interp, table in ((False, mod.CONFIGS), (True, mod.INTERPRETER_CONFIGS)):
            cfg = mod.pick_config(M, 3072, 2048, interpreter=interp)
            assert cfg is next((c for b, c in table.rows if M <= b), table.larger)
            assert mod.NUMERIC_CONTRACT.config_for(M, 3072, 2048, interp) is cfg
    assert mod.pick_config(10**6, 3072, 2048, interpreter=False) is mod.CONFIGS.larger
    assert mod.pick_config(2379, 3072, 2048, interpreter=True) == mod.pick_config(2379, 3072, 2048, interpreter=False)
    assert mod.pick_config(972, 3072, 2048, interpreter=False) == mod.PersistentConfig(128, 192, 32, 7, 8, 0)
    # the paths by M that the module docstring names (the checks above compare the pick with the tables only)
    paths = {M: (type(mod.pick_config(M, 3072, 2048, interpreter=False)),
                 type(mod.pick_config(M, 3072, 2048, interpreter=True)))
             for M in (1, 2, 3, 17, 255, 256, 257, 972, 8192)}
    assert {M: p for M, p in paths.items() if M <= 256} == {
        1: (mod.GemvConfig, S), 2: (mod.GemvConfig, S), 3: (mod.GluonConfig, S), 17: (mod.GluonConfig, S),
        255: (mod.GluonConfig, S), 256: (mod.GluonConfig, S)}, paths
    assert all(interp is T for M, (gpu, interp) in paths.items() if M > 256)
    # M > 256 on a GPU: 128 x 192 Gluon tiles where they make one wave of 132 SMs, 192 x 128 tiles where they
    # make two (as 128 x 256 tiles do there, with more work each) and above 4096
    p192, p192rows = mod.PersistentConfig(128, 192, 32, 7, 8, 0), mod.PersistentConfig(192, 128, 64, 4, 8, 0)
    for M, want in ((257, p192), (1024, p192), (1025, T), (1408, T), (1409, p192rows), (2048, p192rows),
                    (2053, p192rows), (2112, p192rows), (2113, T), (2379, T), (4096, T), (4097, p192rows),
                    (8192, p192rows)):
        got = mod.pick_config(M, 3072, 2048, interpreter=False)
        assert got == want if want is not T else isinstance(got, T), (M, got)


def test_every_large_m_row_is_a_candidate_of_its_tune_bucket():
    """--tune keeps a bucket's row only when it times it again: a row that is not among the bucket's candidates
    would be replaced by the best of the others."""
    from fp4ref.kernels.gemm_fp16.bench import tune_buckets

    buckets = tune_buckets()
    large = [(b, c) for b, c in mod.CONFIGS.rows if b > 256] + [(None, mod.CONFIGS.larger)]
    assert [b for b, _ in large] == [b for b, _, _ in buckets if b is None or b > 256]
    for (bound, cfg), (_, ms, cands) in zip(large, [x for x in buckets if x[0] is None or x[0] > 256], strict=True):
        assert cfg in cands, (bound, cfg)
        assert all(M <= bound for M in ms) if bound is not None else True


def test_pick_config_checks_sizes():
    """Sizes that gemm_fp16 would never plan are refused, not mapped to the first row (M = -1 and 1.5 used to give
    a GemvConfig)."""
    ok = dict(M=16, N=3072, K=2048)
    for bad in (dict(M=-1), dict(M=0), dict(N=0), dict(K=-8)):
        with pytest.raises(ValueError, match="expected ints >= 1"):
            mod.pick_config(**{**ok, **bad})
    for bad in (dict(M=1.5), dict(M=True), dict(K=2048.0)):
        with pytest.raises(TypeError, match=next(iter(bad))):
            mod.pick_config(**{**ok, **bad})


@pytest.mark.parametrize("K", [8, 64, 264, 2048])
def test_declared_model_bounds_every_config(K):
    """The contract's single model (what ``fp4ref verify`` uses) is at least as loose as every config's own
    model, on the GPU and in the interpreter, so it is a sound bound for any M."""
    contract = mod.NUMERIC_CONTRACT
    declared = get_model(contract.model).eps(K)
    declared_interp = get_model(contract.model_interpreter).eps(K)
    for cfg in mod.CONFIGS.configs() + mod.INTERPRETER_CONFIGS.configs():
        for interp in (False, True):
            assert get_model(mod.accumulation_model(cfg, K, interpreter=interp)).eps(K) <= declared
            assert contract.model_for(cfg, K, interp).name == mod.accumulation_model(cfg, K, interpreter=interp)
        assert get_model(mod.accumulation_model(cfg, K, interpreter=True)).eps(K) <= declared_interp


def test_per_config_models_name_the_split():
    assert mod.accumulation_model(T(128, 256, 64), 2048) == "hopper_fp16_wgmma"
    assert mod.accumulation_model(S(64, 64, 128, SPLIT_K=2), 2048) == "splitk(hopper_fp16_wgmma, 1024)"
    assert mod.accumulation_model(S(16, 32, 128, SPLIT_K=4), 2048) == "splitk(tc_fp32_universal, 512)"
    assert mod.accumulation_model(S(16, 32, 128, SPLIT_K=4), 2048, interpreter=True) == (
        "splitk(fp32_rn, 512)"
    )
    assert mod.NUMERIC_CONTRACT.model_for(mod.pick_config(16, 3072, 2048, interpreter=True), 2048, M=16,
                                          N=3072).name == (
        "splitk(tc_fp32_universal, 512)"
    )


# ---------------------------------------------------------------------------------------------------------------
# sm_90 builds of every table config (CPU, triton's ptxas)
# ---------------------------------------------------------------------------------------------------------------
def _build(cfg, N=3072, K=2048, dtype="fp16", has_scale=False):
    BM, BN, BK = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
    ints16 = ["N", "K"]
    if isinstance(cfg, T):
        sig = {"a_desc": f"tensordesc<{dtype}[{BM}, {BK}]>", "b_desc": f"tensordesc<{dtype}[{BN}, {BK}]>",
               "c_desc": f"tensordesc<{dtype}[{BM}, {BN // cfg.EPILOGUE_SUBTILE}]>", "ws_ptr": "*fp32",
               "cnt_ptr": "*i32",
               "scale_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32"}  # fmt: skip
        ce = dict(BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, SPLIT_K=cfg.SPLIT_K, GROUP_M=cfg.GROUP_M, NUM_PROGRAMS=132,
                  HAS_SCALE=has_scale, EPILOGUE_SUBTILE=cfg.EPILOGUE_SUBTILE)  # fmt: skip
        kernel = tma.gemm_fp16_tma_kernel
        if cfg.STREAM_K:
            ce["STREAM_K"] = cfg.STREAM_K
            ce["RANGE_REVERSE"] = True
            kernel = tma.gemm_fp16_tma_streamk_kernel
        ptrs = ["ws_ptr", "cnt_ptr", "scale_ptr"]
    else:
        sig = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
               "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32", "stride_bn": "i32", "stride_cm": "i32"}
        ce = dict(BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, SPLIT_K=cfg.SPLIT_K, GROUP_M=cfg.GROUP_M,
                  EVEN_K=K % (BK * cfg.SPLIT_K) == 0)  # fmt: skip
        kernel = splitk.gemm_fp16_splitk_kernel
        ptrs = ["a_ptr", "b_ptr", "c_ptr", "ws_ptr", "cnt_ptr"]
        ints16 += ["stride_am", "stride_bn", "stride_cm"]
    return compile_for_sm90(kernel, sig, ce, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                            divisible_by_16=ptrs + ints16)  # fmt: skip


TL_TABLE_CONFIGS = sorted({c for c in mod.CONFIGS.configs() + mod.INTERPRETER_CONFIGS.configs() +
                            mod.TMA_CONFIGS.configs() if isinstance(c, (S, T))}, key=repr)


# Gluon configs: tests/test_kernel_gemm_fp16_gluon.py; GEMV configs: tests/test_kernel_gemm_fp16_gemv.py
@pytest.mark.parametrize("cfg", TL_TABLE_CONFIGS, ids=repr)
def test_table_configs_compile_for_sm90(cfg):
    ck = _build(cfg)
    assert ck.asm["cubin"]
    assert ck.metadata.shared <= SM90_MAX_SHARED_BYTES
    ptx = ck.asm["ptx"]
    if cfg.uses_wgmma:
        assert "wgmma.mma_async" in ptx
    else:
        assert "mma.sync" in ptx
    if isinstance(cfg, T):
        assert "cp.async.bulk.tensor" in ptx
    else:
        assert "cp.async.cg.shared.global" in ptx  # pipelined 16-byte loads, not scalar ones


def test_sm90_build_rejects_what_the_gpu_rejects():
    """A dot with K = 8 runs in the interpreter but cannot be built for sm_90: the helper must say so."""
    bad = S(16, 16, 8, SPLIT_K=1)
    with pytest.raises((Sm90CompileError, Exception), match="(?i)dot|k|shape|compil"):
        _build(bad, N=16, K=8)


def test_sm90_build_argument_errors():
    with pytest.raises(ValueError, match="unknown parameter"):
        compile_for_sm90(splitk.gemm_fp16_splitk_kernel, {"nope": "i32"}, {})
    with pytest.raises(TypeError, match="triton.jit"):
        compile_for_sm90(lambda x: x, {}, {})


# ---------------------------------------------------------------------------------------------------------------
# GPU only
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("M", [1, 7, 35, 136, 256, 972])
def test_workload_sizes_on_gpu(M):
    rng = np.random.default_rng(M)
    a = rng.standard_normal((M, 2048)).astype(np.float16)
    b = rng.standard_normal((3072, 2048)).astype(np.float16)
    c1, c2 = _run(a, b), _run(a, b)
    assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))  # bitwise deterministic
    cfg = mod.pick_config(M, 3072, 2048)
    check(c1, reference(a, b), mod.accumulation_model(cfg, 2048), output_rounding="rne", poison=NAN).assert_ok()


# ---------------------------------------------------------------------------------------------------------------
# gemm_tma: the persistent TMA kernel for other callers (fp16 / bf16, optional fp32 epilogue scale)
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture
def interp_bf16_dot(monkeypatch):
    """Work around a triton 3.6 interpreter defect: InterpreterBuilder.create_dot multiplies bf16 STORAGE BITS
    (bf16 is held as uint16 there) instead of values (2 x 3 gives 2.7e8). The kernel is not changed for it; on the
    CPU this fixture decodes bf16 dot operands (bits << 16 -> fp32, exact) before the interpreter's fp32 matmul,
    which is what the interpreter does for every other dtype. No-op on the GPU."""
    if ON_GPU:
        return
    import triton.language as tl
    from triton.runtime import interpreter as interp

    orig = interp.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def dec(h):
            if h.dtype.scalar != tl.bfloat16:
                return h
            return interp.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

        return orig(self, dec(a), dec(b), d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(interp.InterpreterBuilder, "create_dot", create_dot)


TMA_SCALE_CONFIGS = (
    T(64, 64, 64, SPLIT_K=1),
    T(64, 64, 32, SPLIT_K=2),  # split-K: the scale is applied once, after the fixed-order sum
    T(128, 64, 32, SPLIT_K=4, PROGRAMS_PER_SM=2),
    T(64, 64, 32, STREAM_K=1, PROGRAMS_PER_SM=2),  # stream-K: 2 pieces per tile, scale after their sum
)


def _bf16_bits_rne(x32: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 with RNE, by integer arithmetic on the bits (finite inputs; independent of torch/triton)."""
    u = x32.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("cfg", TMA_SCALE_CONFIGS, ids=repr)
@pytest.mark.parametrize("scale", [0.3713, 2.0**-3, None])
def test_gemm_tma_bf16_scale_one_rounding(cfg, scale, interp_bf16_dot):
    """bf16 operands whose every partial sum is exact (small integers): acc = S exactly, so the output must be
    bf16(fp32(S * scale)), with fp32(S * scale) the one fp32 RN multiply (numpy float32, IEEE) and bf16(.) the
    one rounding: RNE on the GPU; either RNE or truncation in the interpreter (its fp32 -> bf16 truncates,
    docs/kernels.md). A non-power-of-two scale makes the fp32 product inexact, so a missing or doubled rounding,
    a scale applied per split-K partial, or fp16 output rounding is visible."""
    rng = np.random.default_rng(5)
    M, N, K = 70, 72, 128  # M, N tails for every config; 2-4 K slices for the split configs
    a = rng.integers(-7, 8, (M, K)).astype(np.float32)
    b = rng.integers(-7, 8, (N, K)).astype(np.float32)
    a[0, :] = 0.0  # a row of exact zeros: +0 * scale -> +0
    S = a.astype(np.int64) @ b.astype(np.int64).T  # |S| <= 6272 < 2^24: exact in fp32
    A = torch.from_numpy(a).to(torch.bfloat16).to(DEVICE)  # small integers: exact in bf16
    B = torch.from_numpy(b).to(torch.bfloat16).to(DEVICE)
    C = torch.full((M, N), NAN, dtype=torch.bfloat16, device=DEVICE)
    sc = None if scale is None else torch.tensor([scale], dtype=torch.float32, device=DEVICE)
    assert mod.gemm_tma(A, B, C, scale=sc, config=cfg) is C
    got = C.cpu().view(torch.int16).numpy().view(np.uint16)
    prod = S.astype(np.float32) * np.float32(1.0 if scale is None else scale)  # one fp32 RN multiply
    rne = _bf16_bits_rne(prod)
    rz = (prod.view(np.uint32) >> 16).astype(np.uint16)
    assert (rne != rz).any() or scale is None or scale == 2.0**-3  # the data has ties/inexact cases to tell apart
    if ON_GPU:
        np.testing.assert_array_equal(got, rne)
    else:
        assert ((got == rne) | (got == rz)).all(), np.argwhere((got != rne) & (got != rz))[:5]


def test_gemm_tma_fp16_scale_and_no_scale_match_gemm_fp16():
    """fp16 through gemm_tma: without a scale bitwise equal to gemm_fp16 with the same config; with scale 2^-4
    (exact multiply) equal to that result's exact scaling where no fp16 subnormal is involved."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((40, 64)).astype(np.float16)
    b = rng.standard_normal((24, 64)).astype(np.float16)
    cfg = TMA_SCALE_CONFIGS[1]
    A, B = torch.from_numpy(a).to(DEVICE), torch.from_numpy(b).to(DEVICE)
    want = mod.gemm_fp16(A, B, cfg).cpu()
    C = torch.full((40, 24), NAN, dtype=torch.float16, device=DEVICE)
    got = mod.gemm_tma(A, B, C, config=cfg).cpu()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    C = torch.full((40, 24), NAN, dtype=torch.float16, device=DEVICE)
    A4 = torch.from_numpy(a * np.float16(4)).to(DEVICE)  # exact (powers of two, no overflow)
    got = mod.gemm_tma(A4, B, C, scale=torch.tensor([0.25], device=DEVICE), config=cfg).cpu()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_gemm_tma_bad_inputs_raise():
    A, B, C = _t((4, 64)), _t((16, 64)), _t((4, 16))
    with pytest.raises(TypeError, match="B.dtype"):
        mod.gemm_tma(A, _t((16, 64), torch.bfloat16), C)
    with pytest.raises(TypeError, match="A.dtype"):
        mod.gemm_tma(_t((4, 64), torch.float32), B, C)
    with pytest.raises(TypeError, match="scale"):
        mod.gemm_tma(A, B, C, scale=torch.ones(1, dtype=torch.float16, device=DEVICE))
    with pytest.raises(ValueError, match="scale"):
        mod.gemm_tma(A, B, C, scale=torch.ones(2, dtype=torch.float32, device=DEVICE))
    with pytest.raises(ValueError, match="C.shape"):
        mod.gemm_tma(A, B, _t((4, 8)))
    with pytest.raises(TypeError, match="TmaConfig"):
        mod.gemm_tma(A, B, C, config=S(16, 32, 64))
    with pytest.raises(TypeError, match="C"):
        mod.gemm_tma(A, B, "C")
    inside = torch.zeros(4, 16, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="C overlaps scale"):  # the epilogue would read a scale it overwrites
        mod.gemm_tma(A, B, inside, scale=inside.view(torch.float32)[0, :1].fill_(1.0))
    with pytest.raises(ValueError, match="N=0"):
        mod.gemm_tma(A, _t((0, 64)), _t((4, 0)))


def test_gemm_tma_a_cached_unscaled_plan_does_not_serve_a_scaled_call():
    """The plan key holds whether a scale is given: a scaled call (scale 0.25, at an offset of 4 bytes) after an
    unscaled one of the same shapes multiplies by it."""
    A, B = _small_ints((4, 64), 1), _small_ints((16, 64), 2)
    mod.gemm_tma(A, B, torch.full((4, 16), NAN, dtype=torch.float16, device=DEVICE))
    scale = torch.tensor([9.0, 0.25], dtype=torch.float32, device=DEVICE)[1:]
    got = mod.gemm_tma(A, B, torch.full((4, 16), NAN, dtype=torch.float16, device=DEVICE), scale=scale)
    assert torch.equal(got.cpu(), (_exact(A, B).double() * 0.25).half())  # exact: small integers x 2^-2


# The bf16 + scale builds the NVFP4 helper needs (its tile configs may differ; TMA_CONFIGS are the defaults).
BF16_SCALE_BUILDS = sorted(set(mod.TMA_CONFIGS.configs()) | {T(128, 256, 64, num_warps=8, num_stages=3),
                                                            T(128, 128, 64, SPLIT_K=2, num_warps=8)},
                           key=repr)  # fmt: skip


@pytest.mark.parametrize("cfg", BF16_SCALE_BUILDS, ids=repr)
def test_tma_bf16_scale_compiles_for_sm90(cfg):
    ck = _build(cfg, N=8192, K=8192, dtype="bf16", has_scale=True)
    assert ck.asm["cubin"] and ck.metadata.shared <= SM90_MAX_SHARED_BYTES
    ptx = ck.asm["ptx"]
    assert "wgmma.mma_async" in ptx and ".bf16" in ptx and "cp.async.bulk.tensor" in ptx
    assert "cvt.rn.bf16" in ptx  # the one output rounding is RNE (incl. the packed cvt.rn.bf16x2.f32)


# ---------------------------------------------------------------------------------------------------------------
# Stream-K (TmaConfig.STREAM_K): deterministic split of (tile, K-iteration) ranges over a fixed grid
# ---------------------------------------------------------------------------------------------------------------
# (config, M, N, K): 4/8/16 programs on the CPU (PROGRAMS_PER_SM x 4 "SMs"); tiles split 1..4 ways, a K tail,
# all-stream-K and hybrid (data-parallel full waves + stream-K for the last partial wave).
STREAM_K_CASES = (
    (T(32, 32, 32, STREAM_K=1), 70, 64, 320),  # 6 tiles x 10 iterations over 4 programs: 15 each
    (T(32, 32, 32, STREAM_K=1, PROGRAMS_PER_SM=2), 70, 64, 296),  # 8 programs, K tail (296 = 9 x 32 + 8)
    (T(32, 32, 32, STREAM_K=1, PROGRAMS_PER_SM=4), 40, 64, 320),  # 16 programs over 4 tiles: 3-4 pieces
    (T(32, 32, 32, STREAM_K=2), 70, 64, 320),  # hybrid: 4 whole tiles + 2 stream-K tiles
    (T(32, 64, 32, STREAM_K=2, PROGRAMS_PER_SM=2, GROUP_M=2), 100, 192, 192),  # hybrid, 12 tiles, 8 progs
    (T(32, 32, 32, STREAM_K=2), 64, 256, 64),  # 16 tiles = 4 full waves: no stream-K phase, no workspace
    (T(32, 32, 32, STREAM_K=3, GROUP_M=2), 100, 96, 296),  # data-parallel only (flattened loop), K tail
)


def _sms() -> int:
    """The SM count the host launch sizes grids for (INTERPRETER_SMS on the CPU)."""
    return _runtime.num_sms(torch.device(DEVICE, 0) if ON_GPU else torch.device("cpu"))


def _scratch():
    """The split-K / stream-K workspaces (fp32 partials, int32 counters) of the current stream."""
    device = torch.device(DEVICE, 0) if ON_GPU else torch.device("cpu")
    stream = _runtime.current_stream(device)
    return (_runtime.workspace(device, stream, mod.PARTIALS, 1, torch.float32),
            _runtime.workspace(device, stream, mod.COUNTERS, 1, torch.int32, zeroed=True))


def _schedule(cfg, M, N, K):
    return mod.stream_k_schedule(cfg, M, N, K, mod.launch_programs(cfg, M, N, K, _sms()))


def test_stream_k_cases_split_tiles_one_to_four_ways():
    """The cases below really exercise what they claim: whole tiles, and tiles cut into 2, 3 and 4 pieces."""
    if ON_GPU:
        pytest.skip("piece counts are those of the 4-program CPU grid")
    seen = set()
    for cfg, M, N, K in STREAM_K_CASES:
        sch = _schedule(cfg, M, N, K)
        seen |= {len(p) for p in sch["pieces"].values()}
        if sch["dp_tiles"]:
            seen.add(1)
    assert {1, 2, 3, 4} <= seen, seen
    sch = _schedule(*STREAM_K_CASES[3])
    assert sch["dp_tiles"] == 4 and sch["sk_tiles"] == 2


@pytest.mark.parametrize("reverse", (True, False), ids=("head_last", "tail_last"))
@pytest.mark.parametrize("case", STREAM_K_CASES, ids=lambda c: repr(c))
def test_stream_k_bound_determinism_and_unsplit_tiles_equal_plain_kernel(case, reverse):
    """NaN-poisoned output within the bound of the launch's own model (accumulation_model with M, N, grid),
    identical over two runs (the workspace and counters are reused), and bit-for-bit equal to the plain TMA
    kernel (SPLIT_K = 1: one chain over all of K) on every tile that no program split. Both fix-up paths: the
    interpreter runs programs in order, so with RANGE_REVERSE a split tile's head arrives last (it sums from
    registers without writing its slot), without it a tail arrives last (sums the written slots)."""
    cfg, M, N, K = case
    cfg = dataclasses.replace(cfg, RANGE_REVERSE=reverse)
    _runtime.clear_plans()
    rng = np.random.default_rng(M * 7 + K)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((N, K)).astype(np.float16)
    nprog = mod.launch_programs(cfg, M, N, K, _sms())
    model = mod.accumulation_model(cfg, K, interpreter=not ON_GPU, M=M, N=N, num_programs=nprog)
    assert mod.accumulation_model(cfg, K, interpreter=not ON_GPU, M=M, N=N) == model  # the host's own grid
    assert mod.NUMERIC_CONTRACT.model_for(cfg, K, not ON_GPU, M=M, N=N).name == model  # what fp4ref verify asks
    c1 = _run(a, b, cfg)
    check(c1, reference(a, b), model, output_rounding="rne", poison=NAN).assert_ok()
    sch = mod.stream_k_schedule(cfg, M, N, K, mod.launch_programs(cfg, M, N, K, _sms()))
    _scratch()[0].fill_(float("nan"))
    c2 = _run(a, b, cfg)
    assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))
    if not ON_GPU and sch["split_tiles"]:  # which path ran: the head path never writes slot 0
        ws, cnt = _scratch()
        tile_elems = cfg.BLOCK_M * cfg.BLOCK_N
        slot0 = [ws[t * tile_elems:(t + 1) * tile_elems] for t, ps in sch["pieces"].items() if len(ps) > 1]
        assert all(bool(x.isnan().all()) == reverse for x in slot0)
        assert not cnt.any()  # every counter back to 0
    other = dataclasses.replace(cfg, RANGE_REVERSE=not reverse)  # the other fix-up path: same bits
    _runtime.clear_plans()
    c3 = _run(a, b, other)
    _runtime.clear_plans()
    assert torch.equal(c1.view(torch.int16), c3.view(torch.int16))
    plain = T(cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, GROUP_M=cfg.GROUP_M)
    c0 = _run(a, b, plain)
    sch = mod.stream_k_schedule(cfg, M, N, K, nprog)
    tiles_n = -(-N // cfg.BLOCK_N)
    tiles_m = -(-M // cfg.BLOCK_M)
    group = cfg.GROUP_M * tiles_n
    n_split = 0
    for t in range(tiles_m * tiles_n):  # same grouped tile order as the kernel
        first_m = (t // group) * cfg.GROUP_M
        rows = min(tiles_m - first_m, cfg.GROUP_M)
        pm, pn = first_m + (t % group) % rows, (t % group) // rows
        sl = (slice(pm * cfg.BLOCK_M, (pm + 1) * cfg.BLOCK_M), slice(pn * cfg.BLOCK_N, (pn + 1) * cfg.BLOCK_N))
        if len(sch["pieces"].get(t, [None])) == 1:
            assert torch.equal(c1[sl].view(torch.int16), c0[sl].view(torch.int16)), t
        else:
            n_split += 1
    assert n_split == sch["split_tiles"]
    assert (n_split == 0) == (sch["sk_tiles"] == 0)  # only the 4-full-waves case has no split tile


def test_stream_k_model_and_schedule_contract():
    """The declared model bounds every tile: at the workload's M the tight answer; without M/N the universal
    one; splitting never leaves a K-iteration uncovered or covered twice, and ranges differ by <= 1."""
    cfg = T(128, 256, 64, num_warps=8, num_stages=3, STREAM_K=1)
    assert mod.accumulation_model(cfg, 2048, M=972, N=3072, num_programs=132) == "splitk(hopper_fp16_wgmma, 1600)"
    assert mod.accumulation_model(cfg, 2048) == "tc_fp32_universal"
    assert mod.accumulation_model(cfg, 2048, interpreter=True) == "fp32_rn"
    dp = T(128, 256, 64, num_warps=8, num_stages=3, STREAM_K=3)  # data-parallel only: one chain per tile
    assert mod.accumulation_model(dp, 2048) == mod.accumulation_model(dp, 2048, M=972, N=3072, num_programs=132)
    assert mod.accumulation_model(dp, 2048) == "hopper_fp16_wgmma"
    assert mod.stream_k_schedule(dp, 972, 3072, 2048, 132)["sk_tiles"] == 0
    assert mod.launch_programs(dp, 972, 3072, 2048, 132) == 96 and mod.launch_programs(dp, 8192, 3072, 2048, 132) == 132
    declared = get_model(mod.NUMERIC_CONTRACT.model).eps(2048)
    for M in (1, 100, 972, 2053, 2379, 8192):
        for sk in (1, 2):
            c = T(128, 256, 64, num_warps=8, STREAM_K=sk)
            sch = mod.stream_k_schedule(c, M, 3072, 2048, 132)
            covered = sorted((t, k) for t, ps in sch["pieces"].items() for _, k0, k1 in ps for k in range(k0, k1))
            assert covered == [(t, k) for t in range(sch["sk_tiles"]) for k in range(32)]
            per_prog = {}
            for ps in sch["pieces"].values():
                for p, k0, k1 in ps:
                    per_prog[p] = per_prog.get(p, 0) + k1 - k0
            assert max(per_prog.values()) - min(per_prog.values()) <= 1
            name = mod.accumulation_model(c, 2048, M=M, N=3072, num_programs=132)
            assert get_model(name).eps(2048) <= declared
    with pytest.raises(ValueError, match="STREAM_K"):
        T(128, 256, 64, SPLIT_K=2, STREAM_K=1)
    with pytest.raises(TypeError, match="STREAM_K"):  # no such field: stream-K is a TmaConfig mode
        S(64, 64, 64, STREAM_K=1)


STREAM_K_BUILDS = (  # every stream-K candidate of bench_gemm_fp16's sweep
    T(128, 256, 64, num_warps=8, num_stages=3, STREAM_K=1),
    T(128, 256, 64, num_warps=8, num_stages=3, STREAM_K=2),
    T(128, 256, 64, num_warps=8, num_stages=3, GROUP_M=4, STREAM_K=2),
    T(128, 256, 64, num_warps=8, num_stages=4, GROUP_M=4, STREAM_K=2, EPILOGUE_SUBTILE=2),
    T(128, 128, 64, num_warps=8, num_stages=4, STREAM_K=1),
    T(128, 128, 64, num_warps=8, num_stages=4, STREAM_K=2),
    T(128, 128, 64, num_warps=8, num_stages=5, STREAM_K=2),
    T(128, 128, 64, num_warps=8, num_stages=6, STREAM_K=2, EPILOGUE_SUBTILE=2),
    T(128, 256, 64, num_warps=8, num_stages=3, GROUP_M=4, STREAM_K=3),
    T(128, 256, 64, num_warps=8, num_stages=4, GROUP_M=4, STREAM_K=3, EPILOGUE_SUBTILE=2),
)


def _wgmma_loops(ptx: str) -> list:
    """PTX basic blocks that hold wgmma and branch back (the K loops), as counts of what pipelining shows:
    TMA loads issued, wgmma instructions, wgmma waits (pending counts), local-memory (spill) accesses."""
    out = []
    for block in re.split(r"\n(?=\$L__BB\d+_\d+:)", ptx):
        label = re.match(r"(\$L__BB\d+_\d+):", block)
        if label and "wgmma.mma_async" in block and re.search(r"bra(\.uni)?\s+" + re.escape(label.group(1)) + ";",
                                                                block):  # fmt: skip
            out.append(dict(tma=block.count("cp.async.bulk.tensor"), wgmma=block.count("wgmma.mma_async"),
                            waits=re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", block),
                            local=block.count("ld.local") + block.count("st.local")))  # fmt: skip
    return out


@pytest.mark.parametrize("bm, bn, stages", ((128, 256, 3), (128, 128, 4)))
def test_stream_k_k_loop_is_the_plain_kernels(bm, bn, stages):
    """sm_90 build: the stream-K phase's K loop (runtime bounds kt0..kt1 per piece) is software-pipelined like
    the plain kernel's: one TMA load per operand per iteration (issued stages - 1 ahead), async wgmma, one
    wait(1), no spills inside."""
    plain = _wgmma_loops(_build(T(bm, bn, 64, num_warps=8, num_stages=stages)).asm["ptx"])
    assert len(plain) == 1 and plain[0] == dict(tma=2, wgmma=plain[0]["wgmma"], waits=["1"], local=0), plain
    for sk in (1, 2):  # (3 has no stream-K phase)
        ptx = _build(T(bm, bn, 64, num_warps=8, num_stages=stages, STREAM_K=sk)).asm["ptx"]
        assert _wgmma_loops(ptx) == plain, (sk, _wgmma_loops(ptx), plain)  # the stream-K phase's K loop
        # hybrid: the data-parallel phase's loop (static K bounds) is flattened over (tile, K) by Triton, its
        # wgmma still async with wait(1) (TMA loads run ahead across tile boundaries)
        assert len(re.findall(r"wgmma\.wait_group\.sync\.aligned 1;", ptx)) == sk


@pytest.mark.parametrize("cfg", STREAM_K_BUILDS, ids=repr)
def test_stream_k_configs_compile_for_sm90(cfg):
    ck = _build(cfg)
    assert ck.asm["cubin"] and ck.metadata.shared <= SM90_MAX_SHARED_BYTES
    ptx = ck.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    if cfg.STREAM_K != 3:  # (3: no stream-K phase, no counters)
        assert "atom.global.gpu.acq_rel.add" in ptx  # a tail's arrival (release of its partial, acquire of others)
        assert "ld.global.gpu.acquire" in ptx  # the head's check (atomic add of 0 -> an acquire load)
    assert "cvt.rn.f16" in ptx  # one RNE output rounding
