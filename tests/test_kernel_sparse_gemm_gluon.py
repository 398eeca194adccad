"""The Gluon path of fp4ref.kernels.sparse_gemm_fp4_fp8 (``GluonConfig``: swap-AB fp8 wgmma, A decoded per step).

CPU CI: every Gluon config of the table (and the variants below) builds for sm_90 with fp8 wgmma (QGMMA), TMA
loads, no spills and no packed fp16 -> E4M3FN conversion; the promotion into fp32 is in the loop; configs, picks
and errors. GPU (marked gpu): every (vals byte, meta byte) pair, NaN selected vs pruned, ragged shapes, split-K,
several M tiles, the ring wrapping, against fp4ref's exact reference under the declared model with NaN-poisoned
outputs and workspaces; bitwise determinism. (fp4ref verify's exact-accumulation families run the default pick,
i.e. this path at M <= 256.)
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from fp4ref.bounds import get_model
from fp4ref.kernels import sparse_gemm_fp4_fp8 as mod
from fp4ref.kernels._sm90 import compile_for_sm90, gluon_tensordesc
from fp4ref.kernels.sparse_gemm_fp4_fp8.gluon import gluon_constexprs, shared_layouts, sparse_swapab_kernel
from _sm90_checks import assert_cluster_build, assert_gluon_build  # tests/_sm90_checks.py
from _sparse_gpu import assert_ok, b_bytes, check_any_bytes, random_operands, run_poisoned  # tests/_sparse_gpu.py

GluonConfig = mod.GluonConfig
ON_GPU = torch.cuda.is_available()
N, K = 2048, 2048
TABLE = [c for c in mod.CONFIGS.configs() if isinstance(c, GluonConfig)]
VARIANTS = [GluonConfig(64, 8, 2, 1), GluonConfig(64, 32, 6, 3), GluonConfig(128, 16, 3, 16),
            GluonConfig(64, 64, 4, 2, num_warps=4)]
CLUSTERED = [GluonConfig(64, 8, 5, 4, CLUSTER=True), GluonConfig(128, 8, 3, 8, CLUSTER=True),
             GluonConfig(128, 32, 5, 2, num_warps=8, CLUSTER=True)]


# ---------------------------------------------------------------------------------------------------------------
# CPU: builds, configs, picks, errors
# ---------------------------------------------------------------------------------------------------------------
def _build(cfg):
    fp8, raw = shared_layouts(cfg.cluster_size(K))
    sig = {"b_desc": gluon_tensordesc("fp8e4nv", [cfg.BLOCK_N, 128], fp8),
           "v_desc": gluon_tensordesc("i8", [cfg.BLOCK_M, 32], raw),
           "t_desc": gluon_tensordesc("i8", [cfg.BLOCK_M, 32], raw),
           "b_ptr": "*fp8e4nv", "vals_ptr": "*i8", "meta_ptr": "*i8", "c_ptr": "*bf16", "ws_ptr": "*fp32",
           "cnt_ptr": "*i32", "lut_ptr": "*i32", "M": "i32", "N": "i32", "k_steps": "i32", "stride_bn": "i32",
           "stride_am": "i32", "stride_cm": "i32"}
    return compile_for_sm90(sparse_swapab_kernel, sig, gluon_constexprs(cfg, K), num_warps=cfg.num_warps,
                            num_ctas=cfg.cluster_size(K),
                            divisible_by_16=["b_ptr", "vals_ptr", "meta_ptr", "c_ptr", "ws_ptr", "cnt_ptr", "lut_ptr",
                                             "N", "stride_bn", "stride_am", "stride_cm"])


@pytest.mark.parametrize("cfg", TABLE + VARIANTS, ids=repr)
def test_gluon_config_builds_for_sm90(cfg):
    ck = _build(cfg)
    info = assert_gluon_build(ck)
    ptx = ck.asm["ptx"]
    assert "e4m3.e4m3" in ptx  # fp8 x fp8 wgmma
    assert "e4m3x2.f16x2" not in ptx  # the decode uses integer arithmetic only (gluon.py)
    if info:
        assert info["qgmma"] > 0, info
    # the promotion: in the K loop every wgmma starts from a zero accumulator (useC false) and a retired step's
    # [BLOCK_N, BLOCK_M] result is added into the fp32 accumulator (arith.addf on the wgmma layout)
    loop = ck.asm["ttgir"].split("scf.for", 1)[1]
    assert re.search(r"ttng\.warp_group_dot [^\n]*, %false \{", loop)
    assert re.search(rf"arith.addf .*: tensor<{cfg.BLOCK_N}x{cfg.BLOCK_M}xf32, #mma", loop)


@pytest.mark.parametrize("cfg", CLUSTERED + [c for c in TABLE if c.CLUSTER and c not in CLUSTERED], ids=repr)
def test_cluster_config_builds_a_dsmem_reduction(cfg):
    """CLUSTER: the slices' accumulators summed in the first CTA of a cluster (``assert_cluster_build``)."""
    ck = _build(cfg)
    assert_cluster_build(ck, cfg.SPLIT_K, cfg.BLOCK_N * cfg.BLOCK_M, cfg.num_warps)


