"""fp4ref.kernels.sparse_gemm_fp4_fp8 (2:4 sparse E2M1 x E4M3FN -> bf16) against fp4ref's exact reference.

CPU CI: the Triton interpreter (conftest sets TRITON_INTERPRET=1), checked by fp4ref.bounds.check under the
kernel's declared model with FAITHFUL output rounding (interpreted fp32 -> bf16 stores truncate,
docs/kernels.md) and NaN-poisoned outputs; every CONFIGS entry compiled for sm_90 on the CPU.
GPU (marked gpu, skipped without CUDA): the workload's M values, RNE output rounding, determinism.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp4ref.bounds import check
from fp4ref.gemm import sparse_gemm_fp4_fp8 as reference
from fp4ref.kernels import _runtime
from fp4ref.kernels import sparse_gemm_fp4_fp8 as mod
from fp4ref.kernels.sparse_gemm_fp4_fp8 import ExpandConfig, FusedConfig, expand, fused
from fp4ref.packing import compress_2to4

from _marks import INTERPRETER_ONLY  # tests/_marks.py

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
ROUNDING = "rne" if ON_GPU else "faithful"
CONTRACT = mod.NUMERIC_CONTRACT.model
NAN = float("nan")


def _run(vals_u8: np.ndarray, meta_u8: np.ndarray, b_u8: np.ndarray, config=None, nan_check_bytes=None):
    """Kernel on numpy bytes (int8 views, as the workload passes them) into a NaN-poisoned output."""
    v = torch.from_numpy(np.ascontiguousarray(vals_u8).view(np.int8)).to(DEVICE)
    m = torch.from_numpy(np.ascontiguousarray(meta_u8).view(np.int8)).to(DEVICE)
    b = torch.from_numpy(np.ascontiguousarray(b_u8)).to(DEVICE).view(torch.float8_e4m3fn)
    out = torch.full((v.shape[0], b.shape[0]), NAN, dtype=torch.bfloat16, device=DEVICE)
    c = mod.sparse_gemm_fp4_fp8(v, m, b, config, out=out, nan_check_bytes=nan_check_bytes)
    assert c is out
    return c.cpu()


def _assert_matches(c, vals_u8, meta_u8, b_u8, model=CONTRACT):
    ref = reference(vals_u8, meta_u8, b_u8)
    check(c, ref, model, output_rounding=ROUNDING, poison=NAN).assert_ok()
    return ref


def _workspace(name, dtype, device=DEVICE):
    """The package's workspace ``name`` on the current stream (a zeroed 1-element one when the path never allocated
    it: the GPU's expand path keeps no NaN flags)."""
    dev = torch.device(device)
    return _runtime.workspace(dev, _runtime.current_stream(dev), name, 0, dtype, zeroed=True)


def _b_bytes(rng, N, K, nan_rate=0.0):
    """Random E4M3FN bytes (any finite byte), optionally with NaN bytes (0x7F / 0xFF) at rate nan_rate."""
    b = rng.integers(0, 256, (N, K), dtype=np.uint8)
    b[(b & 0x7F) == 0x7F] ^= 0x01  # finite
    if nan_rate:
        hit = rng.random((N, K)) < nan_rate
        b[hit] = np.where(rng.random((N, K)) < 0.5, 0x7F, 0xFF).astype(np.uint8)[hit]
    return b


# ---------------------------------------------------------------------------------------------------------------
# Hand-computed values (independent of fp4ref): one group, K = 4, b row [1, 2, 4, 8] (E4M3FN 0x38 0x40 0x48 0x50)
# ---------------------------------------------------------------------------------------------------------------
B_ROW = np.array([[0x38, 0x40, 0x48, 0x50]], dtype=np.uint8)


@pytest.mark.parametrize(
    "val, meta, expected",
    [
        (0x21, 0x0D, 0.5 * 2 + 1.0 * 8),  # v0 = 0.5 at idx0 = 1, v1 = 1.0 at idx1 = 3
        (0x21, 0x07, 1.0 * 2 + 0.5 * 8),  # descending indices idx0 = 3 > idx1 = 1: same sum rule
        (0x21, 0x05, (0.5 + 1.0) * 2),  # duplicate index 1: the values ADD
        (0xF7, 0xFF, (6.0 - 6.0) * 8),  # v0 = 6 (0x7), v1 = -6 (0xF) both at 3; meta bits 7:4 set (ignored)
        (0xFF, 0xFA, -12.0 * 4),  # int8 -1 / -6: v0 = v1 = -6, both at idx 2: a signed shift would break this
        (0x8F, 0xE4, -6.0 * 1 + -0.0 * 2),  # -0 (code 8) at idx1 = 1
        (0x77, 0x0F, 12.0 * 8),  # 6 + 6 at idx 3: 12 (E4M3FN-exact sum) * 8
    ],
)
def test_hand_computed_groups(val, meta, expected):
    c = _run(np.array([[val]], np.uint8), np.array([[meta]], np.uint8), B_ROW)
    assert c.shape == (1, 1) and c.dtype == torch.bfloat16
    assert c.float().item() == expected  # small integers: exact in bf16 under any rounding


def test_every_vals_byte_with_every_meta_nibble():
    """Exhaustive over one group: all 256 vals bytes x all 16 meta nibbles (duplicate indices add), meta bits 7:4
    set at random; 4096 rows, K = 4, b a row of four distinct powers of two."""
    vals = np.repeat(np.arange(256, dtype=np.uint8), 16)[:, None]
    meta = (np.tile(np.arange(16, dtype=np.uint8), 256)
            | (np.random.default_rng(3).integers(0, 16, 4096).astype(np.uint8) << 4))[:, None]
    b = np.array([[0x38, 0x40, 0x48, 0x50]], dtype=np.uint8)  # 1, 2, 4, 8: every sum has <= 8 bits (exact in bf16)
    c = _run(vals, meta, b)
    ref = _assert_matches(c, vals, meta, b)
    np.testing.assert_array_equal(c.float().numpy(), ref.out.astype(np.float32))  # exact: no rounding happens


