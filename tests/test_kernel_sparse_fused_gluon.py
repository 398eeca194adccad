"""The fused Gluon path of fp4ref.kernels.sparse_gemm_fp4_fp8 (``FusedWSConfig``: one persistent,
warp-specialized launch; a decoder partition turns (vals, meta) into the dense E4M3FN A tile in shared memory).

CPU CI: every such config of the table (and the variants below) builds for sm_90 with fp8 wgmma (QGMMA), TMA
loads, a 4-warp decoder and a 1-warp producer partition (setmaxnreg, named barrier of 128 threads), no spills and
no ptxas advisory; the promotion (a fresh accumulator per 128-K step added into fp32) is in the loop; configs,
picks and errors. GPU (marked gpu): the decode of every (vals, meta) byte pair against fp4ref's
decompress_2to4 (b = identity), any bytes, ragged M and N, one and several K steps (odd and even), several
tiles per persistent CTA, both epilogues (TMA store, register store), NaN bytes of b selected and pruned, against
fp4ref's exact reference under the declared model with NaN-poisoned outputs; the exact NaN pattern; bitwise
determinism.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from fp4ref.kernels import sparse_gemm_fp4_fp8 as mod
from fp4ref.kernels._sm90 import compile_for_sm90, gluon_tensordesc
from fp4ref.kernels.sparse_gemm_fp4_fp8.fused_gluon import (fused_ws_constexprs, fused_ws_layouts,
                                                             sparse_fused_ws_kernel)
from fp4ref.packing import decompress_2to4
from _sm90_checks import assert_gluon_build  # tests/_sm90_checks.py
from _sparse_gpu import (assert_nan_selected_vs_pruned, assert_ok, check_any_bytes,  # tests/_sparse_gpu.py
                         random_operands, run_poisoned)

FusedWSConfig = mod.FusedWSConfig
ON_GPU = torch.cuda.is_available()
NAN = float("nan")
N, K = 2048, 2048

# an opt-in path (config=FusedWSConfig(...)): the tuned table does not pick it (docs/benchmarks.md)
VARIANTS = [FusedWSConfig(), FusedWSConfig(b_stages=5, a_stages=3), FusedWSConfig(b_stages=2, a_stages=2),
            FusedWSConfig(block_n=128, num_warps=4, b_stages=8, a_stages=4)]


# ---------------------------------------------------------------------------------------------------------------
# CPU: builds, configs, picks, errors
# ---------------------------------------------------------------------------------------------------------------
def _build(cfg):
    fp8, raw, c = fused_ws_layouts(cfg)
    sig = {"v_desc": gluon_tensordesc("i8", [cfg.block_m, 32], raw),
           "t_desc": gluon_tensordesc("i8", [cfg.block_m, 32], raw),
           "b_desc": gluon_tensordesc("fp8e4nv", [cfg.block_n, 128], fp8),
           "c_desc": gluon_tensordesc("bf16", [cfg.block_m, cfg.block_n], c),
           "b_ptr": "*fp8e4nv", "vals_ptr": "*i8", "meta_ptr": "*i8", "c_ptr": "*bf16", "M": "i32", "N": "i32",
           "k_steps": "i32", "stride_bn": "i32", "stride_am": "i32", "stride_cm": "i32"}
    return compile_for_sm90(sparse_fused_ws_kernel, sig, fused_ws_constexprs(cfg), num_warps=cfg.num_warps,
                            divisible_by_16=["b_ptr", "vals_ptr", "meta_ptr", "c_ptr", "N", "stride_bn", "stride_am",
                                             "stride_cm"])


@pytest.mark.parametrize("cfg", VARIANTS, ids=repr)
def test_config_builds_for_sm90(cfg):
    ck = _build(cfg)
    info = assert_gluon_build(ck)
    ptx, ttgir = ck.asm["ptx"], ck.asm["ttgir"]
    assert "e4m3.e4m3" in ptx  # fp8 x fp8 wgmma
    assert "setmaxnreg" in ptx  # the worker partitions give their registers to the consumer warpgroups
    assert re.search(r"bar\.sync\s+\d+, 128;", ptx)  # the decoder's own barrier (4 warps), not the CTA's
    assert "cvt.rn.satfinite.e4m3x2.f16x2" in ptx and "prmt.b32" in ptx  # the decode instructions
    assert ("cp.async.bulk.tensor.2d.global.shared" in ptx) == cfg.tma_store  # the TMA store of c, if any
    if info:
        assert info["qgmma"] > 0, info
    assert ck.metadata.shared <= cfg.shared_bytes + 1024  # the config's own count (checked against 227 KiB)
    dots = re.findall(r"ttng\.warp_group_dot [^\n]*", ttgir)
    assert dots and all(re.search(r"%\w+, %false \{", d) for d in dots), dots
    assert re.search(rf"arith.addf .*: tensor<{cfg.block_m}x{cfg.block_n}xf32, #mma", ttgir)


def _group_ptx_model(v, t):
    """fused_gluon._group_ptx, instruction by instruction, in numpy (float16 and E4M3FN with IEEE RNE): the word
    of a group's four E4M3FN bytes for vals bytes v and meta bytes t (uint32 arrays)."""
    import ml_dtypes

    u = v * 4097
    x = ((u << 9) & 0x0E000E00) | ((u << 12) & 0x80008000)
    f16 = lambda bits: (bits & 0xFFFF).astype(np.uint16).view(np.float16)  # noqa: E731
    e4m3 = lambda h: h.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).astype(np.uint32)  # noqa: E731
    two14 = np.float16(16384.0)
    lo = f16(x) * two14 + np.float16(0.0)  # fma.rn.f16x2 by 2^14, + 0 (exact; -0 becomes +0)
    hi = f16(x >> 16) * two14 + np.float16(0.0)
    src = [e4m3(lo), e4m3(hi), 0, 0, 0, e4m3(lo + hi), 0, 0]  # prmt's 8 source bytes: [e0, e1, 0, 0] and [0, es]
    k = 0x4444 ^ (4 << ((t << 2) & 12)) ^ (5 << (t & 12))
    word = np.zeros_like(v)
    for p in range(4):
        sel = (k >> (4 * p)) & 7
        byte = sum(np.where(sel == i, src[i], 0) for i in range(8))
        word |= (byte.astype(np.uint32) & 0xFF) << (8 * p)
    return word


