"""gemm_fp16's Gluon path (GluonConfig, kernels/gemm_fp16/gluon.py): the swap-AB wgmma kernel for M <= 256.

CPU: every GluonConfig of CONFIGS, the split-K, warp-specialized and two-part BLOCK_M variants and the sweep's Gluon
candidates, is built for sm_90 with triton's compiler (there is no Gluon interpreter): wgmma and TMA in the PTX, HGMMA
and UTMALDG in the SASS, no register spills, shared memory within the sm_90 limit; config, table and
accumulation-model checks.
GPU (``-m gpu``): every workload M <= 256 against fp4ref's exact reference under the config's declared model,
NaN-poisoned outputs, randn inputs, bitwise equality run to run; exact-accumulation inputs must give the correctly
rounded result; shapes off the workload (N and K tails, several M tiles, split-K, warp specialization, two-part
BLOCK_M); a two-part tile's output bitwise equal to the power-of-two tile's (each output element sees the same wgmma K
order).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fp4ref.kernels.gemm_fp16 as mod
from fp4ref.bounds import check, get_model
from fp4ref.gemm import gemm_fp16 as reference
from fp4ref.kernels._sm90 import compile_for_sm90, gluon_tensordesc
from fp4ref.kernels.gemm_fp16.gluon import gemm_swapab_kernel, gluon_constexprs, m_parts, operand_layouts
from _sm90_checks import assert_cluster_build, assert_gluon_build  # tests/_sm90_checks.py
from _marks import INTERPRETER_ONLY  # tests/_marks.py

GluonConfig = mod.GluonConfig
ON_GPU = torch.cuda.is_available()
NAN = float("nan")
N, K = 3072, 2048
WORKLOAD_M = [1, 2, 4, 7, 8, 15, 16, 24, 32, 35, 40, 48, 56, 64, 70, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144,
              152, 160, 168, 176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256]
TABLE = [c for c in mod.CONFIGS.configs() if isinstance(c, GluonConfig)]
VARIANTS = [GluonConfig(BLOCK_N=128, BLOCK_M=8, BLOCK_K=64, STAGES=8, SPLIT_K=3),
            GluonConfig(BLOCK_N=64, BLOCK_M=64, BLOCK_K=64, STAGES=8, WARP_SPEC=True),
            GluonConfig(BLOCK_N=64, BLOCK_M=24, BLOCK_K=128, STAGES=4),  # two parts: 16 + 8
            GluonConfig(BLOCK_N=128, BLOCK_M=96, BLOCK_K=64, STAGES=4, num_warps=8),  # 64 + 32, two warpgroups
            GluonConfig(BLOCK_N=64, BLOCK_M=192, BLOCK_K=64, STAGES=3)]  # 128 + 64: 96 accumulator registers
# K slices in one thread-block cluster, summed through distributed shared memory
CLUSTERED = [GluonConfig(BLOCK_N=64, BLOCK_M=128, BLOCK_K=128, STAGES=3, SPLIT_K=2, CLUSTER=True),
             GluonConfig(BLOCK_N=64, BLOCK_M=16, BLOCK_K=128, STAGES=4, SPLIT_K=4, CLUSTER=True),
             GluonConfig(BLOCK_N=128, BLOCK_M=64, BLOCK_K=64, STAGES=4, SPLIT_K=2, num_warps=8, CLUSTER=True)]


def _build(cfg: GluonConfig, n: int = N, k: int = K, floor: int = 0):
    b_layout, a_layout, a2_layout = operand_layouts(cfg)
    hi, lo = m_parts(cfg.BLOCK_M)
    sig = {"b_desc": gluon_tensordesc("fp16", [cfg.BLOCK_N, cfg.BLOCK_K], b_layout),
           "a_desc": gluon_tensordesc("fp16", [hi, cfg.BLOCK_K], a_layout),
           "a2_desc": gluon_tensordesc("fp16", [lo or hi, cfg.BLOCK_K], a2_layout),
           "c_ptr": "*fp16", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "k_tiles": "i32",
           "stride_cm": "i32"}
    return compile_for_sm90(gemm_swapab_kernel, sig, {**gluon_constexprs(cfg, k), "FLOOR": floor},
                            num_warps=cfg.num_warps, num_ctas=cfg.cluster_size(k),
                            divisible_by_16=["c_ptr", "ws_ptr", "cnt_ptr", "N", "stride_cm"])


def _gluon_config(M: int) -> GluonConfig:
    """The table's Gluon config for M (the first Gluon row at or above M: at M = 1-2, where the GEMV path serves
    the call, the Gluon row of M = 3-8)."""
    cfg = next(c for b, c in mod.CONFIGS.rows if M <= b and isinstance(c, GluonConfig))
    assert cfg is mod.pick_config(M, N, K) or M <= 2
    return cfg


def _sweep_candidates():
    from fp4ref.kernels.gemm_fp16.bench import gluon_candidates

    return [c for c in dict.fromkeys(c for m in range(3, 257) for c in gluon_candidates(m))
            if c not in TABLE + VARIANTS + CLUSTERED]


@pytest.mark.parametrize("cfg", TABLE + VARIANTS + CLUSTERED + _sweep_candidates(), ids=repr)
def test_gluon_config_builds_for_sm90(cfg):
    """Every tabled config, the variants the GPU tests run and every Gluon config ``bench --sweep`` may time."""
    assert_gluon_build(_build(cfg))


@pytest.mark.parametrize("cfg", CLUSTERED, ids=repr)
def test_cluster_config_builds_a_dsmem_reduction(cfg):
    """CLUSTER: the slices' accumulators summed in the first CTA of a cluster (``assert_cluster_build``)."""
    ck = _build(cfg)
    assert_cluster_build(ck, cfg.SPLIT_K, cfg.BLOCK_N * cfg.BLOCK_M, cfg.num_warps)