def test_cluster_config_rules():
    with pytest.raises(ValueError, match="SPLIT_K=3"):
        GluonConfig(SPLIT_K=3, CLUSTER=True)
    with pytest.raises(ValueError, match="SPLIT_K=16"):
        GluonConfig(SPLIT_K=16, CLUSTER=True)
    with pytest.raises(ValueError, match="static shared memory"):  # 7 slots of 128 x 32 fp32: 113 KiB
        GluonConfig(128, 32, 3, 8, num_warps=8, CLUSTER=True)
    with pytest.raises(TypeError, match="CLUSTER"):
        GluonConfig(SPLIT_K=2, CLUSTER=1)
    cfg = GluonConfig(64, 8, 3, 4, CLUSTER=True)
    assert cfg.cluster_size(512) == cfg.cluster_size(2048) == 4  # 4 or 16 steps: 4 slices
    # 3 steps: 3 slices; 5 steps: 3 slices of 2, 2, 1: the workspace reduction (the same sums)
    assert cfg.cluster_size(384) == cfg.cluster_size(640) == 1 and cfg.fits(384)
    assert GluonConfig(64, 8, 3, 4).cluster_size(2048) == 1
    # the exchange buffer (3 slots of 64 x 8 fp32 and the mbarrier, in whole KiB) counts only in a cluster
    assert cfg.shared_bytes(2048) == GluonConfig(64, 8, 3, 4).shared_bytes(2048) + 7 * 1024
    assert cfg.shared_bytes(640) == GluonConfig(64, 8, 3, 4).shared_bytes(640)


def test_decode_table_every_vals_byte_and_meta_nibble():
    """The 4096-entry table against an independent rule: E2M1 values from their bit fields, the E4M3FN byte of
    each position's exact sum from a decode of all 256 E4M3FN bytes (ml_dtypes), and two hand-derived words."""
    import ml_dtypes

    from fp4ref.kernels.sparse_gemm_fp4_fp8.gluon import decode_table

    table = decode_table(torch.device("cpu")).numpy().view(np.uint32)
    e4m3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    byte_of = {float(v): b for b, v in enumerate(e4m3) if np.isfinite(v) and b != 0x80}  # +0 for zero sums
    e2m1 = [(-1) ** (c >> 3) * ((c & 1) * 0.5 if (c >> 1) & 3 == 0 else (1 + (c & 1) / 2) * 2.0 ** (((c >> 1) & 3) - 1))
            for c in range(16)]
    for t in range(16):
        for v in range(256):
            pos = [0.0] * 4
            pos[t & 3] += e2m1[v & 15]
            pos[(t >> 2) & 3] += e2m1[v >> 4]
            want = sum(byte_of[p + 0.0] << (8 * j) for j, p in enumerate(pos))
            assert table[(t << 8) | v] == want, (t, v)
    assert table[(0x0D << 8) | 0x21] == 0x38003000  # 0.5 at position 1, 1.0 at position 3
    assert table[(0x00 << 8) | 0x22] == 0x00000040  # duplicate index 0: 1.0 + 1.0 = 2.0