def test_the_decode_instructions_give_every_group_exactly():
    """The decoder's PTX, modelled instruction by instruction, against fp4ref.packing.decompress_2to4 on all
    65536 (vals, meta) byte pairs (meta bits 7:4 never read; duplicate indices add; zeros +0). The GPU test below
    runs the real instructions on the same pairs."""
    import ml_dtypes

    pairs = np.arange(65536, dtype=np.uint32)
    v, t = pairs & 255, pairs >> 8
    dense = decompress_2to4(v.astype(np.uint8)[:, None], t.astype(np.uint8)[:, None]) + 0.0  # -0 -> +0
    want = np.ascontiguousarray(dense.astype(ml_dtypes.float8_e4m3fn)).view("<u4").reshape(-1)
    got = _group_ptx_model(v, t & 15)  # bfe takes meta bits 3:0
    np.testing.assert_array_equal(got, want)
    assert (want != 0).sum() > 50000  # not a trivially zero comparison


def test_accumulation_model_is_the_promotion_every_128():
    for cfg in VARIANTS:
        assert mod.accumulation_model(cfg, K) == "hopper_fp8_wgmma_promote(128)" == mod.NUMERIC_CONTRACT.model


def test_shared_memory_and_the_epilogue_choice():
    # 4 b slots of 36 KiB and 3 decoded-A slots of 8 KiB leave room for the 32 KiB c tile; 5 b slots do not
    assert FusedWSConfig().tma_store and not FusedWSConfig(b_stages=5, a_stages=3).tma_store
    for cfg in VARIANTS:
        assert cfg.shared_bytes <= 227 * 1024