def test_cluster_config_rules():
    for kw in (dict(SPLIT_K=3), dict(SPLIT_K=2, WARP_SPEC=True), dict(SPLIT_K=16)):
        with pytest.raises(ValueError, match="CLUSTER=True needs"):
            GluonConfig(CLUSTER=True, **kw)
    with pytest.raises(ValueError, match="static shared memory"):  # one 64 x 256 fp32 slot: 64 KiB > 48 KiB
        GluonConfig(BLOCK_N=64, BLOCK_M=256, BLOCK_K=64, STAGES=2, SPLIT_K=2, CLUSTER=True)
    # a ring that fits alone, not beside the exchange buffer (one 64 x 128 fp32 slot and the mbarrier: 33 KiB)
    GluonConfig(BLOCK_N=64, BLOCK_M=128, BLOCK_K=64, STAGES=9, SPLIT_K=2)
    with pytest.raises(ValueError, match="227 KiB"):
        GluonConfig(BLOCK_N=64, BLOCK_M=128, BLOCK_K=64, STAGES=9, SPLIT_K=2, CLUSTER=True)
    with pytest.raises(TypeError, match="CLUSTER"):
        GluonConfig(SPLIT_K=2, CLUSTER="yes")
    cfg = GluonConfig(BLOCK_M=16, BLOCK_K=128, SPLIT_K=4, CLUSTER=True)
    assert cfg.cluster_size(2048) == cfg.cluster_size(512) == 4
    assert cfg.cluster_size(640) == cfg.cluster_size(128) == 1  # 3 and 1 slices: the workspace reduction
    assert mod.accumulation_model(cfg, K) == mod.accumulation_model(GluonConfig(BLOCK_M=16, BLOCK_K=128, SPLIT_K=4), K)


def test_table_serves_small_m_with_gluon_on_the_gpu_and_tl_in_the_interpreter():
    for M in range(1, 257):  # M = 1-2: the GEMV path (tests/test_kernel_gemm_fp16_gemv.py)
        assert isinstance(mod.pick_config(M, N, K, interpreter=False), mod.GemvConfig if M <= 2 else GluonConfig)
        assert isinstance(mod.pick_config(M, N, K, interpreter=True), mod.SplitKConfig)
    assert isinstance(mod.pick_config(257, N, K, interpreter=False), mod.PersistentConfig)  # (128 x 192 tiles)