def test_fits_bounds_the_shared_memory():
    assert GluonConfig(128, 8, 4, 8).fits(2048) and not GluonConfig(128, 8, 4, 8).fits(2052)
    big = GluonConfig(128, 64, 4, 1, num_warps=8)
    assert big.shared_bytes(2048) > 200 * 1024 and not big.fits(2048)
    assert mod.pick_config(16, N, 65536, interpreter=False) is mod.TL_CONFIGS.pick(16)  # a slice too long


def test_the_gpu_table_serves_m_3_to_32_with_gluon():
    for M in range(1, 65):
        cfg = mod.pick_config(M, N, K, interpreter=False)
        if M <= 2:  # the GEMV path (test_kernel_sparse_gemv.py)
            assert isinstance(cfg, mod.GemvConfig)
        elif M <= 8:  # K slices summed in a cluster
            assert isinstance(cfg, GluonConfig) and cfg.BLOCK_M >= M and cfg.fits(K) and cfg.CLUSTER
        elif M <= 32:  # one or two M tiles
            assert isinstance(cfg, GluonConfig) and 2 * cfg.BLOCK_M >= M and cfg.fits(K)
        else:  # the expand path's Gluon GEMM, 64 x 64 tiles
            assert cfg.gemm == "gluon" and (cfg.block_m, cfg.block_n) == (64, 64)
        assert mod.pick_config(M, N, K, interpreter=True) is mod.INTERPRETER_CONFIG
    # K not a multiple of 128: the `tl` table's row
    assert mod.pick_config(16, N, 2052, interpreter=False) is mod.TL_CONFIGS.pick(16)


@pytest.mark.parametrize("cfg", TABLE + VARIANTS, ids=repr)
def test_accumulation_model_is_the_promotion_every_128(cfg):
    name = mod.accumulation_model(cfg, K)
    assert name == "hopper_fp8_wgmma_promote(128)" == mod.NUMERIC_CONTRACT.model
    assert get_model(name).promote_every == 128


def test_k_split_never_launches_an_empty_slice():
    for S in range(1, 40):
        for steps in (1, 5, 15, 16, 17):
            per, slices = GluonConfig(SPLIT_K=S).k_split(steps * 128)
            assert (slices - 1) * per < steps <= slices * per and slices <= S


@pytest.mark.parametrize("kw, words", [
    (dict(BLOCK_M=128), "BLOCK_M=128"), (dict(BLOCK_M=24), "BLOCK_M=24"), (dict(BLOCK_N=256), "BLOCK_N=256"),
    (dict(num_warps=2), "num_warps=2"), (dict(BLOCK_N=64, num_warps=8), "BLOCK_N=64"), (dict(STAGES=1), "STAGES=1"),
    (dict(SPLIT_K=0), "SPLIT_K=0"), (dict(BLOCK_N=128, BLOCK_M=64, num_warps=4), "accumulator registers"),
])
def test_bad_configs_raise(kw, words):
    with pytest.raises(ValueError, match=words):
        GluonConfig(**kw)


def test_bad_config_types_raise():
    with pytest.raises(TypeError, match="STAGES"):
        GluonConfig(STAGES=2.0)
    with pytest.raises(TypeError, match="BLOCK_M"):
        GluonConfig(BLOCK_M=True)


