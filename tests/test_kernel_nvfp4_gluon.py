"""nvfp4_linear's Gluon path (GluonConfig, kernels/nvfp4_linear/gluon.py): W decoded in registers into wgmma.

CPU: every GluonConfig of CONFIGS (and the unswizzled and 8-warp variants, fused and not) is built for sm_90
(there is no Gluon interpreter): wgmma and TMA in the PTX, HGMMA and UTMALDG in the SASS, no spills, shared memory
within the limit; the fused kernel (FUSED_QUANT) also for fp32 / fp16 x and M = 1 (a constant after
specialisation), with IEEE divisions and no FTZ or FMA contraction in its PTX. The quantizer's permuted K order is
checked in the interpreter against numpy on every element; config checks.
GPU (``-m gpu``): every tabled M against fp4ref's exact NVFP4 reference (recipe "sol") under the config's model,
NaN-poisoned outputs, bitwise determinism, and an exact-accumulation case (integer-valued products whose fp32 sums
are exact) equal to the correctly rounded output. The fused kernel: bitwise equal to the unfused Gluon path (same
config otherwise) on adversarial x (zero blocks and rows, bf16 subnormals, E2M1 ties, huge and small amax, a
wide-range row) for every M = 1..16 and each x dtype, within the model against fp4ref, deterministic; and with
W = the identity every output is x's quantized value times the epilogue scale: each element of the in-kernel
quantization checked exactly against fp4ref's.
"""
from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
import torch

import fp4ref.kernels.nvfp4_linear as nvl
from fp4ref import bounds, gemm
from fp4ref.blockscale import nvfp4_quantize as ref_quantize
from fp4ref.kernels import _runtime
from fp4ref.kernels._sm90 import compile_for_sm90, gluon_tensordesc
from fp4ref.kernels.nvfp4_linear import gluon
from fp4ref.kernels.nvfp4_linear.quantize import AMAX_MAX_PROGRAMS, QuantizeLaunches
from _sm90_checks import assert_gluon_build  # tests/_sm90_checks.py

G = nvl.GluonConfig
CUDA = torch.cuda.is_available()
TABLE = [c for c in nvl.CONFIGS.configs() if isinstance(c, G)]
VARIANTS = [G(BN=64, BM=16, SPLIT_K=2, STAGES=3, W_SWIZZLE=False), G(BN=128, BM=16, SPLIT_K=2, STAGES=3, num_warps=8)]


FUSED_VARIANTS = [G(BN=64, BM=16, SPLIT_K=2, STAGES=3, W_SWIZZLE=False, FUSED_QUANT=True),
                  G(BN=128, BM=16, SPLIT_K=4, STAGES=3, num_warps=8, FUSED_QUANT=True),
                  G(BN=64, BM=8, SPLIT_K=8, STAGES=4, FUSED_QUANT=True)]