@pytest.mark.parametrize("cfg", TABLE + VARIANTS, ids=repr)
def test_accumulation_model_matches_the_split(cfg):
    name = mod.accumulation_model(cfg, K)
    model = get_model(name)
    per, slices = cfg.k_split(K)
    if slices == 1:
        assert name == "hopper_fp16_wgmma"
    else:
        assert name == f"splitk(hopper_fp16_wgmma, {per * cfg.BLOCK_K})"
        assert -(-K // model.chunk) == slices  # fp4ref's chunk count is the number of launched slices
    assert model.eps(K) <= get_model(mod.NUMERIC_CONTRACT.model).eps(K)  # within the contract's promise


def test_k_split_never_launches_an_empty_slice():
    for S in range(1, 40):
        for k_tiles in (1, 5, 31, 32, 33):
            cfg = GluonConfig(SPLIT_K=S)
            per, slices = cfg.k_split(k_tiles * cfg.BLOCK_K)
            assert (slices - 1) * per < k_tiles <= slices * per and slices <= S


def test_m_parts_are_the_wgmma_widths():
    assert [m_parts(bm) for bm in (8, 24, 48, 64, 96, 136, 192, 256)] == [
        (8, 0), (16, 8), (32, 16), (64, 0), (64, 32), (128, 8), (128, 64), (256, 0)]
    ok = [bm for bm in range(1, 300) if _accepts(BLOCK_M=bm, STAGES=2)]  # (2 stages: within shared memory)
    # powers of two in 8..256 and their sums of two, written out
    assert ok == [8, 16, 24, 32, 40, 48, 64, 72, 80, 96, 128, 136, 144, 160, 192, 256]


def _accepts(**kw) -> bool:
    try:
        GluonConfig(**kw)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("kw, words", [
    (dict(BLOCK_M=100), "BLOCK_M=100"), (dict(BLOCK_M=112), "BLOCK_M=112"), (dict(BLOCK_M=4), "BLOCK_M=4"),
    (dict(BLOCK_M=264), "BLOCK_M=264"), (dict(BLOCK_M=0), "BLOCK_M=0"),
    (dict(BLOCK_M=96, SPLIT_K=2), "two wgmma parts"), (dict(BLOCK_M=48, WARP_SPEC=True), "two wgmma parts"),
    (dict(BLOCK_N=32), "BLOCK_N=32"), (dict(num_warps=2), "num_warps=2"),
    (dict(STAGES=1), "STAGES=1"), (dict(SPLIT_K=0), "SPLIT_K=0"), (dict(BLOCK_K=256), "BLOCK_K=256"),
    (dict(BLOCK_N=128, BLOCK_M=256, num_warps=4), "accumulator registers"),
    (dict(STAGES=1000), "shared memory"), (dict(BLOCK_M=192, STAGES=4), "262208 bytes of shared memory"),
])
def test_bad_configs_raise(kw, words):
    with pytest.raises(ValueError, match=words):
        GluonConfig(**kw)


def test_bad_config_types_raise():
    with pytest.raises(TypeError, match="STAGES"):
        GluonConfig(STAGES=2.0)
    with pytest.raises(TypeError, match="WARP_SPEC"):
        GluonConfig(WARP_SPEC=1)


@INTERPRETER_ONLY
def test_gluon_config_on_cpu_tensors_is_refused():
    A = torch.ones(4, 64, dtype=torch.float16)
    B = torch.ones(16, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="Gluon path runs on CUDA"):
        mod.gemm_fp16(A, B, config=GluonConfig(BLOCK_M=8))


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (Hopper)")


@pytest.fixture(scope="module")
def weights():
    b = np.random.default_rng(0).standard_normal((N, K)).astype(np.float16)
    return b, torch.from_numpy(b).cuda()


def _run(A, B, cfg):
    C = torch.full((A.shape[0], B.shape[0]), NAN, dtype=torch.float16, device="cuda")
    assert mod.gemm_fp16(A, B, config=cfg, out=C) is C
    return C


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M", WORKLOAD_M)
def test_workload_m_within_declared_bound_and_deterministic(M, weights):
    b, B = weights
    a = np.random.default_rng(M).standard_normal((M, K)).astype(np.float16)
    A = torch.from_numpy(a).cuda()
    cfg = _gluon_config(M)
    c1, c2 = _run(A, B, cfg), _run(A, B, cfg)
    assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))  # bitwise, run to run
    check(c1.cpu(), reference(a, b), mod.accumulation_model(cfg, K), output_rounding="rne", poison=NAN).assert_ok()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M", [1, 7, 64, 136, 256])