@INTERPRETER_ONLY
def test_prepass_every_vals_byte_with_every_meta_nibble():
    """The large-M decode pre-pass (sparse_expand_a_kernel) bytes, exhaustive over one group: all 256 vals bytes x
    all 16 meta nibbles (meta bits 7:4 set at random), in tiles of PREP_BLOCK_G groups, against the dense A of
    fp4ref.packing.decompress_2to4 cast to E4M3FN by ml_dtypes (exact: every entry has <= 4 significant bits)."""
    import ml_dtypes
    import triton

    from fp4ref.packing import decompress_2to4

    G = expand.PREP_BLOCK_G
    M = 256 * 16 // G
    vals = np.repeat(np.arange(256, dtype=np.uint8), 16).reshape(M, G)
    meta = (np.tile(np.arange(16, dtype=np.uint8), 256)
            | (np.random.default_rng(5).integers(0, 16, 4096).astype(np.uint8) << 4)).reshape(M, G)
    want = decompress_2to4(vals, meta).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    v, m = torch.from_numpy(vals.view(np.int8)), torch.from_numpy(meta.view(np.int8))
    w = torch.full((M, G), -1, dtype=torch.int32)
    expand.sparse_expand_a_kernel[(triton.cdiv(M, expand.PREP_BLOCK_M), 1)](
        v, m, w, M, G, v.stride(0), v.stride(1), w.stride(0), BLOCK_M=expand.PREP_BLOCK_M, BLOCK_G=G)
    got = w.numpy().view(np.uint8).reshape(M, 4 * G)
    np.testing.assert_array_equal(got.view(ml_dtypes.float8_e4m3fn).astype(np.float32),
                                  want.view(ml_dtypes.float8_e4m3fn).astype(np.float32))
    assert not (got[want == 0] & 0x7F).any()


def test_nan_selected_vs_pruned():
    """A NaN byte of b counts iff the metadata selects its position (even times a zero value)."""
    b = np.array([[0x38, 0x7F, 0x48, 0x50]], dtype=np.uint8)  # NaN at position 1
    vals = np.array([[0x21], [0x21], [0x00], [0x21]], np.uint8)
    meta = np.array([[0x0D], [0x0E], [0x04], [0x08]], np.uint8)  # selects {1,3}, {2,3}, {0,1} (values 0), {0,2}
    c = _run(vals, meta, b).float().numpy()[:, 0]
    assert np.isnan(c[0]) and np.isnan(c[2])
    assert c[1] == 0.5 * 4 + 1.0 * 8 and c[3] == 0.5 * 1 + 1.0 * 4


# ---------------------------------------------------------------------------------------------------------------
# Hypothesis: shapes and adversarial bytes, against fp4ref.gemm.sparse_gemm_fp4_fp8 under the declared model
# ---------------------------------------------------------------------------------------------------------------
@st.composite
def sparse_operands(draw, *, max_m=130, max_n=96, max_groups=80, canonical=False, nan_rate=0.0):
    M = draw(st.integers(1, max_m))
    N = draw(st.integers(1, max_n))
    G = draw(st.integers(1, max_groups))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if canonical:
        # canonical bytes from an independent path: compress_2to4 of a random 2:4-sparse E2M1 code matrix
        codes = rng.integers(0, 16, (M, 4 * G))
        keep = np.argsort(rng.random((M, G, 4)), axis=2)[:, :, :2]
        mask = np.zeros((M, G, 4), bool)
        np.put_along_axis(mask, keep, True, axis=2)
        codes = np.where(mask.reshape(M, 4 * G), codes, 0)
        vals, meta = compress_2to4(codes)
    else:
        vals = rng.integers(0, 256, (M, G), dtype=np.uint8)
        meta = rng.integers(0, 256, (M, G), dtype=np.uint8)
    # adversarial rows: all 0xFF bytes (-6, -6 at index 3, meta high bits set), and 0x80 sign-bit-only bytes
    if M > 2 and draw(st.booleans()):
        vals[0], meta[0] = 0xFF, 0xFF
        vals[1], meta[1] = 0x80, 0x80
    b = _b_bytes(rng, N, 4 * G, nan_rate)
    return vals, meta, b


@settings(max_examples=20)
@given(sparse_operands())
def test_any_bytes(ops):
    vals, meta, b = ops
    _assert_matches(_run(vals, meta, b), vals, meta, b)


@settings(max_examples=12)
@given(sparse_operands(canonical=True))
def test_canonical_bytes(ops):
    vals, meta, b = ops
    _assert_matches(_run(vals, meta, b), vals, meta, b)


@settings(max_examples=12)
@given(sparse_operands(nan_rate=0.01))
def test_nan_bytes_in_b(ops):
    vals, meta, b = ops
    ref = _assert_matches(_run(vals, meta, b), vals, meta, b)  # check() counts NaN mismatches
    assert ref.exact.size > 0


def test_ragged_m_and_k_splitk_paths():
    """M not a tile multiple, K not a BLOCK_K multiple (masked K tail), split-K 1 and 3, both MMA paths."""
    rng = np.random.default_rng(7)
    M, N, G = 67, 40, 97  # K = 388: 3 full K-tiles of 128 + a tail of 4
    vals = rng.integers(0, 256, (M, G), dtype=np.uint8)
    meta = rng.integers(0, 256, (M, G), dtype=np.uint8)
    b = _b_bytes(rng, N, 4 * G, nan_rate=0.002)
    C = FusedConfig
    for cfg in (C(64, 64, 128, split_k=1), C(64, 64, 128, split_k=3), C(16, 32, 64, split_k=2, mma="fp16"),
                C(2, 32, 64, split_k=2, mma="fma")):
        c = _run(vals, meta, b, cfg)
        _assert_matches(c, vals, meta, b)
        if not ON_GPU:  # the interpreted fp32 accumulation is within the config's own (tighter) model too
            _assert_matches(c, vals, meta, b, model=mod.accumulation_model(cfg, 4 * G, interpreter=True))