def _build(cfg, K=8192, x_dtype="*bf16", m_one=False):
    """The sm_90 build of cfg's kernel as the runtime specialises it (x_dtype, K and M = 1 matter to the fused
    kernel only: x's element type, X_STEPS = K / 256 / SPLIT_K, M a constant)."""
    wl, sl, xl = gluon.shared_layouts(cfg)
    sig = {"w_desc": gluon_tensordesc("u8", [cfg.BN, 128], wl), "s_desc": gluon_tensordesc("u8", [cfg.BN, 16], sl),
           "out_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
    ce = dict(BN=cfg.BN, BM=cfg.BM, SPLIT_K=cfg.SPLIT_K, STAGES=cfg.STAGES, W_SWIZZLE=cfg.W_SWIZZLE,
              num_warps=cfg.num_warps)
    if m_one:
        del sig["M"]
        ce["M"] = 1
    if cfg.FUSED_QUANT:
        return compile_for_sm90(gluon.nvfp4_gluon_fused_kernel, dict(sig, x_ptr=x_dtype, w_gdec="fp32"),
                                dict(ce, X_STEPS=K // 256 // cfg.SPLIT_K), num_warps=cfg.num_warps,
                                divisible_by_16=["x_ptr", "out_ptr", "part_ptr", "count_ptr", "N", "K"],
                                enable_fp_fusion=False, enable_reflect_ftz=False)  # as GluonLaunch
    sig.update(x_desc=gluon_tensordesc("fp16", [cfg.BM, 256], xl), gdec_ptr="*fp32")
    return compile_for_sm90(gluon.nvfp4_gluon_kernel, sig, ce, num_warps=cfg.num_warps,
                            divisible_by_16=["gdec_ptr", "out_ptr", "part_ptr", "count_ptr", "N", "K"])


@pytest.mark.parametrize("cfg", TABLE + VARIANTS + FUSED_VARIANTS, ids=repr)
def test_gluon_config_builds_for_sm90(cfg, record_property):
    # BM = 128: a 64 x 128 fp32 accumulator beside the decode's registers; ptxas spills ~70 words, and the H200
    # still measured it faster than two 64-row M tiles (docs/kernels.md): bounded, not zero
    ck = _build(cfg)
    info = assert_gluon_build(ck, max_spill_stores=0 if cfg.BM <= 64 else 127)
    record_property("sass", info)
    print(f"{cfg}: {info.get('regs')} registers, {info.get('spill_stores')} spill stores, "
          f"{ck.metadata.shared} bytes of shared memory")
    if cfg.FUSED_QUANT:
        assert ck.metadata.shared <= nvl.GLUON_MAX_SHARED_BYTES + 1024 and cfg.shared_bytes(8192) <= ck.metadata.shared
        _assert_quantizer_ptx(ck.asm["ptx"])


def _assert_quantizer_ptx(ptx):
    """The recipe's bits need IEEE divisions (div.rn.f32) and multiplies without FTZ, no FMA contraction."""
    __tracebackhide__ = True
    assert "div.rn.f32" in ptx and ".ftz" not in ptx and "div.full" not in ptx and "div.approx" not in ptx
    assert "fma.rn.f32" not in ptx and "mul.f32" not in ptx and "add.f32" not in ptx  # all .rn: no contraction


@pytest.mark.parametrize("x_dtype, m_one", [("*fp32", False), ("*fp16", False), ("*bf16", True)])
def test_gluon_fused_builds_for_each_x_dtype_and_m1(x_dtype, m_one):
    cfg = next(c for c in TABLE if c.FUSED_QUANT)
    ck = _build(cfg, x_dtype=x_dtype, m_one=m_one)
    assert_gluon_build(ck)
    _assert_quantizer_ptx(ck.asm["ptx"])


def _reference_permutation(K: int) -> np.ndarray:
    """dst[c] for every physical column c: within each 256-chunk p = 64 q + 4 i + 2 j1 + j0 -> 16 i + 8 j1 + 2 q +
    j0, spelled out digit by digit (independent of the kernel's formula)."""
    dst = np.empty(K, np.int64)
    for base in range(0, K, 256):
        for q in range(4):
            for i in range(16):
                for j1 in range(2):
                    for j0 in range(2):
                        dst[base + 64 * q + 4 * i + 2 * j1 + j0] = base + 16 * i + 8 * j1 + 2 * q + j0
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


def test_gluon_config_checks_and_model():
    with pytest.raises(ValueError, match="BN"):
        G(BN=128, BM=16, SPLIT_K=1, STAGES=3)  # 128 rows need 8 warps
    with pytest.raises(ValueError, match="BM"):
        G(BN=64, BM=256, SPLIT_K=1, STAGES=3)
    with pytest.raises(ValueError, match="STAGES"):
        G(BN=64, BM=16, SPLIT_K=1, STAGES=1)
    with pytest.raises(TypeError, match="W_SWIZZLE"):
        G(BN=64, BM=16, SPLIT_K=1, STAGES=2, W_SWIZZLE=1)
    with pytest.raises(TypeError, match="FUSED_QUANT"):
        G(BN=64, BM=16, SPLIT_K=1, STAGES=2, FUSED_QUANT=1)
    assert G(BN=64, BM=8, SPLIT_K=4, STAGES=4).fits(8192, 8192)
    assert not G(BN=64, BM=8, SPLIT_K=4, STAGES=4).fits(8192, 768)  # 3 steps do not split in 4
    assert not G(BN=64, BM=8, SPLIT_K=1, STAGES=4).fits(8192, 8192 + 128)
    assert nvl.accumulation_model(G(BN=64, BM=8, SPLIT_K=4, STAGES=4), 8192) == "splitk(hopper_fp16_wgmma, 2048)"
    assert nvl.accumulation_model(G(BN=64, BM=64, SPLIT_K=1, STAGES=4), 8192) == "hopper_fp16_wgmma"
    # fused: the whole x slice in shared memory; a config that cannot hold it gives way to its unfused twin
    f = G(BN=64, BM=16, SPLIT_K=2, STAGES=4, FUSED_QUANT=True)
    assert f.shared_bytes(8192) == 4 * 64 * 144 + 2 * 16 * 4096
    assert f.fits(8192, 8192) and not f.fits(8192, 16384) and G(BN=64, BM=16, SPLIT_K=2, STAGES=4).fits(8192, 16384)
    for m in range(1, 17):  # CONFIGS: M <= 16 fused, beyond not
        assert nvl.pick_config(m, 8192, 8192, interpreter=False).FUSED_QUANT
    assert not nvl.pick_config(17, 8192, 8192, interpreter=False).FUSED_QUANT
    big = nvl.pick_config(16, 8192, 16384, interpreter=False)
    assert big == dataclasses.replace(nvl.CONFIGS.pick(16), FUSED_QUANT=False)
    assert nvl.accumulation_model(f, 8192) == nvl.accumulation_model(G(BN=64, BM=16, SPLIT_K=2, STAGES=4), 8192)
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="Gluon path runs on CUDA"):
        nvl.nvfp4_linear(x, torch.zeros(64, 128, dtype=torch.uint8), torch.zeros(64, 16, dtype=torch.uint8), 1.0,
                         config=G(BN=64, BM=8, SPLIT_K=1, STAGES=2))


# ------------------------------------------------------------------------------------------------------- GPU
needs_gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (Hopper)")


@pytest.fixture(scope="module")
def weight():
    wq = ref_quantize(np.random.default_rng(99).standard_normal((2048, 8192), dtype=np.float32), recipe="sol")
    return wq, torch.from_numpy(wq.codes).cuda(), torch.from_numpy(wq.scales).view(torch.float8_e4m3fn).cuda()


def _bf16(t):
    return t.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("m, cfg", [(m, c) for m in (1, 5, 16, 32, 64, 100, 256) for c in TABLE + VARIANTS
                                    if m <= c.BM * 2 or c is nvl.pick_config(m, 2048, 8192, interpreter=False)])
def test_gluon_within_bound_and_deterministic(m, cfg, weight):
    wq, wc, ws = weight
    x_np = np.random.default_rng(m).standard_normal((m, 8192)).astype(np.float32).astype(ml_dtypes.bfloat16)
    x = torch.from_numpy(x_np.view(np.int16)).view(torch.bfloat16).cuda()
    outs = []
    for _ in range(2):
        out = torch.full((m, 2048), float("nan"), dtype=torch.bfloat16, device="cuda")
        nvl.nvfp4_linear(x, wc, ws, float(wq.global_decode_scale), config=cfg, out=out)
        outs.append(out)
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    ref = gemm.nvfp4_linear(x_np, wq.codes, wq.scales, float(wq.global_decode_scale), recipe="sol")
    bounds.check(_bf16(outs[0]), ref, nvl.accumulation_model(cfg, 8192), output_rounding="rne",
                 poison=float("nan")).assert_ok()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_gluon_exact_accumulation_is_correctly_rounded(m):
    """Every x block holds a 10.5 (tensor amax 10.5: global encode 256, a power of two; block amax 10.5: block scale
    448, so x's codes are {0, +-0.5, 6} and dequantized x a multiple of 224), W codes {0, +-0.5, +-1} with block
    scale 1 and global scale 1: every product is a multiple of 16 and every |partial sum| <= K * 2688 < 2^24 * 16,
    so the fp32 accumulation (and wgmma's 25-bit alignment) is exact, the epilogue multiplies by 2^-8 exactly, and
    the output must be the correctly rounded value."""
    rng = np.random.default_rng(7 + m)
    K, N = 8192, 1024
    codes = rng.choice(np.array([0, 1, 2, 8, 9, 10], np.uint8), size=(N, K))
    wc = torch.from_numpy((codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)).cuda()
    ws = torch.full((N, K // 16), 0x38, dtype=torch.uint8, device="cuda")  # E4M3 1.0
    xv = rng.choice(np.array([0, 0.5, 1, -0.5, -1], np.float32), size=(m, K))
    xv[:, ::16] = 10.5
    x_np = xv.astype(ml_dtypes.bfloat16)
    out = torch.full((m, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    nvl.nvfp4_linear(torch.from_numpy(x_np.view(np.int16)).view(torch.bfloat16).cuda(), wc, ws, 1.0, out=out)
    ref = gemm.nvfp4_linear(x_np, wc.cpu().numpy(), ws.cpu().numpy(), 1.0, recipe="sol")
    cfg = nvl.pick_config(m, N, K, interpreter=False)
    bounds.check(_bf16(out), ref, nvl.accumulation_model(cfg, K), output_rounding="rne", poison=float("nan"),
                 exact_accumulation=True).assert_ok()


# ------------------------------------------------------------------------------------------- GPU: fused quantizer
FUSED = [c for c in TABLE if c.FUSED_QUANT]
X_CASES = ("randn", "zero_blocks", "subnormal", "ties", "huge", "small", "wide_row")


def adversarial_x(case: str, m: int, k: int, seed: int = 0) -> np.ndarray:
    """x [m, k] float32 (every value bf16-exact) for the quantizer's corner cases:

    randn; zero_blocks: a third of the 16-blocks zero, row m - 1 all zero (when m > 1), -0.0 entries;
    subnormal: every value a bf16 subnormal (amax subnormal: global encode clamped to FLT_MAX, global decode an
    fp32 subnormal); ties: tensor amax 10.5 (global encode 256) and blocks of amax 6 * 2^j (block scale 2^(j + 8),
    encode 2^-j exactly) whose other elements are E2M1 ties t * 2^j, t in {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5}
    and their negatives; huge: amax ~2^100; small: amax ~2^-100; wide_row: row 0 spans 2^-126..2^100 (random
    exponents per element; the products stay finite in bf16), the other rows randn."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    if case == "zero_blocks":
        blocks = x.reshape(m, k // 16, 16)
        blocks[rng.random((m, k // 16)) < 1 / 3] = 0.0
        x[rng.random((m, k)) < 0.01] = -0.0
        if m > 1:
            x[m - 1] = 0.0
    elif case == "subnormal":
        bits = rng.integers(0, 128, (m, k), dtype=np.uint32) | (rng.integers(0, 2, (m, k), dtype=np.uint32) << 15)
        x = (bits << 16).view(np.float32)  # bf16 subnormals: exponent 0, mantissa 0..127, either sign
    elif case == "ties":
        t = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
        vals = rng.choice(np.concatenate([t, -t, [0.0]]).astype(np.float32), size=(m, k // 16, 16))
        vals[:, :, 0] = 6.0 * rng.choice([1.0, -1.0], size=(m, k // 16))  # block amax 6 * 2^j
        j = rng.integers(-3, 1, size=(m, k // 16, 1)).astype(np.float32)
        x = (vals * np.exp2(j)).reshape(m, k)
        x[0, 0] = 10.5  # the tensor amax (block scale 448)
    elif case == "huge":
        x *= np.float32(2.0**100)
    elif case == "small":
        x *= np.float32(2.0**-100)
    elif case == "wide_row":
        e = rng.integers(-126, 101, k).astype(np.float32)
        x[0] = rng.choice([-1.0, 1.0], k).astype(np.float32) * np.exp2(e) * (1 + rng.random(k).astype(np.float32))
    elif case != "randn":
        raise ValueError(f"case={case!r}: expected one of {X_CASES}")
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)  # bf16-exact (fp16: see _x_tensor)


def _x_tensor(x32: np.ndarray, dtype) -> torch.Tensor:
    if dtype == torch.float16:  # fp16 has a narrower range: rescale into it (still bf16-exact values)
        a = float(np.abs(x32).max())
        x32 = x32 * np.float32(2.0 ** (np.floor(np.log2(60000.0 / a)) if a > 60000 or 0 < a < 2.0**-10 else 0))
        return torch.from_numpy(x32.astype(np.float16)).cuda()
    return torch.from_numpy(x32).to(dtype).cuda()


def _run(x, wc, ws, w_gdec, cfg):
    out = torch.full((x.shape[0], wc.shape[0]), float("nan"), dtype=torch.bfloat16, device="cuda")
    nvl.nvfp4_linear(x, wc, ws, w_gdec, config=cfg, out=out)
    return out


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", X_CASES)
@pytest.mark.parametrize("cfg", FUSED, ids=repr)
def test_gluon_fused_equals_unfused_bitwise(case, cfg, weight):
    """Every M = 1..16 the config may serve (and a few beyond BM: several M tiles), bf16 x: the fused kernel's
    output bits equal the unfused Gluon path's (same tile, the quantizer's launches + TMA of x), NaN-poisoned
    output fully written, two calls bitwise equal; within the model against fp4ref on a subset of M (the
    subnormal case: bitwise only, its epilogue scale is an fp32 subnormal, outside the bound's model)."""
    wq, wc, ws = weight
    unfused = dataclasses.replace(cfg, FUSED_QUANT=False)
    for m in list(range(1, 17)) + [cfg.BM + 3]:
        x_np = adversarial_x(case, m, 8192, seed=m)
        x = _x_tensor(x_np, torch.bfloat16)
        got = _run(x, wc, ws, float(wq.global_decode_scale), cfg)
        again = _run(x, wc, ws, float(wq.global_decode_scale), cfg)
        want = _run(x, wc, ws, float(wq.global_decode_scale), unfused)
        assert not torch.isnan(got).any(), f"M={m}: output not fully written"
        assert torch.equal(got.view(torch.int16), again.view(torch.int16)), f"M={m}: not deterministic"
        diff = (got.view(torch.int16) != want.view(torch.int16)).nonzero()
        assert diff.numel() == 0, (f"M={m} {case}: {diff.shape[0]} outputs differ from the unfused path, first "
                                   f"{diff[:4].tolist()}: fused {got[tuple(diff[0])].item()} unfused "
                                   f"{want[tuple(diff[0])].item()}")
        if m in (1, 3, 8, 13, 16) and case != "subnormal":
            ref = gemm.nvfp4_linear(x_np.astype(ml_dtypes.bfloat16), wq.codes, wq.scales,
                                    float(wq.global_decode_scale), recipe="sol")
            bounds.check(_bf16(got), ref, nvl.accumulation_model(cfg, 8192), output_rounding="rne",
                         poison=float("nan")).assert_ok()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", ["randn", "zero_blocks", "ties", "wide_row"])
def test_gluon_fused_other_x_dtypes_bitwise(dtype, case, weight):
    """fp32 and fp16 x: fused == unfused bitwise (the widening differs per dtype), M 1, 5, 16."""
    wq, wc, ws = weight
    for m in (1, 5, 16):
        cfg = nvl.pick_config(m, 2048, 8192, interpreter=False)
        assert cfg.FUSED_QUANT
        x = _x_tensor(adversarial_x(case, m, 8192, seed=100 + m), dtype)
        got = _run(x, wc, ws, float(wq.global_decode_scale), cfg)
        want = _run(x, wc, ws, float(wq.global_decode_scale), dataclasses.replace(cfg, FUSED_QUANT=False))
        assert not torch.isnan(got).any()
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"M={m}"


@pytest.fixture(scope="module")
def identity_weight():
    """W = the identity [8192, 8192] in NVFP4: code 2 (E2M1 1.0) at (n, n), block scales 1.0 (0x38): y[m, n] =
    RNE_bf16(fp32(xq[m, n] * fp32(x_gdec * 1.0))), one exact product per output."""
    k = 8192
    codes = torch.zeros((k, k // 2), dtype=torch.uint8, device="cuda")
    n = torch.arange(k, device="cuda")
    codes[n, n // 2] = torch.where(n % 2 == 0, 2, 2 << 4).to(torch.uint8)
    return codes, torch.full((k, k // 16), 0x38, dtype=torch.uint8, device="cuda")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", X_CASES)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_gluon_quantized_x_exact_through_identity_weight(case, fused, identity_weight):
    """Each element of x's in-kernel quantization (fused) and of the quantizer's (unfused) against fp4ref's "sol"
    bytes: with W = I the output is the quantized x times the epilogue scale, which numpy computes exactly (fp32
    IEEE multiplies, subnormals kept; ml_dtypes' RNE to bf16). A wrong code or scale byte changes the value by a
    factor >= 1 + 1/8, which survives the rounding to bf16."""
    from fp4ref.blockscale import nvfp4_dequantize

    wc, ws = identity_weight
    for m in (1, 2, 7, 9, 16):
        cfg = nvl.pick_config(m, 8192, 8192, interpreter=False)
        cfg = cfg if fused else dataclasses.replace(cfg, FUSED_QUANT=False)
        x_np = adversarial_x(case, m, 8192, seed=7 * m)
        got = _run(_x_tensor(x_np, torch.bfloat16), wc, ws, 1.0, cfg)
        xq = ref_quantize(x_np.astype(ml_dtypes.bfloat16), recipe="sol")
        scale = np.float32(xq.global_decode_scale) * np.float32(1.0)
        xd = nvfp4_dequantize(dataclasses.replace(xq, global_decode_scale=np.float32(1.0)))  # exact
        want = (xd * scale).astype(np.float32).astype(ml_dtypes.bfloat16)
        g = _bf16(got)
        bad = np.argwhere(g.view(np.uint16) != want.view(np.uint16))
        assert bad.size == 0, (f"M={m} {case}: {len(bad)} elements differ, first {bad[:4].tolist()}: got "
                               f"{g[tuple(bad[0])]} want {want[tuple(bad[0])]} (x {x_np[tuple(bad[0])]})")
