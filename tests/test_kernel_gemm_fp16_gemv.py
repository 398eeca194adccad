"""gemm_fp16's GEMV path (GemvConfig, kernels/gemm_fp16/gemv.py): CUDA cores, a row or two of A.

CPU CI: the kernel is a `tl` kernel, so the Triton interpreter runs it: hand-computed fp16 output ties, an
integer-valued product table checked element for element, Hypothesis shapes (N and K tails, every BLOCK_M up to
the config's max_m, non-finite inputs) against fp4ref's exact reference under ``fp32_rn`` with NaN-poisoned
outputs, exact-accumulation inputs equal to the correctly rounded output; the table's configs and the variants
below built for sm_90 (16-byte loads of B, no spills, no tensor-core instructions); config checks and refusals.
GPU (``-m gpu``): the workload's M = 1-2 through the table, bitwise run to run, within ``fp32_rn``; exact
accumulation; ragged shapes.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp4ref.bounds import check
from fp4ref.gemm import gemm_fp16 as reference
from fp4ref.kernels import gemm_fp16 as mod
from fp4ref.kernels._sm90 import SM90_MAX_SHARED_BYTES, compile_for_sm90, ptxas_advisories, sass_info
from fp4ref.kernels.gemm_fp16.gemv import gemm_fp16_gemv_kernel, gemv_constexprs
from fp4ref.strategies import exact_accumulation_fp16_arrays, fp16_matrices

G = mod.GemvConfig
ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
NAN = float("nan")
N_WL, K_WL = 3072, 2048  # the workload's B
TABLE = [c for c in mod.CONFIGS.configs() if isinstance(c, G)]
# variants: several rows per program and several warps, short K blocks (several iterations, K tails), M up to 8
VARIANTS = [G(BLOCK_N=4, BLOCK_K=128, num_warps=2), G(BLOCK_N=2, BLOCK_K=16, num_warps=1),
            G(BLOCK_N=8, BLOCK_K=256, num_warps=4)]


def _run(a: np.ndarray, b: np.ndarray, cfg) -> torch.Tensor:
    """The kernel on float16 numpy operands into a NaN-poisoned output; the output on the CPU."""
    A = torch.from_numpy(np.ascontiguousarray(a)).to(DEVICE)
    B = torch.from_numpy(np.ascontiguousarray(b)).to(DEVICE)
    out = torch.full((a.shape[0], b.shape[0]), NAN, dtype=torch.float16, device=DEVICE)
    assert mod.gemm_fp16(A, B, cfg, out=out) is out
    return out.cpu()


# ---------------------------------------------------------------------------------------------------------------
# Hand-computed values
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "terms, expected",
    [
        ([2048.0, 1.0], 2048.0),  # 2049: halfway between fp16 2048 and 2050 -> 2048 (even mantissa)
        ([2048.0, 3.0], 2052.0),  # 2051: halfway between 2050 and 2052 -> 2052 (even)
        ([2048.0, 1.0, 2.0**-10], 2050.0),  # just above the tie -> up
        ([-2048.0, -1.0], -2048.0),  # negative tie -> even
        ([65504.0, 16.0], float("inf")),  # exactly 65520, the overflow threshold: RNE gives inf
        ([1.0, -1.0], 0.0),  # exact zero sum -> +0.0
    ],
)
@pytest.mark.parametrize("cfg", TABLE + VARIANTS[:2], ids=repr)
def test_output_rounding_ties_by_hand(terms, expected, cfg):
    """A few exactly representable products whose fp32 sum is exact: the only rounding is fp32 -> fp16 (RNE)."""
    K = 80  # not a multiple of the variants' BLOCK_K: the K tail masks run too
    a = np.zeros((cfg.max_m if cfg.max_m <= 2 else 2, K), np.float16)
    b = np.zeros((24, K), np.float16)
    for j, t in enumerate(terms):  # spread over K so that several iterations and lanes hold a term
        a[-1, 37 * j % K] = np.float16(t)
        b[5, 37 * j % K] = np.float16(1.0)
    c = _run(a, b, cfg).float().numpy()
    assert c[-1, 5] == expected and np.signbit(c[-1, 5]) == np.signbit(expected)
    mask = np.ones_like(c, bool)
    mask[-1, 5] = False
    assert (c[mask] == 0).all() and not np.signbit(c[mask]).any()  # +0.0 elsewhere, and all written


@pytest.mark.parametrize("cfg", TABLE + VARIANTS, ids=repr)
def test_every_element_written_and_row_col_mapping(cfg):
    """C[i, j] = a_i . b_j of small integers, exact in fp16: a swapped, shifted or unwritten element shows."""
    M, N, K = min(cfg.max_m, 3), 40, 88  # N and K tails for every config
    a = (np.arange(M)[:, None] % 5 + np.arange(K)[None, :] % 2).astype(np.float16)
    b = (np.arange(N)[:, None] % 3 - np.arange(K)[None, :] % 2).astype(np.float16)
    expected = a.astype(np.int64) @ b.astype(np.int64).T
    np.testing.assert_array_equal(_run(a, b, cfg).numpy().astype(np.int64), expected)


# ---------------------------------------------------------------------------------------------------------------
# Hypothesis: shapes and adversarial values against fp4ref's exact reference
# ---------------------------------------------------------------------------------------------------------------
@st.composite
def _operands(draw, allow_nonfinite=False):
    cfg = draw(st.sampled_from(TABLE + VARIANTS))
    M = draw(st.integers(1, cfg.max_m))
    N = 8 * draw(st.integers(1, 12))
    K = 8 * draw(st.integers(1, 48))
    a = draw(fp16_matrices((M, K), allow_nonfinite=allow_nonfinite))
    b = draw(fp16_matrices((N, K), allow_nonfinite=allow_nonfinite))
    return a, b, cfg


@settings(max_examples=15, deadline=None)
@given(_operands())
def test_matches_exact_reference_within_fp32_rn(ops):
    a, b, cfg = ops
    assert mod.accumulation_model(cfg, a.shape[1]) == "fp32_rn"
    check(_run(a, b, cfg), reference(a, b), "fp32_rn", output_rounding="rne", poison=NAN).assert_ok()


@settings(max_examples=6, deadline=None)
@given(_operands(allow_nonfinite=True))
def test_nonfinite_inputs_follow_ieee(ops):
    """inf * 0 = NaN, inf + -inf = NaN, otherwise inf (the reference's IEEE policy); the rest within the bound."""
    a, b, cfg = ops
    check(_run(a, b, cfg), reference(a, b), "fp32_rn", output_rounding="rne", poison=NAN).assert_ok()


@settings(max_examples=8, deadline=None)
@given(st.sampled_from(TABLE + VARIANTS), st.integers(1, 8), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_exact_accumulation_is_correctly_rounded(cfg, n8, k8, seed):
    """Inputs whose every partial sum is exact in fp32: the output must EQUAL the correctly rounded result."""
    m = min(cfg.max_m, 1 + seed % 4)
    a, b = exact_accumulation_fp16_arrays(np.random.default_rng(seed), m, 8 * n8, 8 * k8)
    check(_run(a, b, cfg), reference(a, b), "fp32_rn", output_rounding="rne", poison=NAN,
          exact_accumulation=True).assert_ok()


# ---------------------------------------------------------------------------------------------------------------
# Configs, table and refusals
# ---------------------------------------------------------------------------------------------------------------
def test_table_serves_m_1_2_with_gemv_on_the_gpu_only():
    for M in (1, 2):
        cfg = mod.pick_config(M, N_WL, K_WL, interpreter=False)
        assert isinstance(cfg, G) and M <= cfg.max_m
        assert not isinstance(mod.pick_config(M, N_WL, K_WL, interpreter=True), G)
    assert isinstance(mod.pick_config(3, N_WL, K_WL, interpreter=False), mod.GluonConfig)


def test_config_checks_and_max_m():
    assert G().max_m == 2 and G(BLOCK_N=2, BLOCK_K=1024).max_m == 2 and G(4, 128, 2).max_m == 16
    assert G(8, 256, 4).max_m == 8
    for kw in ({"BLOCK_N": 3}, {"BLOCK_N": 128}, {"BLOCK_K": 8}, {"BLOCK_K": 16384}, {"num_warps": 16},
               {"num_warps": 0}, {"BLOCK_N": 8, "BLOCK_K": 8192}):  # the last: 2048 products per thread
        with pytest.raises(ValueError):
            G(**kw)
    with pytest.raises(ValueError, match="= 2048 products per thread for one row of A"):
        G(BLOCK_N=8, BLOCK_K=8192)
    for kw in ({"BLOCK_N": 2.0}, {"num_warps": True}):
        with pytest.raises(TypeError):
            G(**kw)


def test_bench_name_and_sweep_candidates():
    from fp4ref.kernels.gemm_fp16.bench import cfg_name, sweep_candidates

    assert cfg_name(G()) == "gemv:n1xk2048/w1" and cfg_name(G(2, 1024, 4)) == "gemv:n2xk1024/w4"
    for m in (1, 2, 3, 4, 5):
        gemv = [c for c in sweep_candidates(m) if isinstance(c, G)]
        assert all(m <= c.max_m for c in gemv) and (m > 4) == (not gemv)


def test_m_above_max_m_is_refused():
    a = torch.zeros((3, 64), dtype=torch.float16, device=DEVICE)
    b = torch.ones((16, 64), dtype=torch.float16, device=DEVICE)
    out = torch.full((3, 16), NAN, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match=r"max_m.*M=3"):
        mod.gemm_fp16(a, b, G(), out=out)
    assert torch.isnan(out).all()  # nothing written


# ---------------------------------------------------------------------------------------------------------------
# sm_90 builds (CPU, triton's ptxas)
# ---------------------------------------------------------------------------------------------------------------
def _builds():
    """(config, M) pairs: the table's configs at every M they serve, the variants at M = 1 and max_m."""
    out, lo = [], 1
    for hi, cfg in mod.CONFIGS.rows:
        if isinstance(cfg, G):
            out += [(cfg, m) for m in sorted({1 << (m - 1).bit_length() for m in range(lo, hi + 1)})]
        lo = hi + 1
    from fp4ref.kernels.gemm_fp16.bench import sweep_candidates  # the --sweep candidates, at the M they run

    sweep = [(c, 1 << (m - 1).bit_length()) for m in (1, 2, 3, 4) for c in sweep_candidates(m) if isinstance(c, G)]
    out += [(c, m) for c in VARIANTS for m in (1, c.max_m)]
    return out + [p for i, p in enumerate(sweep) if p not in out and p not in sweep[:i]]


@pytest.mark.parametrize("cfg, M", _builds(), ids=repr)
def test_config_builds_for_sm90(cfg, M):
    """16-byte loads of B (where a tile row gives each thread 8 elements), no tensor-core instruction, no spills,
    no ptxas advisory, at the workload's K."""
    sig = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
           "stride_am": "i32", "stride_bn": "i32", "stride_cm": "i32"}
    ck = compile_for_sm90(gemm_fp16_gemv_kernel, sig, gemv_constexprs(cfg, M, K_WL), num_warps=cfg.num_warps,
                          divisible_by_16=["a_ptr", "b_ptr", "c_ptr", "N", "K", "stride_am", "stride_bn",
                                           "stride_cm"])
    ptx = ck.asm["ptx"]
    assert "wgmma" not in ptx and "mma.sync" not in ptx
    if cfg.BLOCK_N * cfg.BLOCK_K >= 8 * 32 * cfg.num_warps:
        assert "ld.global.v4" in ptx or "ld.global.nc.v4" in ptx  # 16-byte loads
    assert ck.metadata.shared <= SM90_MAX_SHARED_BYTES and ptxas_advisories(ptx) == []
    info = sass_info(ck.asm["cubin"])
    if info:  # where triton's bundled cuobjdump reads the SASS
        assert info["spill_stores"] == info["spill_loads"] == 0, info
        assert info["hgmma"] == info["qgmma"] == 0, info


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M", [1, 2])
def test_workload_m_within_bound_and_deterministic(M):
    rng = np.random.default_rng(M)
    a = rng.standard_normal((M, K_WL)).astype(np.float16)
    b = rng.standard_normal((N_WL, K_WL)).astype(np.float16)
    cfg = mod.pick_config(M, N_WL, K_WL)
    assert isinstance(cfg, G)
    c1, c2 = _run(a, b, cfg), _run(a, b, cfg)
    assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))
    check(c1, reference(a, b), mod.accumulation_model(cfg, K_WL), output_rounding="rne", poison=NAN).assert_ok()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M", [1, 2])
