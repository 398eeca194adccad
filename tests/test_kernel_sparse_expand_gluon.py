"""The expand path's Gluon GEMM of fp4ref.kernels.sparse_gemm_fp4_fp8 (``ExpandConfig(gemm="gluon")``: decode
pre-pass, then a persistent warp-specialized fp8 wgmma GEMM over the dense E4M3FN A).

CPU CI: every such config of the table (and the variants below) builds for sm_90 with fp8 wgmma (QGMMA), TMA
loads and a TMA store, a producer partition (setmaxnreg), no spills and no ptxas advisory; the promotion (a fresh
accumulator per 128-K step added into fp32) is in the loop; configs, picks and errors. GPU (marked gpu): any
bytes, ragged M and N, one and several K steps (odd and even), several tiles per persistent CTA, NaN bytes of b
selected and pruned, against fp4ref's exact reference under the declared model with NaN-poisoned outputs and
dense-A workspace, the exact NaN pattern; bitwise determinism.
"""
from __future__ import annotations

import re

import pytest
import torch

from fp4ref.kernels import sparse_gemm_fp4_fp8 as mod
from fp4ref.kernels._sm90 import compile_for_sm90, gluon_tensordesc
from fp4ref.kernels.sparse_gemm_fp4_fp8.expand_gluon import (expand_gluon_constexprs, expand_gluon_layouts,
                                                              sparse_expanded_ws_kernel)
from _sm90_checks import assert_gluon_build  # tests/_sm90_checks.py
from _sparse_gpu import (assert_nan_selected_vs_pruned, assert_ok, check_any_bytes,  # tests/_sparse_gpu.py
                         random_operands)

ExpandConfig = mod.ExpandConfig
ON_GPU = torch.cuda.is_available()
NAN = float("nan")
N, K = 2048, 2048


def XG(bm, bn, stages, group_m=8):
    return ExpandConfig(bm, bn, 128, group_m=group_m, num_warps=bm // 16, num_stages=stages, nan_fixup="inline",
                        gemm="gluon")


TABLE = [c for c in mod.CONFIGS.configs() if isinstance(c, ExpandConfig) and c.gemm == "gluon"]
VARIANTS = [XG(64, 64, 2), XG(128, 64, 3), XG(64, 128, 4), XG(128, 128, 6)]


# ---------------------------------------------------------------------------------------------------------------
# CPU: builds, configs, picks, errors
# ---------------------------------------------------------------------------------------------------------------
def _build(cfg, pdl=False):
    fp8, c = expand_gluon_layouts(cfg)
    sig = {"a_desc": gluon_tensordesc("fp8e4nv", [cfg.block_m, 128], fp8),
           "b_desc": gluon_tensordesc("fp8e4nv", [cfg.block_n, 128], fp8),
           "c_desc": gluon_tensordesc("bf16", [cfg.block_m, cfg.block_n], c),
           "b_ptr": "*fp8e4nv", "vals_ptr": "*i8", "meta_ptr": "*i8", "c_ptr": "*bf16", "M": "i32", "N": "i32",
           "k_steps": "i32", "stride_bn": "i32", "stride_am": "i32", "stride_cm": "i32"}
    return compile_for_sm90(sparse_expanded_ws_kernel, sig, expand_gluon_constexprs(cfg, pdl), num_warps=cfg.num_warps,
                            divisible_by_16=["b_ptr", "vals_ptr", "meta_ptr", "c_ptr", "N", "stride_bn", "stride_am",
                                             "stride_cm"])


def test_the_table_serves_m_above_32_with_the_gluon_gemm():
    assert TABLE, "no Gluon-GEMM expand config in CONFIGS"
    for M in (33, 64, 65, 100, 256, 1024, 4096, 8192, 1 << 20):
        cfg = mod.pick_config(M, N, K, interpreter=False)
        assert isinstance(cfg, ExpandConfig) and cfg.gemm == "gluon", (M, cfg)
        # K not a multiple of 128: the `tl` table's row; the interpreter: its own config
        assert mod.pick_config(M, N, 2064, interpreter=False) is mod.TL_CONFIGS.pick(M)
        assert mod.pick_config(M, N, K, interpreter=True) is mod.INTERPRETER_CONFIG
    assert all(c.gemm == "tl" for c in mod.TL_CONFIGS.configs() if isinstance(c, ExpandConfig))


@pytest.mark.parametrize("cfg", TABLE + VARIANTS, ids=repr)
def test_config_builds_for_sm90(cfg):
    ck = _build(cfg)
    info = assert_gluon_build(ck)
    ptx, ttgir = ck.asm["ptx"], ck.asm["ttgir"]
    assert "e4m3.e4m3" in ptx  # fp8 x fp8 wgmma
    assert "setmaxnreg" in ptx  # the producer partition gives its registers to the consumer warpgroups
    assert "cp.async.bulk.tensor.2d.global.shared" in ptx  # the TMA store of c
    if info:
        assert info["qgmma"] > 0, info
    assert ck.metadata.shared <= cfg.shared_bytes + 1024  # the configs' own count (checked against 227 KiB)
    # the promotion: in a K loop every wgmma starts from a zero accumulator (useC false) and a retired step's
    # [block_m, block_n] result is added into the fp32 accumulator (arith.addf on the wgmma layout)
    dots = re.findall(r"ttng\.warp_group_dot [^\n]*", ttgir)
    assert dots and all(re.search(r"%\w+, %false \{", d) for d in dots), dots
    assert re.search(rf"arith.addf .*: tensor<{cfg.block_m}x{cfg.block_n}xf32, #mma", ttgir)