def test_exact_accumulation_is_correctly_rounded(M):
    rng = np.random.default_rng(100 + M)
    a = rng.integers(-4, 5, (M, K)).astype(np.float16)  # |partial sums| <= 16 * 2048 < 2^24: exact in fp32
    b = rng.integers(-4, 5, (N, K)).astype(np.float16)
    cfg = _gluon_config(M)
    c = _run(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), cfg)
    check(c.cpu(), reference(a, b), mod.accumulation_model(cfg, K), output_rounding="rne", poison=NAN,
          exact_accumulation=True).assert_ok()


@pytest.mark.gpu
@needs_gpu
def test_other_shapes_split_k_and_warp_specialization():
    """N and K tails (TMA zero fill), M above BLOCK_M (several M tiles; the last one's A box shifted back to end at
    row M), split-K, warp specialization."""
    rng = np.random.default_rng(7)
    for M, n, k, cfg in ((5, 200, 328, GluonConfig(BLOCK_M=8, BLOCK_K=64, SPLIT_K=3)),
                         (40, 264, 520, GluonConfig(BLOCK_N=64, BLOCK_M=16, BLOCK_K=64)),
                         (100, 3072, 2048, GluonConfig(BLOCK_M=32, BLOCK_K=64, STAGES=4, SPLIT_K=4)),
                         (64, 3072, 2048, GluonConfig(BLOCK_N=64, BLOCK_M=64, BLOCK_K=64, STAGES=8, WARP_SPEC=True)),
                         (72, 328, 520, GluonConfig(BLOCK_N=64, BLOCK_M=64, BLOCK_K=64, STAGES=3, WARP_SPEC=True)),
                         (24, 520, 1000, GluonConfig(BLOCK_N=64, BLOCK_M=32, BLOCK_K=128, STAGES=3, SPLIT_K=2)),
                         (20, 200, 328, GluonConfig(BLOCK_M=24, BLOCK_K=64, STAGES=3)),  # one tile, rows past M
                         (150, 264, 520, GluonConfig(BLOCK_N=128, BLOCK_M=96, BLOCK_K=64, STAGES=4, num_warps=8)),
                         (200, 3072, 2048, GluonConfig(BLOCK_M=80, BLOCK_K=128, STAGES=6))):  # 3 tiles, last shifted
        a = rng.standard_normal((M, k)).astype(np.float16)
        b = rng.standard_normal((n, k)).astype(np.float16)
        c = _run(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), cfg)
        check(c.cpu(), reference(a, b), mod.accumulation_model(cfg, k), output_rounding="rne",
              poison=NAN).assert_ok()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M, n, k, cfg", [(M, n, k, c) for c in CLUSTERED for M, n, k in (
    (c.BLOCK_M // 2 + 1, 3072, 2048), (min(2 * c.BLOCK_M + 5, 250), 328, 1536), (3, 200, 640))], ids=repr)
def test_cluster_reduction_has_the_workspace_bits(M, n, k, cfg):
    """The cluster sum adds the slices in the workspace reduction's order: bitwise the same C (NaN-poisoned), with
    one and several M tiles, an N tail, and K = 640 (5 K tiles of 128: SPLIT_K 4 gives 3 slices, so
    ``CLUSTERED[1]`` falls back to the workspace there; the others still form clusters); within the model."""
    rng = np.random.default_rng(M + n)
    a = rng.standard_normal((M, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    A, B = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    twin = GluonConfig(cfg.BLOCK_N, cfg.BLOCK_M, cfg.BLOCK_K, cfg.STAGES, cfg.SPLIT_K, cfg.num_warps)
    got, want = _run(A, B, cfg), _run(A, B, twin)
    assert not torch.isnan(got).any() and torch.equal(got.view(torch.int16), want.view(torch.int16))
    check(got.cpu(), reference(a, b), mod.accumulation_model(cfg, k), output_rounding="rne", poison=NAN).assert_ok()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M, bm", [(20, 24), (40, 48), (70, 40), (96, 48), (136, 72), (160, 80), (192, 96),
                                   (256, 136), (180, 192)])
def test_two_part_tile_equals_the_power_of_two_tile(M, bm, weights):
    """Each output element sees the same wgmma K order whatever the tile's width, so a two-part BLOCK_M (two
    accumulators, two A boxes) gives the power-of-two tile's bits; NaN-poisoned, so every element is written."""
    _, B = weights
    A = torch.from_numpy(np.random.default_rng(M + bm).standard_normal((M, K)).astype(np.float16)).cuda()
    two = _run(A, B, GluonConfig(BLOCK_M=bm, BLOCK_K=64, STAGES=4))
    one = _run(A, B, GluonConfig(BLOCK_M=64, BLOCK_K=64, STAGES=4))
    assert not torch.isnan(two).any()
    assert torch.equal(two.view(torch.int16), one.view(torch.int16))


# The floor benchmark's runs of this kernel (kernels/bench_floor.py, ``--tiles``): FLOOR 1, the loads without the
# wgmmas; FLOOR 2, the wgmmas without the refills
@pytest.mark.parametrize("floor", [1, 2], ids=["read", "mma"])
@pytest.mark.parametrize("cfg", [c for c in TABLE if c.SPLIT_K == 1 and not c.WARP_SPEC and not c.CLUSTER], ids=repr)
def test_floor_runs_build_for_sm90(cfg, floor):
    """Each floor run builds; its TMA copies and wgmmas are the kernel's (FLOOR 1: its prologue and refill sites,
    no wgmma; FLOOR 2: its wgmmas and one fill of every slot) and none else."""
    built = _build(cfg, floor=floor)
    ptx, kernel = built.asm["ptx"], _build(cfg).asm["ptx"]
    stage_loads = 3 if m_parts(cfg.BLOCK_M)[1] else 2  # B's box and A's one or two
    tma, wgmma = "cp.async.bulk.tensor", "wgmma.mma_async"
    assert ptx.count(tma) == (kernel.count(tma) if floor == 1 else stage_loads * cfg.STAGES)
    assert ptx.count(wgmma) == (0 if floor == 1 else kernel.count(wgmma))
    if floor == 2:
        assert_gluon_build(built)


def test_floor_launch_refuses_what_it_does_not_model():
    from fp4ref.kernels.bench_floor import swapab_floor_launch

    with pytest.raises(ValueError, match="SPLIT_K 1"):
        swapab_floor_launch(GluonConfig(SPLIT_K=2), 64, N, K, 1)
    with pytest.raises(ValueError, match="floor=3"):
        swapab_floor_launch(GluonConfig(), 64, N, K, 3)
    with pytest.raises(Exception, match="FLOOR: one slice"):  # the kernel's own guard
        _build(GluonConfig(BLOCK_M=16, SPLIT_K=2), floor=1)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M", [64, 70, 160, 192, 256])
def test_floor_runs_write_every_element_and_floor_0_is_the_kernel(M, weights):
    """FLOOR 0 through the floor benchmark's launch gives gemm_fp16's bits; FLOOR 2 (wgmmas over the first fill)
    and FLOOR 1 (zeros) write every element of a NaN-poisoned output."""
    from fp4ref.kernels import _runtime
    from fp4ref.kernels.bench_floor import swapab_floor_launch

    _, B = weights
    A = torch.from_numpy(np.random.default_rng(M).standard_normal((M, K)).astype(np.float16)).cuda()
    cfg = mod.pick_config(M, N, K)
    ours = _run(A, B, cfg)
    for floor in (0, 1, 2):
        C = torch.full((M, N), NAN, dtype=torch.float16, device="cuda")
        swapab_floor_launch(cfg, M, N, K, floor).launch(_runtime.current_stream(A.device), B, A, A, C,
                                                        *_runtime.unused_scratch(A.device), M, N,
                                                        -(-K // cfg.BLOCK_K), N)
        torch.cuda.synchronize()
        assert not torch.isnan(C).any()
        if floor == 0:
            assert torch.equal(C.view(torch.int16), ours.view(torch.int16))
        if floor == 1:
            assert not C.any()