@pytest.mark.parametrize("kw, words", [
    (dict(block_m=128), "block_m=128"), (dict(block_n=64, num_warps=2), "block_n=64"),
    (dict(num_warps=4), "num_warps=4"), (dict(b_stages=1, a_stages=1), "b_stages=1"),
    (dict(a_stages=5), "a_stages=5"), (dict(a_stages=1), "a_stages=1"), (dict(group_m=0), "group_m=0"),
    (dict(b_stages=6, a_stages=3), "227 KiB"),
])
def test_bad_configs_raise(kw, words):
    with pytest.raises(ValueError, match=words):
        FusedWSConfig(**kw)
    with pytest.raises(TypeError, match="b_stages"):
        FusedWSConfig(b_stages=4.0)


@pytest.mark.skipif(ON_GPU, reason="CPU tensors / the interpreter")
def test_refused_off_the_gpu():
    v = torch.zeros(2, 32, dtype=torch.int8)
    b = torch.zeros(8, 128, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="fused Gluon kernel runs on CUDA"):
        mod.sparse_gemm_fp4_fp8(v, v.clone(), b, FusedWSConfig())


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (Hopper)")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cfg", VARIANTS, ids=repr)
def test_every_byte_pair_decodes_exactly(cfg):
    """All 65536 (vals, meta) byte pairs (a 512 x 512 A) against b = I: c is the decoded A itself (one exact
    product per element), which must equal fp4ref.packing.decompress_2to4 element for element (duplicate indices
    add, zeros +0 or -0 alike)."""
    pairs = np.arange(65536)
    vals = (pairs & 255).astype(np.uint8).reshape(512, 128)
    meta = (pairs >> 8).astype(np.uint8).reshape(512, 128)
    eye = np.zeros((512, 512), np.uint8)
    eye[np.arange(512), np.arange(512)] = 0x38  # E4M3FN 1.0
    c = run_poisoned(vals, meta, eye, cfg).float().numpy()
    np.testing.assert_array_equal(c, decompress_2to4(vals, meta).astype(np.float32))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M, n, k, cfg", [
    (65, 136, 128, FusedWSConfig()),  # one K step; M and N tails; register-free tile tails
    (130, 264, 384, FusedWSConfig(b_stages=2, a_stages=2)),  # 3 steps (odd) through 2-deep rings
    (300, 520, 1024, FusedWSConfig(block_n=128, num_warps=4, b_stages=8, a_stages=4)),  # 8 steps (even)
    (1000, 2048, 2048, FusedWSConfig(b_stages=5, a_stages=3)),  # register-store epilogue; several tiles per CTA
    (2053, 2048, 2048, FusedWSConfig(group_m=16)),  # 33 x 8 tiles, ragged last group
])
def test_shapes_any_bytes_and_nan(M, n, k, cfg):
    check_any_bytes(M, n, k, cfg, 40 / (n * k))  # about 40 NaN bytes: some columns NaN in the rows that select them


@pytest.mark.gpu
@needs_gpu
def test_nan_selected_vs_pruned():
    """A NaN byte of b reaches c iff the metadata selects its position (_sparse_gpu.py)."""
    assert_nan_selected_vs_pruned((FusedWSConfig(), FusedWSConfig(b_stages=5, a_stages=3)), n=320)


@pytest.mark.gpu
@needs_gpu
def test_refusals_on_the_gpu():
    """An output its TMA descriptor cannot take (a column view) and K % 128 != 0 are refused, naming what it
    needs; the same call through the default pick runs."""
    M, n, k = 100, 256, 512
    (vals, meta, b), (v, t, bb) = random_operands(5, M, n, k)
    wide = torch.full((M, 2 * n), NAN, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="fused Gluon kernel needs"):
        mod.sparse_gemm_fp4_fp8(v, t, bb, FusedWSConfig(), out=wide[:, 1::2])
    with pytest.raises(ValueError, match="fused Gluon kernel needs"):
        mod.sparse_gemm_fp4_fp8(v[:, :124], t[:, :124], bb[:, :496], FusedWSConfig())
    assert torch.isnan(wide).all()  # nothing written
    assert_ok(mod.sparse_gemm_fp4_fp8(v, t, bb, out=wide[:, 1::2]).cpu(), vals, meta, b)