@pytest.mark.parametrize("cfg", [TABLE[0], TABLE[-1]], ids=repr)
def test_pdl_build_loads_b_before_the_wait_and_a_after(cfg):
    """Under programmatic dependent launch the producer sends the first num_stages b tiles before
    griddepcontrol.wait and no A tile (the pre-pass writes A); the A tiles of those steps follow the wait. Without
    PDL there is no wait."""
    ptx = _build(cfg, pdl=True).asm["ptx"]
    # the A descriptor: kernel parameter 0, its address taken into a register for the TMA copies
    param = re.search(r"mov\.b64\s+(%rd\d+), sparse_expanded_ws_kernel_param_0;", ptx).group(1)
    a_desc = re.search(rf"cvta\.param\.u64\s+(%rd\d+), {param};", ptx).group(1)
    loads = r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\S* \[%r\d+\], \[(%rd\d+),"
    assert ptx.count("griddepcontrol.wait") == 1
    before, after = ptx.split("griddepcontrol.wait")
    pre, post = re.findall(loads, before), re.findall(loads, after)
    assert len(pre) == cfg.num_stages and a_desc not in pre  # b only
    assert post[:cfg.num_stages] == [a_desc] * cfg.num_stages  # then A of the same steps
    assert set(post) == {a_desc, pre[0]}  # the loop: both
    assert "griddepcontrol" not in _build(cfg).asm["ptx"]


def test_accumulation_model_is_the_promotion_every_128():
    for cfg in TABLE + VARIANTS:
        assert mod.accumulation_model(cfg, K) == "hopper_fp8_wgmma_promote(128)" == mod.NUMERIC_CONTRACT.model


@pytest.mark.parametrize("kw, words", [
    (dict(block_k=64), "block_k=64"), (dict(n_split=2), "n_split=2"), (dict(programs_per_sm=2), "programs_per_sm"),
    (dict(nan_fixup="launch"), "nan_fixup"), (dict(num_warps=4), "num_warps=4"), (dict(block_n=256), "block_n=256"),
    (dict(num_stages=1), "num_stages=1"), (dict(num_stages=8), "shared memory"), (dict(gemm="cuda"), "gemm"),
])
def test_bad_configs_raise(kw, words):
    base = dict(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4, nan_fixup="inline", gemm="gluon")
    with pytest.raises(ValueError, match=words):
        ExpandConfig(**{**base, **kw})
    with pytest.raises(TypeError, match="num_stages"):
        ExpandConfig(**{**base, "num_stages": 4.0})


@pytest.mark.skipif(ON_GPU, reason="CPU tensors / the interpreter")
def test_refused_off_the_gpu():
    v = torch.zeros(2, 32, dtype=torch.int8)
    b = torch.zeros(8, 128, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="Gluon GEMM runs on CUDA"):
        mod.sparse_gemm_fp4_fp8(v, v.clone(), b, XG(64, 64, 2))


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (Hopper)")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M, n, k, cfg", [
    (65, 136, 128, XG(64, 64, 2)),  # one K step; M and N tails
    (130, 200, 384, XG(128, 128, 2)),  # 3 steps (odd) through a 2-deep ring; M tail of 2 rows
    (300, 520, 1024, XG(128, 64, 3)),  # 8 steps (even); 27 tiles
    (1000, 2048, 2048, XG(64, 128, 6)),  # 256 tiles: two per persistent CTA
    (2053, 2048, 2048, XG(128, 128, 5, group_m=16)),  # 17 x 16 tiles, ragged last group
])
def test_shapes_any_bytes_and_nan(M, n, k, cfg):
    check_any_bytes(M, n, k, cfg, 40 / (n * k))  # about 40 NaN bytes: some columns NaN in the rows that select them


@pytest.mark.gpu
@needs_gpu
def test_nan_selected_vs_pruned():
    """A NaN byte of b reaches c iff the metadata selects its position (_sparse_gpu.py)."""
    assert_nan_selected_vs_pruned((XG(64, 64, 2), XG(128, 128, 3)), n=192)


@pytest.mark.gpu
@needs_gpu
def test_default_pick_and_fallbacks_on_the_gpu():
    """At M > 64 the default pick is the Gluon GEMM; an output its TMA store cannot write (a column view) and
    K % 128 != 0 take the `tl` row with results within the same model; an explicit config refuses them."""
    M, n, k = 100, 256, 512
    (vals, meta, b), (v, t, bb) = random_operands(3, M, n, k)
    assert_ok(mod.sparse_gemm_fp4_fp8(v, t, bb).cpu(), vals, meta, b)
    wide = torch.full((M, 2 * n), NAN, dtype=torch.bfloat16, device="cuda")
    got = mod.sparse_gemm_fp4_fp8(v, t, bb, out=wide[:, 1::2])  # column stride 2
    assert_ok(got.cpu(), vals, meta, b)
    assert torch.isnan(wide[:, 0::2]).all()  # nothing written beside the view
    with pytest.raises(ValueError, match="Gluon GEMM needs"):
        mod.sparse_gemm_fp4_fp8(v, t, bb, XG(64, 64, 2), out=wide[:, 1::2])
    with pytest.raises(ValueError, match="Gluon GEMM needs"):
        mod.sparse_gemm_fp4_fp8(v[:, :124], t[:, :124], bb[:, :496], XG(64, 64, 2))
    got = mod.sparse_gemm_fp4_fp8(v[:, :124], t[:, :124], bb[:, :496]).cpu()
    assert_ok(got, vals[:, :124], meta[:, :124], b[:, :496])

