"""nvfp4_linear's Gluon path (GluonConfig, kernels/nvfp4_linear/gluon.py): W decoded in registers into wgmma.

CPU: every GluonConfig of CONFIGS, the variants below and every one the benchmark's sweep may pick is built for
sm_90 (there is no Gluon interpreter): wgmma and TMA in the PTX, HGMMA and UTMALDG in the SASS, no spills, no ptxas
advisory (serialized wgmma), shared memory within the limit. The quantizer's permuted K order
is checked in the interpreter against numpy on every element; config checks.
GPU (``-m gpu``): every tabled M against fp4ref's exact NVFP4 reference (recipe "sol") under the config's model,
NaN-poisoned outputs, bitwise determinism, and an exact-accumulation case (integer-valued products whose fp32 sums
are exact) equal to the correctly rounded output.
"""
from __future__ import annotations


import numpy as np
import pytest
import torch

import fp4ref.kernels.nvfp4_linear as nvl
from fp4ref.blockscale import nvfp4_quantize as ref_quantize
from fp4ref.kernels._sm90 import compile_for_sm90, gluon_tensordesc
from fp4ref.kernels.nvfp4_linear import gluon
from fp4ref.kernels.nvfp4_linear.quantize import AMAX_MAX_PROGRAMS, QuantizeLaunches
from _nvfp4_gpu import (assert_exact_accumulation_is_correctly_rounded,  # tests/_nvfp4_gpu.py
                        assert_within_bound_and_deterministic, x_bf16)
from _ptx_model import run_ptx as _run_ptx  # tests/_ptx_model.py
from _sm90_checks import assert_cluster_build, assert_gluon_build  # tests/_sm90_checks.py
from _marks import INTERPRETER_ONLY  # tests/_marks.py

G = nvl.GluonConfig
CUDA = torch.cuda.is_available()
TABLE = [c for c in nvl.CONFIGS.configs() if isinstance(c, G)]
VARIANTS = [G(BN=64, BM=16, SPLIT_K=2, STAGES=3, W_SWIZZLE=False), G(BN=128, BM=16, SPLIT_K=2, STAGES=3, num_warps=8),
            G(BN=128, BM=128, SPLIT_K=2, STAGES=3, num_warps=8, X_STAGES=8),
            G(BN=64, BM=32, SPLIT_K=4, STAGES=2, X_STAGES=3),
            G(BN=64, BM=96, SPLIT_K=1, STAGES=3),  # two x parts (64 + 32) in the W ring
            G(BN=64, BM=192, SPLIT_K=1, STAGES=3, X_STAGES=6),  # 128 + 64 in the x ring
            G(BN=128, BM=48, SPLIT_K=1, STAGES=3, num_warps=8)]  # 32 + 16, two warpgroups
# K slices in one thread-block cluster, summed through distributed shared memory
CLUSTERED = [G(BN=64, BM=8, SPLIT_K=2, STAGES=6, CLUSTER=True), G(BN=64, BM=16, SPLIT_K=4, STAGES=4, CLUSTER=True),
             G(BN=128, BM=32, SPLIT_K=2, STAGES=3, num_warps=8, X_STAGES=4, CLUSTER=True)]


