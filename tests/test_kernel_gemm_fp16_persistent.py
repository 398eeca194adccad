"""gemm_fp16's persistent Gluon path (PersistentConfig, kernels/gemm_fp16/persistent.py): warp-specialized wgmma
with the deterministic stream-K schedule of the `tl` stream-K kernel.

CPU: configs built for sm_90 with triton's compiler (there is no Gluon interpreter): wgmma, TMA loads and the TMA
store, a producer partition (setmaxnreg), gpu-scope atomics only where tiles can be split, no spills, shared
memory within the sm_90 limit; config checks; the accumulation model is the `tl` stream-K kernel's for the same
tiles and grid; the bench's names and table source.
GPU (``-m gpu``): NaN-poisoned output within the bound of the launch's own model against fp4ref's exact
reference, bitwise equal run to run and to the `tl` stream-K kernel with the same tiles and schedule (the same
pieces summed in the same order), every arrival counter back to 0; tiles split up to many ways, a K tail, ragged M
and N, M below one tile; exact-accumulation inputs correctly rounded.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fp4ref.kernels.gemm_fp16 as mod
from fp4ref.bounds import check
from fp4ref.gemm import gemm_fp16 as reference
from fp4ref.kernels import _runtime
from fp4ref.kernels._sm90 import compile_for_sm90, gluon_tensordesc
from fp4ref.kernels.gemm_fp16.bench import _config_source, cfg_name
from fp4ref.kernels.gemm_fp16.persistent import gemm_persistent_kernel, persistent_constexprs, persistent_layouts
from _sm90_checks import assert_gluon_build  # tests/_sm90_checks.py
from _marks import INTERPRETER_ONLY  # tests/_marks.py

P = mod.PersistentConfig
T = mod.TmaConfig
ON_GPU = torch.cuda.is_available()
NAN = float("nan")


def _table_and_tune_candidates():
    from fp4ref.kernels.gemm_fp16.bench import tune_buckets
    return [c for _, c in mod.CONFIGS.rows if isinstance(c, P)] + [
        c for _, _, cands in tune_buckets() for c in cands if isinstance(c, P)]


# (plus the table's and every --tune candidate: a config the tuner may write into the table)
BUILDS = list(dict.fromkeys([P(128, 256, 64, 3, 8, 0), P(128, 256, 64, 3, 8, 2), P(128, 128, 64, 5, 8, 1),
                             P(64, 256, 32, 6, 4, 2), P(128, 192, 64, 4, 8, 0), P(64, 192, 64, 5, 8, 0),
                             P(192, 128, 64, 4, 8, 0), P(192, 128, 32, 8, 4, 0), P(192, 64, 64, 6, 8, 0),
                             P(192, 128, 128, 2, 8, 0), P(192, 64, 128, 3, 8, 0),
                             *_table_and_tune_candidates()]))


def _desc_blocks(cfg) -> dict:
    """The block shape of each descriptor parameter in parameter order (a one-part dimension's second descriptor
    repeats its first's)."""
    (m_hi, m_lo), (n_hi, n_lo) = _runtime.m_parts(cfg.BLOCK_M), _runtime.m_parts(cfg.BLOCK_N)
    return {"a_desc": [m_hi, cfg.BLOCK_K], "a2_desc": [m_lo or m_hi, cfg.BLOCK_K], "b_desc": [n_hi, cfg.BLOCK_K],
            "b2_desc": [n_lo or n_hi, cfg.BLOCK_K], "c_desc": [m_hi, n_hi],
            "c2_desc": [m_hi, n_lo] if n_lo else [m_lo or m_hi, n_hi]}


def _build(cfg):
    layouts = persistent_layouts(cfg)
    sig = {name: gluon_tensordesc("fp16", block, layout)
           for (name, block), layout in zip(_desc_blocks(cfg).items(), layouts, strict=True)}
    sig |= {"ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
    return compile_for_sm90(gemm_persistent_kernel, sig, persistent_constexprs(cfg), num_warps=cfg.num_warps,
                            divisible_by_16=["ws_ptr", "cnt_ptr", "N", "K"])


@pytest.mark.parametrize("cfg", [P(128, 192, 32, 7, 8, 0), P(128, 256, 64, 3, 8, 2), P(192, 128, 64, 4, 8, 0)],
                         ids=repr)
def test_the_plan_launches_what_the_build_test_compiles(cfg):
    """The host plan (built on the CPU, not launched): a descriptor per leading kernel parameter, over A, A, B, B,
    C, C, with the blocks and layouts the sm_90 builds above compile, and the constexprs in parameter order."""
    M, N, K = 972, 1000, 2048  # N = 1000: the last column tile's low part lies wholly past N
    A = torch.ones(M, K, dtype=torch.float16)
    B = torch.ones(N, K, dtype=torch.float16)
    plan = mod._plan(A, B, M, N, K, cfg, False)
    names = gemm_persistent_kernel.arg_names
    descs = dict(zip(names, plan.launch.descs))  # (zip stops at the descriptors: the leading parameters)
    assert plan.path == "persistent" and {n: d.block_shape for n, d in descs.items()} == _desc_blocks(cfg)
    assert [(d.shape, d.strides) for d in descs.values()] == [([M, K], [K, 1])] * 2 + [([N, K], [K, 1])] * 2 + [
        ([M, N], [N, 1])] * 2
    assert [d.layout for d in descs.values()] == list(persistent_layouts(cfg))
    assert list(plan.launch.constexprs) == [names[i] for i in gemm_persistent_kernel.constexprs]
    tiles = -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
    assert plan.launch.grid[0] == (min(tiles, _runtime.num_sms(A.device)) if not cfg.STREAM_K
                                   else _runtime.num_sms(A.device))


@pytest.mark.parametrize("cfg", BUILDS, ids=repr)
def test_config_builds_for_sm90(cfg):
    ck = _build(cfg)
    assert_gluon_build(ck)
    ptx = ck.asm["ptx"]
    assert "setmaxnreg" in ptx  # the producer partition hands its registers to the consumer warpgroups
    assert "cp.async.bulk.tensor.2d.global.shared" in ptx  # the TMA store of C
    assert ck.metadata.shared <= cfg.shared_bytes + 1024
    # split tiles: the acq_rel arrival and the head's acquire read; whole tiles only: no atomics at all
    assert ("atom.global.gpu.acq_rel.add" in ptx) == bool(cfg.STREAM_K), cfg
    assert ("ld.global.gpu.acquire" in ptx) == bool(cfg.STREAM_K), cfg
    if cfg.BLOCK_N == 192:  # each part's wgmma is its own group: waiting down to 2 retires the previous K step's
        assert ptx.count("wgmma.commit_group.sync.aligned") == 2 and "wgmma.wait_group.sync.aligned 2;" in ptx
    if cfg.BLOCK_M == 192:  # two row parts: both consumers hand every slot back; a K step brings both A boxes
        inits = re.findall(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], (\d+);", ptx)
        assert sorted(inits) == ["1"] * cfg.STAGES + ["2"] * cfg.STAGES, inits
        assert re.findall(r"expect_tx\.shared\.b64 _, \[%r\d+\], (\d+);", ptx) == [
            str((192 + cfg.BLOCK_N) * cfg.BLOCK_K * 2)]
        # A high, A low and B, each one TMA message per 64 K-columns (at most a 128-byte swizzle row); C in two parts
        assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global") == 3 * max(1, cfg.BLOCK_K // 64)
        assert ptx.count("cp.async.bulk.tensor.2d.global.shared") == 2


@pytest.mark.parametrize("kw, exc, words", [
    (dict(BLOCK_M=256), ValueError, "BLOCK_M=256"), (dict(BLOCK_N=32), ValueError, "BLOCK_N=32"),
    (dict(BLOCK_K=16), ValueError, "BLOCK_K=16"), (dict(STAGES=1), ValueError, "STAGES=1"),
    (dict(GROUP_M=3), ValueError, "GROUP_M=3"), (dict(STREAM_K=3), ValueError, "STREAM_K=3"),
    (dict(BLOCK_N=96, STREAM_K=0), ValueError, "BLOCK_N=96"), (dict(BLOCK_N=192), ValueError, "whole tiles only"),
    (dict(BLOCK_M=192, BLOCK_N=128), ValueError, "BLOCK_M=192 .* whole tiles only"),
    (dict(BLOCK_M=192, BLOCK_N=192, STREAM_K=0), ValueError, "expected BLOCK_N 64 or 128"),
    (dict(BLOCK_M=192, BLOCK_N=256, BLOCK_K=32, STAGES=4, STREAM_K=0), ValueError, "registers per thread"),
    (dict(BLOCK_M=96, STREAM_K=0), ValueError, "BLOCK_M=96"),
    (dict(BLOCK_K=128, STAGES=3), ValueError, "shared memory for STAGES"), (dict(STAGES=3.0), TypeError, "STAGES"),
])
def test_bad_configs_raise(kw, exc, words):
    with pytest.raises(exc, match=words):
        P(**kw)


def test_model_and_schedule_are_the_tl_stream_k_kernels():
    """Same tiles, same grid: the same pieces, so the same declared model; whole tiles only: one chain per tile."""
    for M in (1, 100, 972, 2053, 2379, 8192):
        for sk, tl_sk in ((1, 1), (2, 2)):
            p = P(128, 256, 64, 3, 8, sk)
            t = T(128, 256, 64, num_warps=8, num_stages=3, STREAM_K=tl_sk)
            G = mod.launch_programs(p, M, 3072, 2048, 132)
            assert G == mod.launch_programs(t, M, 3072, 2048, 132)
            assert mod.stream_k_schedule(p, M, 3072, 2048, G) == mod.stream_k_schedule(t, M, 3072, 2048, G)
            assert (mod.accumulation_model(p, 2048, M=M, N=3072, num_programs=G)
                    == mod.accumulation_model(t, 2048, M=M, N=3072, num_programs=G))
    assert mod.accumulation_model(P(STREAM_K=1), 2048, M=972, N=3072, num_programs=132) == \
        "splitk(hopper_fp16_wgmma, 1600)"
    assert mod.accumulation_model(P(STREAM_K=0), 2048) == "hopper_fp16_wgmma"
    assert mod.accumulation_model(P(STREAM_K=2), 2048, interpreter=True) == "tc_fp32_universal"  # no M, N
    assert mod.launch_programs(P(STREAM_K=0), 972, 3072, 2048, 132) == 96  # whole tiles: one CTA per tile


def test_schedule_and_model_arguments_are_checked():
    for bad in (dict(M=1024.0), dict(N=True), dict(K=4096.5), dict(num_programs=132.0)):
        args = dict(M=1024, N=1024, K=4096, num_programs=132) | bad
        name = next(iter(bad))
        with pytest.raises(TypeError, match=name):
            mod.stream_k_schedule(P(), args["M"], args["N"], args["K"], args["num_programs"])
        with pytest.raises(TypeError, match=name):
            mod.accumulation_model(P(), args["K"], M=args["M"], N=args["N"], num_programs=args["num_programs"])
    # a grid far larger than the work: the programs past the last K-iteration own nothing (and cost nothing)
    big = mod.stream_k_schedule(P(STREAM_K=1), 1024, 1024, 1024, 10 ** 9)
    small = mod.stream_k_schedule(P(STREAM_K=1), 1024, 1024, 1024, 32 * 16)
    assert big == small and big["max_pieces"] == 16


@INTERPRETER_ONLY
def test_persistent_config_on_cpu_tensors_is_refused():
    A = torch.ones(4, 64, dtype=torch.float16)
    B = torch.ones(16, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="persistent Gluon path runs on CUDA"):
        mod.gemm_fp16(A, B, config=P())


def test_bench_names_and_table_source():
    cfg = P(128, 128, 64, 5, 4, 1)
    assert cfg_name(cfg) == "persistent:128x128x64/st5/g4/sk1"
    assert eval(_config_source(cfg), {"PersistentConfig": P}) == cfg


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (Hopper)")

# (config, M, N, K): the workload's wave-quantized sizes; a K tail (1000 = 15 x 64 + 40); more CTAs than tiles (each
# tile split many ways); M below one tile; the whole-tile mode with a ragged M and N
CASES = [
    (P(128, 256, 64, 3, 8, 2), 972, 3072, 2048),
    (P(128, 256, 64, 3, 8, 2), 2379, 3072, 2048),
    (P(128, 256, 64, 3, 8, 1), 2053, 3072, 2048),
    (P(128, 128, 64, 5, 8, 1), 300, 520, 1000),
    (P(128, 128, 64, 4, 4, 2), 129, 1032, 4096),
    (P(64, 256, 32, 6, 4, 1), 5, 256, 512),
    (P(128, 256, 64, 3, 8, 0), 700, 1000, 640),
    # two column parts: the workload's M = 972; N = 520 ends in a part of 8 columns; N = 1000 in a high part of 40
    # and a low part wholly past N
    (P(128, 192, 64, 4, 8, 0), 972, 3072, 2048),
    (P(128, 192, 32, 7, 8, 0), 1536, 3072, 2048),  # 192 tiles: CTAs with two, the stores of one overlap the next
    (P(128, 192, 64, 3, 4, 0), 300, 520, 1000),
    (P(64, 192, 64, 5, 8, 0), 129, 1000, 512),
    # two row parts (the low one in a worker partition): M = 2053 makes 11 row tiles of 192 (264 tiles, two per
    # CTA); M = 300 ends in a high part of 108 rows and a low part wholly past M; M = 129 in a low part of one row
    (P(192, 128, 64, 4, 8, 0), 2053, 3072, 2048),
    (P(192, 128, 32, 8, 4, 0), 300, 520, 1000),
    (P(192, 64, 64, 6, 8, 0), 129, 1000, 512),
    # 128-wide K steps (two TMA messages per box), each tile's K ending in a partial step (1000 = 7 x 128 + 104)
    (P(192, 64, 128, 3, 8, 0), 700, 1000, 1000),
    (P(128, 128, 128, 3, 8, 0), 700, 1000, 1000),
]
_TL_MODE = {0: 3, 1: 1, 2: 2}  # PersistentConfig.STREAM_K -> the tl kernel's mode with the same schedule


def _run(A, B, cfg):
    C = torch.full((A.shape[0], B.shape[0]), NAN, dtype=torch.float16, device="cuda")
    assert mod.gemm_fp16(A, B, config=cfg, out=C) is C
    return C


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_within_bound_deterministic_and_equal_to_the_tl_stream_k_kernel(case):
    cfg, M, N, K = case
    rng = np.random.default_rng(M + N + K)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((N, K)).astype(np.float16)
    A, B = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    c1 = _run(A, B, cfg)
    c2 = _run(A, B, cfg)
    assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))  # bitwise, run to run
    # (a two-part tile's elements have the one-part tile's chains: the tl kernel with 128-wide tiles)
    tl_cfg = T(128 if cfg.BLOCK_M == 192 else cfg.BLOCK_M, 128 if cfg.BLOCK_N == 192 else cfg.BLOCK_N, cfg.BLOCK_K,
               num_warps=cfg.num_warps, num_stages=3, GROUP_M=cfg.GROUP_M, STREAM_K=_TL_MODE[cfg.STREAM_K])
    assert torch.equal(c1.view(torch.int16), _run(A, B, tl_cfg).view(torch.int16))
    device = A.device
    cnt = _runtime.workspace(device, _runtime.current_stream(device), mod.COUNTERS, 1, torch.int32, zeroed=True)
    assert not cnt.any()  # every split tile's counter reset by its finisher
    sch = mod.stream_k_schedule(cfg, M, N, K, mod.launch_programs(cfg, M, N, K, _runtime.num_sms(device))) \
        if cfg.STREAM_K else None
    if sch is not None:
        assert sch["split_tiles"] > 0 and sch["max_pieces"] >= 2  # the case really splits tiles
    if M * N * K <= 2 ** 32:  # the exact reference at the smaller sizes (the larger ones equal the tl kernel's)
        model = mod.accumulation_model(cfg, K, M=M, N=N)
        check(c1.cpu(), reference(a, b), model, output_rounding="rne", poison=NAN).assert_ok()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cfg", [P(128, 256, 64, 3, 8, 2), P(128, 128, 64, 5, 8, 1), P(128, 192, 64, 4, 8, 0),
                                 P(192, 128, 64, 4, 8, 0)], ids=repr)
def test_exact_accumulation_is_correctly_rounded(cfg):
    M, N, K = 260, 3072, 2048
    rng = np.random.default_rng(5)
    a = rng.integers(-4, 5, (M, K)).astype(np.float16)  # |partial sums| <= 16 * 2048 < 2^24: exact in fp32
    b = rng.integers(-4, 5, (N, K)).astype(np.float16)
    c = _run(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), cfg)
    check(c.cpu(), reference(a, b), mod.accumulation_model(cfg, K, M=M, N=N), output_rounding="rne", poison=NAN,
          exact_accumulation=True).assert_ok()
