"""The GEMV path of fp4ref.kernels.sparse_gemm_fp4_fp8 (``GemvConfig``: CUDA cores, every row of A per program,
b read as int32 words, no split-K).

CPU CI (the kernel is a `tl` kernel: the interpreter runs it): the decode of every vals byte with every meta nibble
against fp4ref's decompress_2to4 (b = identity); ragged M, N and K, strided operands and output, against fp4ref's
exact reference under the config's own model (``fp32_rn``, faithful interpreter stores); NaN bytes of b reach c
iff selected; config and call errors; the pick; the sm_90 build of the table's configs (no spills, no tensor-core
instructions). GPU (marked gpu): all 65536 (vals, meta) byte pairs, any bytes and NaN bytes under ``fp32_rn``
with RNE outputs into NaN-poisoned buffers, bitwise determinism, NaN selected vs pruned, fallbacks.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from fp4ref import bounds
from fp4ref.gemm import sparse_gemm_fp4_fp8 as reference
from fp4ref.kernels import _runtime
from fp4ref.kernels import sparse_gemm_fp4_fp8 as mod
from fp4ref.kernels._sm90 import SM90_MAX_SHARED_BYTES, compile_for_sm90, ptxas_advisories, sass_info
from fp4ref.kernels.sparse_gemm_fp4_fp8.gemv import sparse_gemv_kernel
from fp4ref.packing import decompress_2to4
from _sparse_gpu import b_bytes, run_poisoned  # tests/_sparse_gpu.py
from _marks import INTERPRETER_ONLY  # tests/_marks.py

GemvConfig = mod.GemvConfig
ON_GPU = torch.cuda.is_available()
NAN = float("nan")
TABLE = [c for c in mod.CONFIGS.configs() if isinstance(c, GemvConfig)]
SMALL = GemvConfig(block_n=8, block_g=32, num_warps=2)  # max_m 8; several chunks and programs at small K, N


def _bf16(c: torch.Tensor) -> np.ndarray:
    return c.view(torch.int16).numpy().view(ml_dtypes.bfloat16)


def _run_cpu(vals, meta, b, cfg, out=None, **kw):
    """The GEMV path in the interpreter on numpy bytes (uint8 vals / meta [M, G], b [N, K]) into a NaN-filled
    output (or ``out``); returns the output tensor."""
    v = torch.from_numpy(np.ascontiguousarray(vals).view(np.int8))
    t = torch.from_numpy(np.ascontiguousarray(meta).view(np.int8))
    bb = torch.from_numpy(np.ascontiguousarray(b)).view(torch.float8_e4m3fn)
    if out is None:
        out = torch.full((v.shape[0], bb.shape[0]), NAN, dtype=torch.bfloat16)
    assert mod.sparse_gemm_fp4_fp8(v, t, bb, cfg, out=out, **kw) is out
    return out


needs_interpreter = pytest.mark.skipif(not _runtime.interpreting(), reason="runs the `tl` kernel interpreted")


# ---------------------------------------------------------------------------------------------------------------
# CPU: configs, picks, errors, builds
# ---------------------------------------------------------------------------------------------------------------
def test_the_table_serves_m_up_to_2_with_the_gemv_path():
    assert TABLE, "no GemvConfig in CONFIGS"
    assert _table_block_ms()[:2] == [(mod.CONFIGS.pick(1), 1), (mod.CONFIGS.pick(2), 2)]
    for M in (1, 2):
        cfg = mod.pick_config(M, 2048, 2048, interpreter=False)
        assert isinstance(cfg, GemvConfig) and M <= cfg.max_m
        assert mod.pick_config(M, 2048, 2048, interpreter=True) is mod.INTERPRETER_CONFIG
    assert not isinstance(mod.pick_config(3, 2048, 2048, interpreter=False), GemvConfig)
    assert GemvConfig() == GemvConfig(block_n=4, block_g=128, num_warps=4) and GemvConfig().max_m == 8


def test_accumulation_model_is_fp32_within_the_contract():
    assert mod.accumulation_model(SMALL, 2048) == "fp32_rn"
    for K in (4, 2048, 8192):
        assert bounds.get_model("fp32_rn").eps(K) <= bounds.get_model(mod.NUMERIC_CONTRACT.model).eps(K)


@pytest.mark.parametrize("block_n, block_g, num_warps, max_m", [
    (4, 128, 4, 8), (8, 32, 2, 8), (64, 512, 8, 0), (1, 16, 1, 64), (2, 256, 2, 4), (16, 16, 4, 16)])
def test_max_m_is_the_register_budget(block_n, block_g, num_warps, max_m):
    """max_m: the largest power of two m with m x block_n x block_g <= 32 x 32 x num_warps (32 fp32 partial
    sums per thread); a tile with none is refused."""
    if max_m == 0:
        with pytest.raises(ValueError, match="more than 32 registers"):
            GemvConfig(block_n, block_g, num_warps)
        return
    cfg = GemvConfig(block_n, block_g, num_warps)
    assert cfg.max_m == max_m
    assert max_m * block_n * block_g <= 1024 * num_warps < 2 * max_m * block_n * block_g


@pytest.mark.parametrize("kw, exc, words", [
    (dict(block_n=3), ValueError, "block_n=3"), (dict(block_n=128), ValueError, "block_n=128"),
    (dict(block_g=8), ValueError, "block_g=8"), (dict(block_g=1024), ValueError, "block_g=1024"),
    (dict(num_warps=3), ValueError, "num_warps=3"), (dict(num_warps=16), ValueError, "num_warps=16"),
    (dict(block_n=4.0), TypeError, "block_n"), (dict(block_g=True), TypeError, "block_g"),
    (dict(num_warps="4"), TypeError, "num_warps")])
def test_bad_configs_raise(kw, exc, words):
    with pytest.raises(exc, match=words):
        GemvConfig(**kw)


def _table_block_ms():
    """(config, BLOCK_M) of every M the GPU table serves with the GEMV path, and of the default config and SMALL
    at M = 1 and at their max_m."""
    out, lo = [], 1
    for hi, cfg in mod.CONFIGS.rows:
        if isinstance(cfg, GemvConfig):
            out += [(cfg, bm) for bm in sorted({1 << (m - 1).bit_length() for m in range(lo, hi + 1)})]
        lo = hi + 1
    return out + [(c, bm) for c in (GemvConfig(), SMALL) for bm in (1, c.max_m)]


@pytest.mark.parametrize("cfg, block_m", _table_block_ms(), ids=repr)
def test_config_builds_for_sm90(cfg, block_m):
    """The kernel builds for sm_90 at the BLOCK_M the table runs it with (and the default config and SMALL at 1 and
    max_m), in both NaN modes, with no spills, no tensor-core instructions and 16-byte loads of b."""
    sig = {"vals_ptr": "*i8", "meta_ptr": "*i8", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "M": "i32", "N": "i32",
           "G": "i32", "stride_am": "i32", "stride_ag": "i32", "stride_bn": "i32", "stride_cm": "i32",
           "stride_cn": "i32"}
    for nan_bits in (False, True):
        ck = compile_for_sm90(sparse_gemv_kernel, sig, dict(BLOCK_M=block_m, BLOCK_N=cfg.block_n,
                                                            BLOCK_G=cfg.block_g, NAN_BITS=nan_bits),
                              num_warps=cfg.num_warps,
                              divisible_by_16=["vals_ptr", "meta_ptr", "b_ptr", "c_ptr", "N", "G", "stride_am",
                                               "stride_bn", "stride_cm"])
        ptx = ck.asm["ptx"]
        assert "wgmma" not in ptx and "mma.sync" not in ptx
        assert "ld.global.v4" in ptx or "ld.global.nc.v4" in ptx  # 16-byte loads of b's words
        assert ck.metadata.shared <= SM90_MAX_SHARED_BYTES and ptxas_advisories(ptx) == []
        info = sass_info(ck.asm["cubin"])
        if info:  # where triton's bundled cuobjdump reads the SASS
            assert info["spill_stores"] == info["spill_loads"] == 0, info
            assert info["hgmma"] == info["qgmma"] == 0, info


@INTERPRETER_ONLY
def test_refused_and_fallbacks_off_the_gpu():
    """An explicit GemvConfig with M > max_m, or with b rows it cannot read as words (a 1-byte offset), is
    refused naming what it needs; nothing is written."""
    v = torch.zeros((9, 8), dtype=torch.int8)
    b = torch.zeros((4, 36), dtype=torch.uint8).view(torch.float8_e4m3fn)
    out = torch.full((9, 4), NAN, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"GEMV path takes M <= 8"):
        mod.sparse_gemm_fp4_fp8(v, v.clone(), b[:, :32], SMALL, out=out)
    with pytest.raises(ValueError, match="gemv_eligible"):
        mod.sparse_gemm_fp4_fp8(v[:1], v[:1].clone(), b[:, 1:33], SMALL)
    assert torch.isnan(out.float()).all()
    assert mod.gemv_eligible(b[:, :32]) and mod.gemv_eligible(b[:, 4:36]) and not mod.gemv_eligible(b[:, 1:33])
    assert not mod.gemv_eligible(b[:, ::2])


@needs_interpreter
def test_a_cached_plan_is_not_reused_for_a_b_it_cannot_read():
    """Plans are keyed by the bases' byte residues, not only by 16-byte alignment: after a GEMV plan for a b at a
    4-byte offset, the same shapes and strides with b at a 2-byte offset are refused as on a first call (the GEMV
    kernel reads b as int32 words; a reused plan would fault on the GPU)."""
    rng = np.random.default_rng(5)
    v = torch.from_numpy(rng.integers(-128, 128, (1, 16), dtype=np.int8))
    store = torch.from_numpy(rng.integers(0, 0x78, 8 * 64 + 64, dtype=np.uint8))
    lead = (64 - store.data_ptr() % 64) % 64

    def b_at(offset):  # b [8, 64], its base `offset` bytes past a 64-byte boundary, strides (64, 1)
        return store[lead + offset:lead + offset + 8 * 64].view(8, 64).view(torch.float8_e4m3fn)

    _runtime.clear_plans()
    mod.sparse_gemm_fp4_fp8(v, v.clone(), b_at(4), SMALL)
    with pytest.raises(ValueError, match="gemv_eligible"):
        mod.sparse_gemm_fp4_fp8(v, v.clone(), b_at(2), SMALL)


# ---------------------------------------------------------------------------------------------------------------
# CPU: the kernel interpreted
# ---------------------------------------------------------------------------------------------------------------
@needs_interpreter
def test_every_vals_byte_with_every_meta_nibble_decodes_exactly():
    """All 256 vals bytes x 16 meta nibbles (a random high nibble each: bits 7:4 are ignored), 16 rows x 256
    groups, against b = I [1024, 1024]: c is the decoded A itself (one exact product per element), equal to
    fp4ref.packing.decompress_2to4 element for element."""
    rng = np.random.default_rng(1)
    pairs = np.arange(4096)
    vals = (pairs & 255).astype(np.uint8).reshape(16, 256)
    meta = ((pairs >> 8) | (rng.integers(0, 16, 4096) << 4)).astype(np.uint8).reshape(16, 256)
    eye = np.zeros((1024, 1024), np.uint8)
    eye[np.arange(1024), np.arange(1024)] = 0x38  # E4M3FN 1.0
    c = _run_cpu(vals, meta, eye, GemvConfig(block_n=16, block_g=16, num_warps=4)).float().numpy()
    np.testing.assert_array_equal(c, decompress_2to4(vals, meta).astype(np.float32))


@needs_interpreter
@pytest.mark.parametrize("M, n, k", [(1, 37, 516), (2, 64, 256), (5, 9, 20), (8, 40, 132), (3, 1, 4)])
def test_shapes_any_bytes_within_fp32(M, n, k):
    """Random vals / meta / b bytes (b without NaN): within fp32_rn of the exact result (the interpreter's bf16
    stores truncate: faithful), every element written, bitwise equal run to run."""
    rng = np.random.default_rng(M * 1000 + n + k)
    vals = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    meta = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    b = b_bytes(rng, n, k)
    c1, c2 = _run_cpu(vals, meta, b, SMALL), _run_cpu(vals, meta, b, SMALL)
    assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))
    bounds.check(_bf16(c1), reference(vals, meta, b), mod.accumulation_model(SMALL, k),
                 output_rounding="faithful", poison=NAN).assert_ok()


@needs_interpreter
def test_strided_operands_and_output():
    """a_vals / a_meta with a group stride of 2 and a row stride of 3 G, b with padded rows, c written through
    a transposed view: the same values as the contiguous call."""
    M, n, k = 3, 24, 64
    rng = np.random.default_rng(7)
    vals = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    meta = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    b = b_bytes(rng, n, k)
    want = _run_cpu(vals, meta, b, SMALL)
    big_v = torch.zeros((M, 3 * k // 4), dtype=torch.int8)
    big_t = torch.zeros((M, 3 * k // 4), dtype=torch.int8)
    big_v[:, : k // 2 : 2] = torch.from_numpy(vals.view(np.int8))
    big_t[:, : k // 2 : 2] = torch.from_numpy(meta.view(np.int8))
    big_b = torch.zeros((n, k + 12), dtype=torch.uint8)
    big_b[:, :k] = torch.from_numpy(b)
    out_t = torch.full((n, M), NAN, dtype=torch.bfloat16)
    got = mod.sparse_gemm_fp4_fp8(big_v[:, : k // 2 : 2], big_t[:, : k // 2 : 2],
                                  big_b.view(torch.float8_e4m3fn)[:, :k], SMALL, out=out_t.T)
    assert got.stride() == (1, M)
    assert torch.equal(got.contiguous().view(torch.int16), want.view(torch.int16))


@needs_interpreter
def test_nan_bytes_reach_c_iff_selected():
    """NaN bytes (0x7F / 0xFF) of b: c is NaN exactly where the reference is (the metadata selects one), also
    where the selected value is zero; the interpreter checks them by their bits (nan_check_bytes)."""
    M, n, k = 6, 16, 64
    rng = np.random.default_rng(11)
    vals = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    vals[0] = 0x80  # row 0: v0 = +0, v1 = -0 everywhere
    meta = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    b = b_bytes(rng, n, k, nan_rate=0.02)
    c = _run_cpu(vals, meta, b, SMALL)
    ref = reference(vals, meta, b)
    nan_ref = np.isnan(ref.exact)
    assert nan_ref.any() and not nan_ref.all() and nan_ref[0].any()
    np.testing.assert_array_equal(np.isnan(c.float().numpy()), nan_ref)
    bounds.check(_bf16(c), ref, "fp32_rn", output_rounding="faithful", poison=NAN).assert_ok()


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
GPU_CONFIGS = TABLE + [GemvConfig(), SMALL, GemvConfig(block_n=2, block_g=256, num_warps=2)]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cfg", TABLE + [GemvConfig()], ids=repr)
def test_every_byte_pair_decodes_exactly_on_the_gpu(cfg):
    """All 65536 (vals, meta) byte pairs, max_m rows x 2048 groups per call, against b = I [8192, 8192]: c
    equals decompress_2to4 exactly."""
    rows, groups = min(cfg.max_m, 16), 2048
    pairs = np.arange(65536).reshape(-1, rows, groups)
    eye = torch.zeros((4 * groups, 4 * groups), dtype=torch.uint8, device="cuda")
    eye[torch.arange(4 * groups), torch.arange(4 * groups)] = 0x38  # E4M3FN 1.0
    for chunk in pairs:
        vals = (chunk & 255).astype(np.uint8)
        meta = (chunk >> 8).astype(np.uint8)
        out = torch.full((rows, 4 * groups), NAN, dtype=torch.bfloat16, device="cuda")
        mod.sparse_gemm_fp4_fp8(torch.from_numpy(vals.view(np.int8)).cuda(),
                                torch.from_numpy(meta.view(np.int8)).cuda(), eye.view(torch.float8_e4m3fn), cfg,
                                out=out)
        np.testing.assert_array_equal(out.float().cpu().numpy(), decompress_2to4(vals, meta).astype(np.float32))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cfg", GPU_CONFIGS, ids=repr)
@pytest.mark.parametrize("M, n, k", [(1, 2048, 2048), (1, 37, 516), (2, 100, 2048), (7, 2048, 2048)])
def test_shapes_any_bytes_and_nan_on_the_gpu(cfg, M, n, k):
    """Random bytes, without and with NaN bytes of b: within fp32_rn with RNE outputs (NaN-poisoned), NaN exactly
    where the reference has it, bitwise equal run to run."""
    if M > cfg.max_m:
        pytest.skip("M above the config's max_m")
    rng = np.random.default_rng(M * 7 + n + k)
    vals = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    meta = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    for rate in (0.0, 40 / (n * k)):
        b = b_bytes(rng, n, k, rate)
        c1, c2 = run_poisoned(vals, meta, b, cfg), run_poisoned(vals, meta, b, cfg)
        assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))
        ref = reference(vals, meta, b)
        bounds.check(c1, ref, mod.accumulation_model(cfg, k), output_rounding="rne", poison=NAN).assert_ok()
        np.testing.assert_array_equal(np.isnan(c1.float().numpy()), np.isnan(ref.exact))


@pytest.mark.gpu
@needs_gpu
def test_nan_selected_vs_pruned_on_the_gpu():
    """A NaN byte of b reaches c iff the metadata selects its position, also times a zero value (the hand-made
    rows of _sparse_gpu.assert_nan_selected_vs_pruned, four rows here): the program holding it recomputes its
    sums from the selected positions, every other element is the hand-computed value."""
    b = np.tile(np.array([0x38, 0x40, 0x48, 0x50], np.uint8), (64, 64))
    b[5, 1] = 0x7F
    vals = np.zeros((4, 64), np.uint8)
    meta = np.full((4, 64), 0x08, np.uint8)
    vals[:, 0] = [0x21, 0x21, 0x00, 0x21]
    meta[:, 0] = [0x0D, 0x0E, 0x04, 0x08]  # selects {1,3}, {2,3}, {0,1} (values 0), {0,2}
    vals[:, 63] = 0x22  # + (1 + 4)
    for cfg in GPU_CONFIGS:
        step = min(4, cfg.max_m)  # rows per call
        c = np.concatenate([run_poisoned(vals[r:r + step], meta[r:r + step], b, cfg).float().numpy()
                            for r in range(0, 4, step)])
        assert np.isnan(c[0, 5]) and np.isnan(c[2, 5])
        assert c[1, 5] == 0.5 * 4 + 1.0 * 8 + 5 and c[3, 5] == 0.5 * 1 + 1.0 * 4 + 5
        assert c[0, 4] == 0.5 * 2 + 1.0 * 8 + 5
        assert np.isnan(c).sum() == 2


@pytest.mark.gpu
@needs_gpu
def test_default_pick_refusal_and_fallback_on_the_gpu():
    """M = 1 takes the GEMV path; an explicit GemvConfig on a b whose rows are not 4-byte aligned is refused and
    the default pick serves that call with the TL_CONFIGS row; both values within the contract."""
    rng = np.random.default_rng(3)
    vals = rng.integers(0, 256, (1, 512), dtype=np.uint8)
    meta = rng.integers(0, 256, (1, 512), dtype=np.uint8)
    b = b_bytes(rng, 256, 2048)
    v = torch.from_numpy(vals.view(np.int8)).cuda()
    t = torch.from_numpy(meta.view(np.int8)).cuda()
    bb = torch.from_numpy(b).cuda().view(torch.float8_e4m3fn)
    assert isinstance(mod.pick_config(1, 256, 2048), GemvConfig) and mod.gemv_eligible(bb)
    c = mod.sparse_gemm_fp4_fp8(v, t, bb)
    wide = torch.zeros((256, 2049), dtype=torch.uint8, device="cuda")
    wide[:, 1:] = torch.from_numpy(b).cuda()
    assert not mod.gemv_eligible(wide.view(torch.float8_e4m3fn)[:, 1:])
    with pytest.raises(ValueError, match="gemv_eligible"):
        mod.sparse_gemm_fp4_fp8(v, t, wide.view(torch.float8_e4m3fn)[:, 1:], GemvConfig())
    c2 = mod.sparse_gemm_fp4_fp8(v, t, wide.view(torch.float8_e4m3fn)[:, 1:])
    ref = reference(vals, meta, b)
    for out in (c, c2):
        bounds.check(out.cpu(), ref, mod.NUMERIC_CONTRACT.model, output_rounding="rne").assert_ok()