@pytest.mark.skipif(ON_GPU, reason="CPU tensors / the interpreter")
def test_gluon_config_refused_off_the_gpu():
    v = torch.zeros(2, 32, dtype=torch.int8)
    b = torch.zeros(8, 128, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="Gluon path runs on CUDA"):
        mod.sparse_gemm_fp4_fp8(v, v.clone(), b, GluonConfig(BLOCK_M=8))


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (Hopper)")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cfg", [GluonConfig(128, 64, 4, 4, num_warps=8), GluonConfig(64, 32, 2, 1),
                                 GluonConfig(64, 16, 3, 4, CLUSTER=True)], ids=repr)
def test_every_vals_byte_with_every_meta_byte(cfg):
    """Row r, group g: vals byte g, meta byte r (all 65536 pairs, duplicate indices and bits 7:4 included)."""
    vals = np.tile(np.arange(256, dtype=np.uint8), (256, 1))
    meta = np.tile(np.arange(256, dtype=np.uint8)[:, None], (1, 256))
    rng = np.random.default_rng(1)
    b = b_bytes(rng, 200, 1024)
    assert_ok(run_poisoned(vals, meta, b, cfg), vals, meta, b)


@pytest.mark.gpu
@needs_gpu
def test_nan_selected_vs_pruned():
    """A NaN byte of b reaches c iff the metadata selects its position (also times a zero value); other tiles
    and other K slices stay on the fast path."""
    b = np.tile(np.array([0x38, 0x40, 0x48, 0x50], np.uint8), (128, 64))  # [128, 256]
    b[5, 1] = 0x7F  # NaN at group 0, position 1 of row n = 5
    vals = np.zeros((4, 64), np.uint8)
    meta = np.zeros((4, 64), np.uint8)
    vals[:, 0] = [0x21, 0x21, 0x00, 0x21]
    meta[:, 0] = [0x0D, 0x0E, 0x04, 0x08]  # selects {1,3}, {2,3}, {0,1} (values 0), {0,2}
    vals[:, 63] = 0x22  # 1.0 and 1.0 at positions 0 and 2 of the last group (another K slice): + (1 + 4)
    meta[:, 1:] = 0x08
    for cfg in (GluonConfig(64, 8, 2, 1), GluonConfig(64, 8, 2, 2), GluonConfig(128, 8, 4, 1),
                GluonConfig(64, 8, 2, 2, CLUSTER=True)):
        c = run_poisoned(vals, meta, b, cfg).float().numpy()
        rest = 5.0
        assert np.isnan(c[0, 5]) and np.isnan(c[2, 5])
        assert c[1, 5] == 0.5 * 4 + 1.0 * 8 + rest and c[3, 5] == 0.5 * 1 + 1.0 * 4 + rest
        assert c[0, 4] == 0.5 * 2 + 1.0 * 8 + rest and not np.isnan(np.delete(c, 5, axis=1)).any()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M, n, k, cfg", [
    (1, 2048, 2048, GluonConfig(128, 8, 4, 8)),
    (5, 200, 384, GluonConfig(64, 8, 2, 1)),  # N tail; 3 steps through a 2-deep ring
    (13, 136, 1280, GluonConfig(128, 16, 3, 3, num_warps=8)),  # split-K with a shorter last slice
    (100, 520, 2048, GluonConfig(64, 32, 4, 4)),  # 4 M tiles
    (200, 256, 4096, GluonConfig(128, 64, 4, 4, num_warps=8)),  # M tail in the last M tile, 8 steps per slice
    (256, 2048, 2048, GluonConfig(64, 64, 3, 2, num_warps=4)),
    (13, 136, 1280, GluonConfig(64, 16, 6, 2, CLUSTER=True)),  # clusters of 2, 5 steps each, N tail
    (100, 520, 2048, GluonConfig(64, 16, 3, 8, CLUSTER=True)),  # clusters of 8, 7 M tiles
    (5, 200, 640, GluonConfig(64, 8, 3, 4, CLUSTER=True)),  # 5 steps, 3 slices: the workspace reduction
])
def test_shapes_any_bytes_and_nan(M, n, k, cfg):
    check_any_bytes(M, n, k, cfg, 2e-4)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M, n, k, bn, bm, split", [
    (7, 2048, 2048, 64, 8, 4), (16, 392, 1024, 64, 16, 8), (40, 264, 768, 64, 64, 2),
    (12, 2048, 2048, 128, 16, 4),  # the table's M = 9-16 row: 128 columns, one warpgroup
    (29, 2048, 2048, 64, 16, 2),  # the table's M = 17-32 row: two 16-row M tiles
])
def test_cluster_reduction_has_the_workspace_bits(M, n, k, bn, bm, split):
    """The DSMEM sum adds the slices in the workspace reduction's order: bitwise the same c, NaN tiles (whose
    slices are recomputed on CUDA cores) included."""
    rng = np.random.default_rng(M)
    vals = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    meta = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    b = b_bytes(rng, n, k, nan_rate=1e-4)
    want = run_poisoned(vals, meta, b, GluonConfig(bn, bm, 3, split))
    got = run_poisoned(vals, meta, b, GluonConfig(bn, bm, 3, split, CLUSTER=True))
    assert torch.isnan(got).any()  # selected NaN bytes (233-1213 NaN outputs in the exact reference at these seeds)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@needs_gpu