def _build(cfg, pdl=True):
    wl, sl, xl, x2l = gluon.shared_layouts(cfg)
    hi, lo = gluon.m_parts(cfg.BM)
    sig = {"w_desc": gluon_tensordesc("u8", [cfg.BN, 128], wl), "s_desc": gluon_tensordesc("u8", [cfg.BN, 16], sl),
           "x_desc": gluon_tensordesc("fp16", [hi, gluon.x_block_k(cfg)], xl),
           "x2_desc": gluon_tensordesc("fp16", [lo or hi, gluon.x_block_k(cfg)], x2l), "gdec_ptr": "*fp32",
           "out_ptr": "*bf16",
           "part_ptr": "*fp32", "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
    cluster = cfg.cluster_size
    ce = dict(BN=cfg.BN, BM=cfg.BM, SPLIT_K=cfg.SPLIT_K, STAGES=cfg.STAGES, X_STAGES=cfg.X_STAGES,
              W_SWIZZLE=cfg.W_SWIZZLE, num_warps=cfg.num_warps, PDL=pdl,  # nvfp4_linear launches it with PDL
              X_LO=lo, CLUSTER=cluster)
    return compile_for_sm90(gluon.nvfp4_gluon_kernel, sig, ce, num_warps=cfg.num_warps, num_ctas=cluster,
                            divisible_by_16=["gdec_ptr", "out_ptr", "part_ptr", "count_ptr", "N", "K"])


def _sweep_candidates():
    from fp4ref.kernels.nvfp4_linear import bench

    return [c for c in bench.all_linear_candidates() if isinstance(c, G) and c not in TABLE + VARIANTS + CLUSTERED]


@pytest.mark.parametrize("cfg", TABLE + VARIANTS + CLUSTERED + _sweep_candidates(), ids=repr)
def test_gluon_config_builds_for_sm90(cfg):
    """Every tabled config, the variants the GPU tests run and every config the benchmark's sweep may pick."""
    assert_gluon_build(_build(cfg))


@pytest.mark.parametrize("cfg", CLUSTERED + [c for c in TABLE if c.CLUSTER and c not in CLUSTERED], ids=repr)
def test_cluster_config_builds_a_dsmem_reduction(cfg):
    """CLUSTER: the slices' accumulators summed in the first CTA of a cluster (``assert_cluster_build``)."""
    ck = _build(cfg)
    assert_cluster_build(ck, cfg.SPLIT_K, cfg.BN * cfg.BM, cfg.num_warps)
    assert ck.asm["ptx"].count("griddepcontrol.wait") == 1  # the PDL wait, once


@pytest.mark.parametrize("cfg", [TABLE[0], TABLE[-1]], ids=repr)
def test_gluon_pdl_build_waits_after_the_w_prologue(cfg):
    """Under programmatic dependent launch the kernel issues its W prologue (codes and scales of STAGES - 1 steps)
    before griddepcontrol.wait and reads nothing the quantizer writes before it; without PDL there is no wait."""
    ptx = _build(cfg).asm["ptx"]
    assert ptx.count("griddepcontrol.wait") == 1
    before, after = ptx.split("griddepcontrol.wait")
    assert before.count("cp.async.bulk.tensor") == 2 * (cfg.STAGES - 1)  # W codes + scales per prologue step
    assert "ld.global" not in before  # gdec (and the split-K partials) only after the wait
    assert "griddepcontrol" not in _build(cfg, pdl=False).asm["ptx"]


def _reference_permutation(K: int) -> np.ndarray:
    """dst[c] for every physical column c, spelled out from the A fragment (independent of the quantizer's
    formula): within each 256-chunk, lane q's logical columns k = 16 i + 8 j1 + 2 q + j0 (k16 instruction i) take
    its 64 physical codes [64 q, 64 q + 64) = 8 words of 8 codes, in the order the decode emits them: word i // 2,
    output e = 4 (i % 2) + 2 j1 + j0, which is code DECODE_PAIRS_ORDER[e] of the word."""
    from fp4ref.kernels.nvfp4_linear.decode import DECODE_PAIRS_ORDER

    dst = np.empty(K, np.int64)
    for base in range(0, K, 256):
        for q in range(4):
            for i in range(16):
                for j1 in range(2):
                    for j0 in range(2):
                        e = 4 * (i % 2) + 2 * j1 + j0
                        p = 64 * q + 8 * (i // 2) + DECODE_PAIRS_ORDER[e]
                        dst[base + p] = base + 16 * i + 8 * j1 + 2 * q + j0
    assert sorted(dst) == list(range(K))
    return dst


@pytest.mark.skipif(CUDA, reason="interpreter check (the GPU tests run the whole path)")
def test_quantizer_writes_the_permuted_k_order():
    M, K = 3, 512
    x = torch.from_numpy(np.random.default_rng(5).standard_normal((M, K)).astype(np.float32))
    dev = torch.device("cpu")
    outs = []
    for permute in (False, True):
        cfg = nvl.pick_quantize_config(M, K)
        q = QuantizeLaunches(M, K, cfg, write_packed=False, write_dequant=True, permute_k=permute)
        parts = torch.zeros(AMAX_MAX_PROGRAMS, dtype=torch.int32)
        gdec = torch.zeros(2, dtype=torch.float32)
        deq = torch.full((M * K,), float("nan"), dtype=torch.float16)
        q.run(0, x, parts, gdec, gdec, deq, gdec, 1.0)
        outs.append(deq.view(M, K).numpy())
    plain, permuted = outs
    assert not np.isnan(plain).any() and not np.isnan(permuted).any()
    want = np.empty_like(plain)
    want[:, _reference_permutation(K)] = plain
    np.testing.assert_array_equal(permuted.view(np.uint16), want.view(np.uint16))
    assert not np.array_equal(permuted, plain)  # the permutation is not the identity
    with pytest.raises(ValueError, match="256"):
        QuantizeLaunches(M, 128, nvl.pick_quantize_config(M, 128), False, True, permute_k=True)


@INTERPRETER_ONLY
def test_gluon_config_checks_and_model():
    with pytest.raises(ValueError, match="BN"):
        G(BN=128, BM=16, SPLIT_K=1, STAGES=3)  # 128 rows need 8 warps
    for bm in (512, 4, 100, 112, 0, -64, 264):
        with pytest.raises(ValueError, match="BM"):
            G(BN=64, BM=bm, SPLIT_K=1, STAGES=3)
    for bm in (True, 64.0, "64"):
        with pytest.raises(TypeError, match="BM"):
            G(BN=64, BM=bm, SPLIT_K=1, STAGES=3)
    with pytest.raises(ValueError, match="two wgmma parts"):
        G(BN=64, BM=96, SPLIT_K=2, STAGES=3)
    assert [gluon.m_parts(G(BN=64, BM=bm, SPLIT_K=1, STAGES=3).BM) for bm in (24, 48, 80, 96, 160, 192, 256)] == [
        (16, 8), (32, 16), (64, 16), (64, 32), (128, 32), (128, 64), (256, 0)]
    for xs in (1, -1):
        with pytest.raises(ValueError, match="X_STAGES"):
            G(BN=64, BM=16, SPLIT_K=1, STAGES=2, X_STAGES=xs)
    for bad in (dict(X_STAGES=2.0), dict(X_STAGES=True), dict(BN=64.0), dict(num_warps=4.0), dict(STAGES=3.0),
                dict(STAGES=True)):
        with pytest.raises(TypeError, match=next(iter(bad))):
            G(**{**dict(BN=64, BM=16, SPLIT_K=1, STAGES=2), **bad})
    for st in (1, 0):  # one message for both: an int >= 2
        with pytest.raises(ValueError, match=f"STAGES={st}: expected an int >= 2"):
            G(BN=64, BM=16, SPLIT_K=1, STAGES=st)
    with pytest.raises(TypeError, match="W_SWIZZLE"):
        G(BN=64, BM=16, SPLIT_K=1, STAGES=2, W_SWIZZLE=1)
    with pytest.raises(TypeError, match="EARLY_START"):
        G(BN=64, BM=16, SPLIT_K=1, STAGES=2, EARLY_START="no")
    with pytest.raises(TypeError, match="CLUSTER"):
        G(BN=64, BM=16, SPLIT_K=2, STAGES=2, CLUSTER=1)
    for sk in (1, 16):
        with pytest.raises(ValueError, match=f"SPLIT_K={sk}: CLUSTER"):
            G(BN=64, BM=16, SPLIT_K=sk, STAGES=2, CLUSTER=True)
    with pytest.raises(ValueError, match="static shared memory"):  # 7 slots of 128 x 32 fp32: 113 KiB
        G(BN=128, BM=32, SPLIT_K=8, STAGES=3, num_warps=8, X_STAGES=4, CLUSTER=True)
    # rings of 224 KiB fit alone, not beside a 33 KiB exchange buffer
    assert G(BN=64, BM=128, SPLIT_K=2, STAGES=3).shared_bytes == 3 * 64 * 144 + 3 * 128 * 512 + 24
    with pytest.raises(ValueError, match="227 KiB"):
        G(BN=64, BM=128, SPLIT_K=2, STAGES=3, CLUSTER=True)
    assert G(BN=64, BM=16, SPLIT_K=4, STAGES=4, CLUSTER=True).cluster_size == 4
    assert G(BN=64, BM=16, SPLIT_K=4, STAGES=4).cluster_size == 1 == G(BN=64, BM=16, SPLIT_K=1, STAGES=4).cluster_size
    assert G(BN=64, BM=8, SPLIT_K=4, STAGES=4).fits(8192, 8192)
    assert not G(BN=64, BM=8, SPLIT_K=4, STAGES=4).fits(8192, 768)  # 3 steps do not split in 4
    assert not G(BN=64, BM=8, SPLIT_K=1, STAGES=4).fits(8192, 8192 + 128)
    assert nvl.accumulation_model(G(BN=64, BM=8, SPLIT_K=4, STAGES=4), 8192) == "splitk(hopper_fp16_wgmma, 2048)"
    assert nvl.accumulation_model(G(BN=64, BM=64, SPLIT_K=1, STAGES=4), 8192) == "hopper_fp16_wgmma"
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="Gluon and DP4A paths run on CUDA"):
        nvl.nvfp4_linear(x, torch.zeros(64, 128, dtype=torch.uint8), torch.zeros(64, 16, dtype=torch.uint8), 1.0,
                         config=G(BN=64, BM=8, SPLIT_K=1, STAGES=2))


# ------------------------------------------------------------------------------------------------------- GPU
needs_gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (Hopper)")


@pytest.fixture(scope="module")
def weight():
    wq = ref_quantize(np.random.default_rng(99).standard_normal((2048, 8192), dtype=np.float32), recipe="sol")
    return wq, torch.from_numpy(wq.codes).cuda(), torch.from_numpy(wq.scales).view(torch.float8_e4m3fn).cuda()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("m, cfg", [(m, c) for m in (1, 5, 16, 32, 64, 100, 256) for c in TABLE + VARIANTS + CLUSTERED
                                    if m <= c.BM * 2 or c is nvl.pick_config(m, 2048, 8192, interpreter=False)])
def test_gluon_within_bound_and_deterministic(m, cfg, weight):
    wq, wc, ws = weight
    assert_within_bound_and_deterministic(cfg, *x_bf16(m, 8192, m), wq, wc, ws)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("m, cfg", [(m, c) for m in (257, 700) for c in TABLE[-2:] + VARIANTS[-2:]])
def test_gluon_large_m_within_bound_and_deterministic(m, cfg, weight):
    """The large-M tiles (x in its own ring of 64-K chunks) at M past one and two tiles of x rows."""
    test_gluon_within_bound_and_deterministic(m, cfg, weight)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("m, bm, x_stages", [(70, 80, 0), (96, 96, 0), (40, 48, 0), (150, 160, 6), (200, 192, 6),
                                             (300, 192, 6), (129, 136, 6)])
def test_gluon_two_part_x_tile_equals_the_power_of_two_tile(m, bm, x_stages, weight):
    """A two-part BM (two x boxes, two accumulators fed by the same decoded A fragments) gives the bits of the
    power-of-two tile: each output element sees the same wgmma K order whatever the tile's width. NaN-poisoned
    output and workspaces (``assert_within_bound_and_deterministic``), so every element is written and no padding
    row reaches one."""
    wq, wc, ws = weight
    x_np, x = x_bf16(m, 8192, m + bm)
    two = G(BN=64, BM=bm, SPLIT_K=1, STAGES=3, X_STAGES=x_stages)
    assert_within_bound_and_deterministic(two, x_np, x, wq, wc, ws)
    outs = []
    for cfg in (two, G(BN=64, BM=64, SPLIT_K=1, STAGES=4)):
        outs.append(torch.full((m, wc.shape[0]), float("nan"), dtype=torch.bfloat16, device="cuda"))
        nvl.nvfp4_linear(x, wc, ws, float(wq.global_decode_scale), config=cfg, out=outs[-1])
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("m, cfg", [(m, c) for c in CLUSTERED for m in (c.BM // 2 + 1, 2 * c.BM + 3)], ids=repr)
def test_gluon_cluster_reduction_has_the_workspace_bits(m, cfg, weight):
    """The cluster sum adds the K slices in the workspace reduction's order: bitwise the same output (NaN-poisoned
    outputs), with one and several x tiles."""
    wq, wc, ws = weight
    _, x = x_bf16(m, 8192, m + 11)
    twin = G(cfg.BN, cfg.BM, cfg.SPLIT_K, cfg.STAGES, num_warps=cfg.num_warps, X_STAGES=cfg.X_STAGES)
    outs = []
    for c in (cfg, twin):
        outs.append(torch.full((m, wc.shape[0]), float("nan"), dtype=torch.bfloat16, device="cuda"))
        nvl.nvfp4_linear(x, wc, ws, float(wq.global_decode_scale), config=c, out=outs[-1])
    assert not outs[0].isnan().any()
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


@pytest.mark.gpu
@needs_gpu
def test_gluon_ragged_tiles_and_one_step():
    """N not a multiple of BN, M not a multiple of BM (TMA zero-fill and clipped stores), one 256-K step."""
    rng = np.random.default_rng(31)
    for m, n, k, cfg in ((300, 1040, 512, TABLE[-1]), (129, 208, 256, TABLE[-1]), (1, 80, 256, TABLE[0]),
                         (40, 336, 768, VARIANTS[-1])):
        wq = ref_quantize(rng.standard_normal((n, k), dtype=np.float32), recipe="sol")
        cfg = cfg if cfg.fits(n, k) else G(cfg.BN, cfg.BM, 1, cfg.STAGES, num_warps=cfg.num_warps,
                                           X_STAGES=cfg.X_STAGES)
        assert_within_bound_and_deterministic(cfg, *x_bf16(m, k, n), wq, torch.from_numpy(wq.codes).cuda(),
                                              torch.from_numpy(wq.scales).cuda())


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("m", [1, 16, 64, 256, 512])
def test_gluon_exact_accumulation_is_correctly_rounded(m):
    """Integer-valued products whose fp32 (and wgmma) sums are exact: the output is the correctly rounded value
    (the Gluon config of CONFIGS' row for M, also where the DP4A path serves M)."""
    cfg = next((c for hi, c in nvl.CONFIGS.rows if isinstance(c, G) and m <= hi), nvl.CONFIGS.larger)
    assert_exact_accumulation_is_correctly_rounded(m, 7 + m, cfg)


# ------------------------------------------------------------------------------ the decode's PTX, run on the CPU
def test_decode_pairs_ptx_every_byte_and_scale():
    """DECODE_PAIRS_PTX on every byte value in every byte of the word and every E4M3 block scale the kernel can
    see (bytes 0x00-0x7E): output e is E2M1(code DECODE_PAIRS_ORDER[e]) * scale * 2^-8, bit for bit (exact in
    fp16), from fp4ref's E2M1 and E4M3FN tables."""
    from fp4ref import decode as ref_decode
    from fp4ref.kernels.nvfp4_linear.decode import DECODE_PAIRS_ORDER, DECODE_PAIRS_PTX

    rng = np.random.default_rng(11)
    words = []
    for byte in range(4):  # every value in each byte, random bytes around it
        w = rng.integers(0, 2**32, 256, dtype=np.uint64).astype(np.uint32)
        w = (w & np.uint32(~(0xFF << (8 * byte)) & 0xFFFFFFFF)) | (np.arange(256, dtype=np.uint32) << (8 * byte))
        words.append(w)
    words = np.concatenate(words)
    scale_bytes = np.arange(0x7F, dtype=np.uint8)
    w = np.repeat(words, len(scale_bytes))
    sb = np.tile(scale_bytes, len(words))
    scale = ref_decode(sb, "e4m3fn").astype(np.float64)
    s16 = (scale * 64.0).astype(np.float16)  # fp16(scale) * 2^6: exact for every E4M3 value
    assert np.array_equal(s16.astype(np.float64), scale * 64.0)
    out = _run_ptx(DECODE_PAIRS_PTX.value if hasattr(DECODE_PAIRS_PTX, "value") else DECODE_PAIRS_PTX,
                   {"$8": w, "$9": s16.view(np.uint16)})
    for e, code_index in enumerate(DECODE_PAIRS_ORDER):
        codes = ((w >> (4 * code_index)) & 0xF).astype(np.uint8)
        want = (ref_decode(codes, "e2m1").astype(np.float64) * scale * 2.0**-8).astype(np.float16)
        assert np.array_equal(want.astype(np.float64), ref_decode(codes, "e2m1").astype(np.float64) * scale * 2.0**-8)
        got = out[f"${e}"].astype(np.uint16)
        bad = np.flatnonzero(got != want.view(np.uint16))
        assert bad.size == 0, (f"output {e}: word {w[bad[0]]:#010x}, scale byte {sb[bad[0]]:#04x}: "
                               f"got {got[bad[0]]:#06x}, want {want.view(np.uint16)[bad[0]]:#06x}")