def test_deterministic_and_inputs_untouched():
    rng = np.random.default_rng(11)
    vals = rng.integers(0, 256, (70, 64), dtype=np.uint8)
    meta = rng.integers(0, 256, (70, 64), dtype=np.uint8)
    b = _b_bytes(rng, 64, 256)
    copies = (vals.copy(), meta.copy(), b.copy())
    c1 = _run(vals, meta, b)
    c2 = _run(vals, meta, b)
    assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))
    for x, y in zip((vals, meta, b), copies):
        np.testing.assert_array_equal(x, y)


# ---------------------------------------------------------------------------------------------------------------
# Large-M "expand" path: decode pre-pass + persistent TMA fp8 GEMM; NaN tiles recomputed by the exact slow path
# ---------------------------------------------------------------------------------------------------------------
EXPAND_CFG = ExpandConfig(64, 32, 64, num_warps=4, num_stages=2)
EXPAND_CFG_SPLIT = ExpandConfig(64, 64, 64, num_warps=4, num_stages=2, n_split=2, nan_fixup="inline")


@INTERPRETER_ONLY  # (it reads the `tl` expand path's workspaces)
@pytest.mark.parametrize("cfg", [EXPAND_CFG, EXPAND_CFG_SPLIT], ids=["n_split1-fixup_launch", "n_split2-inline"])
def test_expand_path_ragged_with_nan_selected_and_pruned(cfg):
    """Ragged M and N (TMA zero padding), any bytes; NaN bytes of b at positions some rows select and others
    prune: NaN exactly where the reference has it. (Several tiles per persistent program: test_expand_path_*.)"""
    rng = np.random.default_rng(21)
    M, N, G = 67, 40, 48  # K = 192: 3 K-tiles of 64; 2 x 2 (or 2 x 1) tiles on _runtime.INTERPRETER_SMS programs
    vals = rng.integers(0, 256, (M, G), dtype=np.uint8)
    meta = rng.integers(0, 256, (M, G), dtype=np.uint8)
    vals[0], meta[0] = 0x77, 0x0F  # 6 + 6 at index 3 of every group: the pre-pass must write 12 exactly
    b = _b_bytes(rng, N, 4 * G)
    b[5, 7] = 0x7F  # group 1, position 3: row 0 selects it (NaN in c[0, 5])
    b[33, 4 * 10 + 1] = 0xFF  # group 10, position 1
    meta[:, 10] = 0x08  # every row selects {0, 2} of group 10: the NaN at position 1 is pruned for all rows...
    meta[3, 10] = 0x04  # ...but row 3, which selects {0, 1}
    c = _run(vals, meta, b, cfg)
    ref = _assert_matches(c, vals, meta, b)
    nan_ref = np.isnan(ref.exact)
    assert nan_ref[0, 5] and nan_ref[3, 33] and not nan_ref[4, 33]
    np.testing.assert_array_equal(np.isnan(c.float().numpy()), nan_ref)
    flags = _workspace(mod.WS_NAN_FLAGS, torch.int32)
    assert int(flags.abs().sum()) == 0  # the fix-up leaves the flags at 0
    # the pre-pass output itself, byte for byte, against a dense A built by torch ops (scatter-add, exact cast);
    # NaN tiles would hide a pre-pass error (the fix-up recomputes them from vals/meta), so check it directly
    from fp4ref.kernels.sparse_gemm_fp4_fp8.bench import expand_a_e4m3

    v8 = torch.from_numpy(vals.view(np.int8))
    m8 = torch.from_numpy(meta.view(np.int8))
    a8 = _workspace(mod.WS_DENSE_A, torch.float8_e4m3fn)[: M * 4 * G].view(M, 4 * G)
    dense = expand_a_e4m3(v8, m8)
    # values exact; compared as values because a -0 code decodes to -0 in the kernel, +0 in the scatter-add
    assert torch.equal(a8.float(), dense.float())
    if cfg.nan_fixup == "launch":  # this config went through the flag + fix-up launch (one flag per C tile)
        assert flags.numel() >= -(-M // cfg.block_m) * -(-N // cfg.block_n)
    _assert_matches(c, vals, meta, b, model=mod.accumulation_model(cfg, 4 * G, interpreter=True))


def test_expand_path_several_tiles_per_program():
    """More C tiles than persistent programs (3 x 2 tiles on _runtime.INTERPRETER_SMS = 4 programs in the
    interpreter): the persistent loop's second pass, with NaN bytes of b (selected and pruned)."""
    rng = np.random.default_rng(22)
    M, N, G = 130, 40, 16  # K = 64: one K-tile
    vals = rng.integers(0, 256, (M, G), dtype=np.uint8)
    meta = rng.integers(0, 256, (M, G), dtype=np.uint8)
    b = _b_bytes(rng, N, 4 * G, nan_rate=0.01)
    assert (-(-M // EXPAND_CFG.block_m)) * (-(-N // EXPAND_CFG.block_n)) > _runtime.num_sms(torch.device(DEVICE)) \
        or ON_GPU
    c = _run(vals, meta, b, EXPAND_CFG)
    ref = _assert_matches(c, vals, meta, b)
    np.testing.assert_array_equal(np.isnan(c.float().numpy()), np.isnan(ref.exact))


@settings(max_examples=8)
@given(sparse_operands(max_m=100, max_n=70, max_groups=40, nan_rate=0.003))
def test_expand_path_any_bytes(ops):
    vals, meta, b = ops
    if (4 * vals.shape[1]) % 16:  # the expand path's TMA rows need K % 16 == 0 (explicit config: ValueError)
        with pytest.raises(ValueError, match="expand"):
            _run(vals, meta, b, EXPAND_CFG)
        return
    _assert_matches(_run(vals, meta, b, EXPAND_CFG), vals, meta, b)


@settings(max_examples=6)
@given(sparse_operands(max_m=100, max_n=70, max_groups=40, canonical=True))
def test_expand_path_canonical_bytes(ops):
    vals, meta, b = ops
    if (4 * vals.shape[1]) % 16 == 0:
        _assert_matches(_run(vals, meta, b, EXPAND_CFG), vals, meta, b)


def test_expand_config_fallback_and_errors():
    """A b the TMA descriptors cannot read: an explicit expand config raises, the default pick falls back."""
    b = torch.zeros(8, 24, dtype=torch.float8_e4m3fn, device=DEVICE)  # K = 24: rows of 24 bytes, not 16-byte multiples
    v = torch.zeros(4, 6, dtype=torch.int8, device=DEVICE)
    assert not mod.tma_eligible(b) and mod.tma_eligible(torch.zeros(8, 32, dtype=torch.float8_e4m3fn, device=DEVICE))
    with pytest.raises(ValueError, match="ExpandConfig"):
        mod.sparse_gemm_fp4_fp8(v, v.clone(), b, EXPAND_CFG)
    # K = 16 but rows 24 bytes apart: the row stride, not only K, must be a 16-byte multiple
    b24 = torch.zeros(8, 24, dtype=torch.uint8, device=DEVICE)[:, :16].view(torch.float8_e4m3fn)
    assert not mod.tma_eligible(b24) and mod.tma_eligible(torch.zeros(8, 32, dtype=torch.uint8, device=DEVICE)[:, :16]
                                                          .view(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match="ExpandConfig"):
        mod.sparse_gemm_fp4_fp8(v[:, :4].contiguous(), v[:, :4].contiguous(), b24, EXPAND_CFG)
    # the expand path has no split-K and no other MMA; n_split is the expand path's: the types reject them
    with pytest.raises(TypeError, match="split_k"):
        ExpandConfig(64, 64, 64, split_k=2)
    with pytest.raises(TypeError, match="mma"):
        ExpandConfig(64, 64, 64, mma="fp16")
    with pytest.raises(TypeError, match="n_split"):
        FusedConfig(64, 64, 64, n_split=2)
    with pytest.raises(ValueError, match="n_split"):
        ExpandConfig(64, 64, 64, n_split=3)
    with pytest.raises(ValueError, match="nan_fixup"):
        ExpandConfig(64, 64, 64, nan_fixup="later")
    with pytest.raises(ValueError, match="mma"):
        FusedConfig(64, 64, 64, mma="nope")
    big = mod.pick_config(1 << 20, 2048, 2048, interpreter=False)
    assert isinstance(big, ExpandConfig)
    assert isinstance(mod.FALLBACK_CONFIG, FusedConfig)


def test_tl_paths_refuse_operands_beyond_32_bit_offsets(monkeypatch):
    """The `tl` kernels (fused, expand pre-pass and GEMM, NaN fix-up) index with 32-bit offsets: operands that
    extend over 2^31 elements or more are refused with the operand named (the limit lowered here to 64 elements:
    out [4, 16] and the dense A's [4, 16] words reach it, a_vals [4, 16] as well)."""
    monkeypatch.setattr(_runtime, "INT32_OFFSETS", 64)
    _runtime.clear_plans()
    rng = np.random.default_rng(2)
    v = torch.from_numpy(rng.integers(-128, 128, (4, 16), dtype=np.int8)).to(DEVICE)
    b = torch.from_numpy(rng.integers(0, 0x78, (16, 64), dtype=np.uint8)).to(DEVICE).view(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"a_vals extends over 64 elements.*FusedConfig path"):
        mod.sparse_gemm_fp4_fp8(v, v.clone(), b, FusedConfig(16, 16, 64))
    with pytest.raises(ValueError, match=r"extends over 64 elements.*ExpandConfig path"):
        mod.sparse_gemm_fp4_fp8(v, v.clone(), b, EXPAND_CFG)
    # the split-K partials: 1 tile x 2 slices x 16 x 16 = 512 elements, the operands (at most 256) below 512
    monkeypatch.setattr(_runtime, "INT32_OFFSETS", 512)
    vv = torch.from_numpy(rng.integers(-128, 128, (16, 8), dtype=np.int8)).to(DEVICE)
    with pytest.raises(ValueError, match=r"split_k_partials extends over 512 elements.*FusedConfig path"):
        mod.sparse_gemm_fp4_fp8(vv, vv.clone(), b[:8, :32], FusedConfig(16, 16, 16, split_k=2))
    # a strided out reaches past M x N: [4, 2] of rows 70 apart extends over 3 * 70 + 2 = 212 elements (b [2, 64]
    # over 128, a_vals over 64)
    monkeypatch.setattr(_runtime, "INT32_OFFSETS", 212)
    out = torch.full((4, 70), NAN, dtype=torch.bfloat16, device=DEVICE)[:, :2]
    with pytest.raises(ValueError, match=r"out extends over 212 elements.*FusedConfig path"):
        mod.sparse_gemm_fp4_fp8(v, v.clone(), b[:2], FusedConfig(16, 16, 64), out=out)
    assert torch.isnan(out).all()


def _random_operands(seed: int, M: int, N: int, K: int):
    """Random vals / meta bytes and finite E4M3FN b bytes (numpy) and their device tensors (int8 / fp8 views)."""
    rng = np.random.default_rng(seed)
    vals = rng.integers(0, 256, (M, K // 4), dtype=np.uint8)
    meta = rng.integers(0, 256, (M, K // 4), dtype=np.uint8)
    b = _b_bytes(rng, N, K)
    dev = (torch.from_numpy(vals.view(np.int8)).to(DEVICE), torch.from_numpy(meta.view(np.int8)).to(DEVICE),
           torch.from_numpy(b).to(DEVICE).view(torch.float8_e4m3fn))
    return (vals, meta, b), dev


def test_a_one_row_out_may_have_any_row_stride():
    """M = 1: the row stride of out is never used (here 0), so such an out is accepted and written."""
    ops, (v, m, b) = _random_operands(11, 1, 12, 64)
    out = torch.full((12,), NAN, dtype=torch.bfloat16, device=DEVICE).as_strided((1, 12), (0, 1))
    _assert_matches(mod.sparse_gemm_fp4_fp8(v, m, b, out=out).cpu(), *ops)


def test_a_cached_plan_checks_the_strides_and_memory_of_a_new_out():
    """The plan key holds out's strides: after a call with a contiguous out, an out whose rows share memory is
    refused as on a first call; an out that overlaps b_fp8 (not only a_vals) is refused."""
    ops, (v, m, b) = _random_operands(12, 2, 12, 64)
    _assert_matches(mod.sparse_gemm_fp4_fp8(v, m, b, out=torch.full((2, 12), NAN, dtype=torch.bfloat16,
                                                                    device=DEVICE)).cpu(), *ops)
    with pytest.raises(ValueError, match=r"out: strides \(0, 1\).*share memory"):
        mod.sparse_gemm_fp4_fp8(v, m, b, out=torch.zeros(1, 12, dtype=torch.bfloat16, device=DEVICE).expand(2, 12))
    store = torch.zeros(12 * 64, dtype=torch.uint8, device=DEVICE)
    store.copy_(b.view(torch.uint8).reshape(-1))
    with pytest.raises(ValueError, match="out overlaps b_fp8"):
        mod.sparse_gemm_fp4_fp8(v, m, store.view(12, 64).view(torch.float8_e4m3fn),
                                out=store[: 2 * 12 * 2].view(torch.bfloat16).view(2, 12))


def test_split_k_never_launches_an_empty_k_slice():
    """split_k is clamped to the K blocks there are: K = 64 in block_k 64 is one slice (no split-K workspace, no
    empty slices adding +0), whatever the config asks."""
    ops, (v, m, b) = _random_operands(13, 4, 16, 64)
    mod.PLANS.clear()
    _assert_matches(mod.sparse_gemm_fp4_fp8(v, m, b, FusedConfig(16, 16, 64, split_k=4)).cpu(), *ops)
    (plan,) = mod.PLANS._plans.values()
    assert plan.main.constexprs["SPLIT_K"] == 1 and plan.main.grid[1] == 1 and plan.ws_elems == 0


@INTERPRETER_ONLY
def test_launch_plan_cache():
    """One plan per key; a cached key still checks out; new keys (other strides, dtypes) are validated anew."""
    rng = np.random.default_rng(5)
    vals = rng.integers(0, 256, (9, 16), dtype=np.uint8)
    meta = rng.integers(0, 256, (9, 16), dtype=np.uint8)
    b = _b_bytes(rng, 12, 64)
    c1 = _run(vals, meta, b)
    n_plans = len(mod.PLANS)
    c2 = _run(vals, meta, b)
    assert len(mod.PLANS) == n_plans  # reused
    assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))
    _assert_matches(c2, vals, meta, b)
    v = torch.from_numpy(vals.view(np.int8))
    m = torch.from_numpy(meta.view(np.int8))
    bt = torch.from_numpy(b).view(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="out.shape"):
        mod.sparse_gemm_fp4_fp8(v, m, bt, out=torch.zeros(12, 9, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="out"):
        mod.sparse_gemm_fp4_fp8(v, m, bt, out=torch.zeros(9, 12, dtype=torch.float32))
    with pytest.raises(ValueError, match="a_meta.stride"):  # both are indexed with a_vals' strides
        mod.sparse_gemm_fp4_fp8(v, m.t().contiguous().t(), bt)
    # a strided b (new key): validated and correct
    wide = np.zeros((12, 128), np.uint8)
    wide[:, ::2] = b
    bs = torch.from_numpy(wide).view(torch.float8_e4m3fn)[:, ::2]
    c3 = mod.sparse_gemm_fp4_fp8(v, m, bs)
    assert torch.equal(c3.view(torch.int16), c1.view(torch.int16))
    mod.PLANS.clear()  # bounded cache: clearing is always safe
    assert torch.equal(_run(vals, meta, b).view(torch.int16), c1.view(torch.int16))


def test_sweep_candidates_at_every_bucket():
    """The tuning sweep's candidates build as configs at every M it serves (M = 100 raised UnboundLocalError once)
    and include the GEMV path up to M = 4 (within each config's max_m), the expand path's Gluon GEMM above M = 16
    and the fused Gluon kernel from M = 1024."""
    from fp4ref.kernels.sparse_gemm_fp4_fp8.bench import sweep_candidates

    for M in (1, 4, 7, 16, 24, 64, 100, 256, 1024, 8192):
        cands = sweep_candidates(M)
        assert cands and all(isinstance(c, (FusedConfig, ExpandConfig, mod.GluonConfig, mod.FusedWSConfig,
                                            mod.GemvConfig)) for c, _ in cands)
        gemv = [c for c, _ in cands if isinstance(c, mod.GemvConfig)]
        assert bool(gemv) == (M <= 4) and all(M <= c.max_m for c in gemv)
        assert any(isinstance(c, ExpandConfig) and c.gemm == "gluon" for c, _ in cands) == (M > 16)
        assert any(isinstance(c, mod.FusedWSConfig) for c, _ in cands) == (M >= 1024)
        assert mod.pick_config(M, 2048, 2048, False) in [c for c, _ in cands]  # the shipped row always competes


def test_sweep_pick_keeps_fused_at_small_m_unless_expand_event_time_is_lower():
    """The sweep picks by GPU time, but at M <= 256 an expand pick must also win on event time (host included)."""
    from fp4ref.kernels.sparse_gemm_fp4_fp8.bench import pick_by_kind

    f, x = mod.TL_CONFIGS.pick(64), mod.pick_config(4096, 2048, 2048, False)
    g = mod.pick_config(16, 2048, 2048, False)
    assert isinstance(f, FusedConfig) and isinstance(x, ExpandConfig) and isinstance(g, mod.GluonConfig)
    assert pick_by_kind(256, {"fused": (18.0, 20.5, f), "expand": (12.4, 42.0, x)}) is f  # host-bound expand
    assert pick_by_kind(256, {"fused": (18.0, 20.5, f), "expand": (12.4, 19.0, x)}) is x
    assert pick_by_kind(1024, {"fused": (30.0, 33.0, f), "expand": (19.0, 60.0, x)}) is x  # large M: GPU time
    assert pick_by_kind(64, {"fused": (12.0, 19.0, f), "expand": (12.3, 15.0, x)}) is f
    assert pick_by_kind(4096, {"expand": (49.0, 54.0, x)}) is x
    # the one-launch paths compete by GPU time; expand still needs the lower event time than the best of them
    assert pick_by_kind(64, {"gluon": (5.0, 9.0, g), "fused": (12.0, 19.0, f), "expand": (6.0, 8.0, x)}) is g
    assert pick_by_kind(64, {"gluon": (13.0, 19.5, g), "fused": (12.0, 19.0, f)}) is f
    assert pick_by_kind(256, {"gluon": (13.0, 19.5, g), "expand": (12.0, 15.0, x)}) is x
    v = mod.GemvConfig()  # so is the GEMV path
    assert pick_by_kind(1, {"gemv": (5.0, 9.0, v), "gluon": (6.2, 9.2, g), "expand": (7.0, 8.0, x)}) is v
    assert pick_by_kind(1, {"gemv": (6.5, 9.0, v), "gluon": (6.2, 9.2, g)}) is g
    w = mod.FusedWSConfig()  # the fused Gluon kernel is a one-launch path too
    assert pick_by_kind(4096, {"fused-ws": (50.0, 52.0, w), "expand": (36.0, 38.0, x)}) is x
    assert pick_by_kind(4096, {"fused-ws": (30.0, 32.0, w), "expand": (36.0, 38.0, x)}) is w
    large = [c for b, c in mod.TL_CONFIGS.rows if b > 256] + [mod.TL_CONFIGS.larger]
    assert {(type(c), c.group_m) for c in large} == {(ExpandConfig, 16)}


# ---------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------
def _tensors(M=2, N=3, K=8):
    v = torch.zeros(M, K // 4, dtype=torch.int8)
    return v, v.clone(), torch.zeros(N, K, dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda v, m, b: (v.to(torch.uint8), m, b), TypeError, r"a_vals.dtype.*\.view\(torch\.int8\)"),
        (lambda v, m, b: (v, m.numpy(), b), TypeError, "a_meta: expected a torch.Tensor"),
        (lambda v, m, b: (v, m, b.view(torch.uint8)), TypeError, "b_fp8.dtype"),
        (lambda v, m, b: (v, m, torch.zeros(3, 6, dtype=torch.float8_e4m3fn)), ValueError, "multiple of 4"),
        (lambda v, m, b: (v[:, :1], m[:, :1], b), ValueError, r"expected \[M, K/4\]"),
        (lambda v, m, b: (v, m[:1], b), ValueError, "a_meta.shape"),
        (lambda v, m, b: (v[:0], m[:0], b), ValueError, "M"),
        (lambda v, m, b: (v, m, b[:0]), ValueError, "N"),
        (lambda v, m, b: (v.reshape(-1), m, b), ValueError, "2-D"),
    ],
)
def test_bad_arguments(mutate, exc, match):
    v, m, b = mutate(*_tensors())
    with pytest.raises(exc, match=match):
        mod.sparse_gemm_fp4_fp8(v, m, b)


@INTERPRETER_ONLY
def test_bad_config_and_out():
    v, m, b = _tensors()
    with pytest.raises(ValueError, match="block_k"):
        mod.sparse_gemm_fp4_fp8(v, m, b, FusedConfig(64, 64, 256))
    with pytest.raises(ValueError, match="block_k"):
        mod.sparse_gemm_fp4_fp8(v, m, b, ExpandConfig(64, 64, 256))
    with pytest.raises(TypeError, match="out"):
        mod.sparse_gemm_fp4_fp8(v, m, b, out=torch.zeros(2, 3, dtype=torch.float32))
    with pytest.raises(ValueError, match="out.shape"):
        mod.sparse_gemm_fp4_fp8(v, m, b, out=torch.zeros(3, 2, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="nan_check_bytes"):
        mod.sparse_gemm_fp4_fp8(v, m, b, nan_check_bytes="x")
    with pytest.raises(TypeError, match=r"nan_check_bytes: .*got numpy\.bool.*pass bool"):
        mod.sparse_gemm_fp4_fp8(v, m, b, nan_check_bytes=np.bool_(True))
    with pytest.raises(TypeError, match="config"):
        mod.sparse_gemm_fp4_fp8(v, m, b, {"block_m": 64})
    # an out whose rows share memory (stride 0) would come back with one row repeated
    with pytest.raises(ValueError, match=r"out: strides \(0, 1\).*share memory"):
        mod.sparse_gemm_fp4_fp8(v, m, b, out=torch.zeros(1, 3, dtype=torch.bfloat16).expand(2, 3))
    got = mod.sparse_gemm_fp4_fp8(v, m, b, out=torch.zeros(3, 2, dtype=torch.bfloat16).t())  # column-major: fine
    assert torch.equal(got, mod.sparse_gemm_fp4_fp8(v, m, b))
    # the interpreter decodes NaN bytes as +-480: detection from the accumulator would miss them there
    with pytest.raises(ValueError, match="nan_check_bytes=False"):
        mod.sparse_gemm_fp4_fp8(v, m, b, nan_check_bytes=False)


@pytest.mark.parametrize("sizes, exc", [((0, 8, 8), ValueError), ((4, 0, 8), ValueError), ((4, 8, 6), ValueError),
                                        ((4, 8, 0), ValueError), ((1.5, 8, 8), TypeError), (("8", 8, 8), TypeError),
                                        ((True, 8, 8), TypeError)])
def test_pick_config_checks_the_sizes(sizes, exc):
    with pytest.raises(exc, match="M=|N=|K="):
        mod.pick_config(*sizes, interpreter=False)


def test_contract_names_a_known_model():
    from fp4ref.bounds import get_model

    assert get_model(CONTRACT).promote_every == mod.PROMOTION_INTERVAL
    K = 2048
    for cfg in dict.fromkeys(mod.CONFIGS.configs() + mod.TL_CONFIGS.configs()):
        if not isinstance(cfg, (mod.GluonConfig, mod.GemvConfig)):  # (Gluon: K steps of 128; GEMV: no MMA)
            assert cfg.block_k <= mod.PROMOTION_INTERVAL or (isinstance(cfg, FusedConfig) and cfg.mma != "fp8")
        assert get_model(mod.accumulation_model(cfg, K)).eps(K) <= get_model(CONTRACT).eps(K)
    # the contract answers through model_for: the table's config at each workload M, its own model
    for M in (1, 16, 64, 256, 4096):
        cfg = mod.NUMERIC_CONTRACT.config_for(M, 2048, K, False)
        assert cfg is mod.CONFIGS.pick(M)
        assert mod.NUMERIC_CONTRACT.model_for(cfg, K, False, M=M, N=2048).name == mod.accumulation_model(cfg, K)
    assert mod.NUMERIC_CONTRACT.config_for(4096, 2048, K, True) is mod.INTERPRETER_CONFIG


# ---------------------------------------------------------------------------------------------------------------
# sm_90 build on the CPU: every `tl` config the GPU can pick must compile (and use the MMA the contract assumes);
# the Gluon configs: tests/test_kernel_sparse_gemm_gluon.py
# ---------------------------------------------------------------------------------------------------------------
def _build(cfg, nan_check_bytes=False, even_k=True):
    from fp4ref.kernels._sm90 import compile_for_sm90

    sig = {"vals_ptr": "*i8", "meta_ptr": "*i8", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "ws_ptr": "*fp32",
           "lock_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32", "stride_ag": "constexpr",
           "stride_bn": "i32", "stride_bk": "constexpr", "stride_cm": "i32", "stride_cn": "constexpr"}
    consts = {"stride_ag": 1, "stride_bk": 1, "stride_cn": 1, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
              "BLOCK_K": cfg.block_k, "SPLIT_K": cfg.split_k, "GROUP_M": cfg.group_m,
              "MMA": mod.configs.MMA_KINDS[cfg.mma],
              "NAN_CHECK_BYTES": nan_check_bytes, "EVEN_K": even_k}
    div16 = [p for p, t in sig.items() if t.startswith("*")] + ["N", "K", "stride_am", "stride_bn", "stride_cm"]
    return compile_for_sm90(fused.sparse_gemm_fp4_fp8_kernel, sig, consts, num_warps=cfg.num_warps,
                            num_stages=cfg.num_stages, divisible_by_16=div16)


def _build_expand(cfg, nan_check_bytes=False, even_k=True):
    from fp4ref.kernels._sm90 import compile_for_sm90

    BM, BN, BK = cfg.block_m, cfg.block_n, cfg.block_k
    sig = {"a_desc": f"tensordesc<fp8e4nv[{BM}, {BK}]>", "b_desc": f"tensordesc<fp8e4nv[{BN // cfg.n_split}, {BK}]>",
           "vals_ptr": "*i8", "meta_ptr": "*i8", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "flag_ptr": "*i32",
           "M": "i32", "N": "i32", "K": "i32", "num_programs": "i32", "stride_am": "i32", "stride_ag": "constexpr",
           "stride_bn": "i32",
           "stride_bk": "constexpr", "stride_cm": "i32", "stride_cn": "constexpr"}
    consts = {"stride_ag": 1, "stride_bk": 1, "stride_cn": 1, "BLOCK_M": BM, "BLOCK_N": BN, "BLOCK_K": BK,
              "GROUP_M": cfg.group_m, "N_SPLIT": cfg.n_split,
              "INLINE_FIXUP": cfg.nan_fixup == "inline", "NAN_CHECK_BYTES": nan_check_bytes, "EVEN_K": even_k}
    div16 = ["vals_ptr", "meta_ptr", "b_ptr", "c_ptr", "flag_ptr", "N", "K", "stride_am", "stride_bn", "stride_cm"]
    return compile_for_sm90(expand.sparse_gemm_expanded_kernel, sig, consts, num_warps=cfg.num_warps,
                            num_stages=cfg.num_stages, divisible_by_16=div16)


def _cfg_id(c):
    return f"{c.block_m}x{c.block_n}x{c.block_k}{f'-expand-n{c.n_split}' if isinstance(c, ExpandConfig) else ''}"


@pytest.mark.parametrize("cfg", [c for c in mod.TL_CONFIGS.configs() if isinstance(c, ExpandConfig)], ids=_cfg_id)
def test_expand_configs_compile_for_sm90(cfg):
    """The persistent GEMM: TMA loads, fp8 wgmma with both operands from shared memory, the promotion into fp32
    every K-tile really in the build, within the shared-memory limit."""
    from fp4ref.kernels._sm90 import SM90_MAX_SHARED_BYTES

    ck = _build_expand(cfg)
    assert ck.asm["cubin"] and ck.metadata.shared <= SM90_MAX_SHARED_BYTES
    ptx, ttgir = ck.asm["ptx"], ck.asm["ttgir"]
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx and "e4m3.e4m3" in ptx
    # the fast loop is the first K loop inside the persistent loop: its fp8 dot reads A and B from shared memory
    # (ttng.warp_group_dot on !ttg.memdesc operands) into a fresh zero accumulator, added into fp32 per K-tile
    inner = ttgir.split("scf.for", 2)[2]
    fast = inner.split("scf.yield", 1)[0]
    dots = re.findall(r"ttng.warp_group_dot (.*)", fast)
    assert dots, "no wgmma dot in the fast K loop"
    assert all("!ttg.memdesc" in d.split("->")[0] and "f8E4M3FN" in d for d in dots), dots
    adds = re.findall(rf"arith.addf .*: tensor<{cfg.block_m}x{cfg.block_n // cfg.n_split}xf32, #mma", fast)
    assert len(dots) == len(adds) == cfg.n_split  # one promotion add per wgmma chain per K-tile


@pytest.mark.parametrize("cfg", [c for c in mod.TL_CONFIGS.configs()
                                 if isinstance(c, ExpandConfig) and c.nan_fixup == "launch"], ids=_cfg_id)
def test_expand_nan_fixup_compiles_for_sm90(cfg):
    from fp4ref.kernels._sm90 import SM90_MAX_SHARED_BYTES, compile_for_sm90

    sig = {"vals_ptr": "*i8", "meta_ptr": "*i8", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "flag_ptr": "*i32",
           "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32", "stride_ag": "constexpr", "stride_bn": "i32",
           "stride_bk": "constexpr", "stride_cm": "i32", "stride_cn": "constexpr"}
    consts = {"stride_ag": 1, "stride_bk": 1, "stride_cn": 1, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
              "BLOCK_K": cfg.block_k, "BN": cfg.block_n // cfg.n_split, "EVEN_K": True}
    ck = compile_for_sm90(expand.sparse_nan_fixup_kernel, sig, consts, num_warps=cfg.num_warps, num_stages=2,
                          divisible_by_16=["vals_ptr", "meta_ptr", "b_ptr", "c_ptr", "flag_ptr", "N", "K",
                                           "stride_am", "stride_bn", "stride_cm"])
    assert ck.asm["cubin"] and ck.metadata.shared <= SM90_MAX_SHARED_BYTES
    assert "wgmma.mma_async" in ck.asm["ptx"]


@pytest.mark.parametrize("trigger", [False, True], ids=["tl-gemm", "gluon-gemm-pdl"])
def test_expand_prepass_compiles_for_sm90(trigger):
    """The pre-pass with 16-byte loads and stores; ahead of the Gluon GEMM it lets it start
    (griddepcontrol.launch_dependents before any load), ahead of the `tl` GEMM it does not."""
    from fp4ref.kernels._sm90 import compile_for_sm90

    sig = {"vals_ptr": "*i8", "meta_ptr": "*i8", "a8w_ptr": "*i32", "M": "i32", "G": "i32", "stride_am": "i32",
           "stride_ag": "constexpr", "stride_wm": "i32"}
    ck = compile_for_sm90(expand.sparse_expand_a_kernel, sig,
                          {"stride_ag": 1, "BLOCK_M": expand.PREP_BLOCK_M, "BLOCK_G": expand.PREP_BLOCK_G,
                           "TRIGGER_DEPENDENTS": trigger},
                          num_warps=expand.PREP_WARPS, num_stages=1,
                          divisible_by_16=["vals_ptr", "meta_ptr", "a8w_ptr", "G", "stride_am", "stride_wm"])
    assert ck.asm["cubin"]
    ptx = ck.asm["ptx"]
    assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx  # 16-byte loads of vals/meta, stores of A
    assert ("griddepcontrol.launch_dependents" in ptx) == trigger
    if trigger:
        assert ptx.index("griddepcontrol.launch_dependents") < ptx.index("ld.global")
    # the duplicate-index sum is built with integer operations: on the H200, triton 3.6's packed fp16 -> E4M3FN
    # conversion gave wrong bytes (0xFC) for this kernel's tiles of >= 64 groups (docs/kernels.md)
    assert "e4m3x2.f16x2" not in ptx


@pytest.mark.parametrize("cfg", [c for c in mod.TL_CONFIGS.configs() + [mod.FALLBACK_CONFIG]
                                 if isinstance(c, FusedConfig)], ids=_cfg_id)
def test_configs_compile_for_sm90(cfg):
    ck = _build(cfg)
    assert ck.asm["cubin"]
    ptx = ck.asm["ptx"]
    if cfg.mma == "fma":  # no dot to pipeline for: 16-byte vector loads of b (a build without divisibility hints
        assert "ld.global.v4.b32" in ptx  # would load bytes one at a time)
    else:
        assert "cp.async" in ptx  # pipelined loads (a build without divisibility hints would not be the GPU's)
    assert "e4m3x2.f16x2" not in ptx  # no packed fp16 -> E4M3FN conversion in the decode (see the pre-pass test)
    if cfg.mma == "fp8":
        assert "wgmma.mma_async" in ptx and "e4m3.e4m3" in ptx
        # the promotion the contract assumes: inside the K loop, each fp8 dot chain starts from a zero accumulator
        # and its [BLOCK_M, BLOCK_N] result is added into the fp32 accumulator (arith.addf on the MMA layout)
        loop = ck.asm["ttgir"].split("scf.for", 1)[1]
        assert re.search(rf"arith.addf .*: tensor<{cfg.block_m}x{cfg.block_n}xf32, #mma", loop)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", mod.TL_CONFIGS.configs(), ids=_cfg_id)
def test_configs_compile_for_sm90_other_variants(cfg):
    build = _build_expand if isinstance(cfg, ExpandConfig) else _build
    assert build(cfg, nan_check_bytes=True, even_k=False).asm["cubin"]


# ---------------------------------------------------------------------------------------------------------------
# GPU: the workload sizes (random int8 bytes as the public benchmark feeds them, and canonical bytes)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("M", [1, 7, 16, 64, 100, 256, 1024, 4096, 8192])
@pytest.mark.parametrize("canonical", [False, True], ids=["random", "canonical"])
def test_gpu_workload_sizes(M, canonical):
    from fp4ref.kernels.sparse_gemm_fp4_fp8.bench import make_operands

    gen = torch.Generator(device="cuda").manual_seed(M * 2 + canonical)
    v, m, b = make_operands(M, 2048, 2048, gen, canonical=canonical)
    outs = []
    for _ in range(2):
        _workspace(mod.WS_PARTIALS, torch.float32).fill_(NAN)
        _workspace(mod.WS_DENSE_A, torch.float8_e4m3fn).view(torch.uint8).fill_(0x7F)  # E4M3FN NaN bytes
        out = torch.full((M, 2048), NAN, dtype=torch.bfloat16, device="cuda")
        outs.append(mod.sparse_gemm_fp4_fp8(v, m, b, out=out).cpu())
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))  # bitwise deterministic
    ref = reference(v.cpu().numpy(), m.cpu().numpy(), b.view(torch.uint8).cpu().numpy())
    check(outs[0], ref, CONTRACT, output_rounding="rne", poison=NAN).assert_ok()