def test_default_pick_and_fallbacks_on_the_gpu():
    """The default pick is the Gluon path at M <= 16; operands its descriptors cannot read (a strided b, an
    unaligned A view) and K % 128 != 0 take the `tl` row with the same results."""
    M, n, k = 12, 256, 512
    (vals, meta, b), (v, t, bb) = random_operands(3, M, n, k)
    want = mod.sparse_gemm_fp4_fp8(v, t, bb).cpu()
    assert_ok(want, vals, meta, b)
    wide = torch.zeros(n, 2 * k, dtype=torch.uint8, device="cuda")
    wide[:, 1::2] = bb.view(torch.uint8)  # b with stride 2 along K: not a TMA operand
    got = mod.sparse_gemm_fp4_fp8(v, t, wide[:, 1::2].view(torch.float8_e4m3fn)).cpu()
    assert_ok(got, vals, meta, b)
    with pytest.raises(ValueError, match="gluon_eligible"):
        mod.sparse_gemm_fp4_fp8(v, t, wide[:, 1::2].view(torch.float8_e4m3fn), GluonConfig(BLOCK_M=32))
    with pytest.raises(ValueError, match="K % 128"):
        mod.sparse_gemm_fp4_fp8(v[:, :127], t[:, :127], bb[:, :508], GluonConfig(BLOCK_M=32))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M", [8, 16, 32])
def test_an_output_without_unit_column_stride_takes_the_tl_row(M):
    """The Gluon kernel stores c[m, n] at m * stride_cm + n: an ``out`` with another column stride (a transposed
    buffer, every other column of a wider one) takes the `tl` row in the default pick, with every element written
    and the contiguous output's values, and an explicit GluonConfig refuses it; the columns between are untouched."""
    n, k = 256, 512
    (vals, meta, b), (v, t, bb) = random_operands(M, M, n, k)
    want = mod.sparse_gemm_fp4_fp8(v, t, bb).cpu()
    assert_ok(want, vals, meta, b)
    transposed = torch.full((n, M), float("nan"), dtype=torch.bfloat16, device="cuda").t()
    wide = torch.full((M, 2 * n), float("nan"), dtype=torch.bfloat16, device="cuda")
    for out in (transposed, wide[:, ::2]):
        assert mod.sparse_gemm_fp4_fp8(v, t, bb, out=out) is out
        assert_ok(out.cpu(), vals, meta, b)
    assert torch.isnan(wide[:, 1::2]).all()
    with pytest.raises(ValueError, match="unit column stride"):
        mod.sparse_gemm_fp4_fp8(v, t, bb, GluonConfig(BLOCK_M=16), out=transposed)