def test_workload_exact_accumulation_is_correctly_rounded(M):
    rng = np.random.default_rng(100 + M)
    a = rng.integers(-4, 5, (M, K_WL)).astype(np.float16)  # |partial sums| <= 16 * 2048 < 2^24: exact in fp32
    b = rng.integers(-4, 5, (N_WL, K_WL)).astype(np.float16)
    cfg = mod.pick_config(M, N_WL, K_WL)
    check(_run(a, b, cfg), reference(a, b), "fp32_rn", output_rounding="rne", poison=NAN,
          exact_accumulation=True).assert_ok()


@pytest.mark.gpu
@needs_gpu
def test_ragged_shapes_and_variants_on_gpu():
    """N and K tails, every variant at its max_m, A with a row stride past K."""
    rng = np.random.default_rng(7)
    for cfg in TABLE + VARIANTS:
        for M, N, K in ((1, 8, 8), (cfg.max_m, 200, 328), (min(cfg.max_m, 2), 3072, 2056)):
            a = rng.standard_normal((M, K)).astype(np.float16)
            b = rng.standard_normal((N, K)).astype(np.float16)
            check(_run(a, b, cfg), reference(a, b), "fp32_rn", output_rounding="rne", poison=NAN).assert_ok()
    a_wide = torch.from_numpy(rng.standard_normal((2, 2056)).astype(np.float16)).cuda()
    a = a_wide[:, :2048]  # row stride 2056
    b = torch.from_numpy(rng.standard_normal((64, 2048)).astype(np.float16)).cuda()
    out = mod.gemm_fp16(a, b, TABLE[-1])
    check(out.cpu(), reference(a.cpu().numpy(), b.cpu().numpy()), "fp32_rn", output_rounding="rne").assert_ok()
