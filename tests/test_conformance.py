"""Conformance against the real libraries: fp4ref's recipes and theirs, run on the same inputs, give the same bytes
or differ only in the one documented way, checked by name.

* torchao 0.18.0: ``nvfp4_quantize`` (recipes "torchao" two-level and "torchao-single-level") and ``to_mx``
  (5 element formats x FLOOR / CEIL / EVEN / RCEIL against fp4ref's modes; RCEIL against "rceil-torchao").
* NVIDIA ModelOpt 0.47.0: ``NVFP4QTensor.quantize`` (recipe "modelopt").

The ``dev`` extra installs both (CPU: neither needs CUDA). Each is skipped only where it is not installed.
Inputs: adversarial families (E2M1 ties, E4M3 block-scale ties, tiny and subnormal block and tensor amax, zero
blocks and -0.0,
lognormal across many binades), in float32 and bfloat16. The default sizes are modest; ``-m slow`` runs millions
of blocks (SIZES).

Documented differences (docs/quantization.md), each asserted where it occurs:
* ``torchao_nan_codes``: torchao 0.18 two-level when pts = A/2688 <= 2^-128: 1/pts = inf, a zero element becomes
  NaN and gets a NaN-derived code; fp4ref gives the zero code of the element's sign.
* ``mx_scale_byte_0``: MX blocks whose scale byte is 0: torchao divides by 2^-126 (FLOOR/CEIL/EVEN) or multiplies by
  1.0 (RCEIL); fp4ref divides by 2^-127 ("rceil-torchao" multiplies by 1.0 like torchao).
* ``rceil_float_log2``: torchao's eager RCEIL takes ceil of the fp32 log2, one below fp4ref's exact "rceil" scale
  byte just above powers of two.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp4ref.blockscale import MX_ELEMENTS, mx_quantize, nvfp4_quantize
from fp4ref.formats import E4M3FN, decode, encode
from fp4ref.packing import pack_fp4, unpack_fp4

torch = pytest.importorskip("torch")

_E2M1_TIES = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def _ulps(rng, shape, k=3):
    return 1.0 + rng.integers(-k, k + 1, shape) * 2.0**-23


def _signs(rng, shape):
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0)


def families(rows: int, k: int, seed: int) -> dict:
    """name -> float32 [rows, k] (k a multiple of 32): the adversarial input families."""
    rng = np.random.default_rng(seed)
    nb = k // 16
    out = {}
    # E2M1 ties: elements at tie * (block amax / 6) +- a few ulps; the block amax is a random E4M3 value times the
    # global scale A/2688 times 6, so block scales land on E4M3 values and elements on E2M1 ties
    A = np.float32(np.exp(rng.uniform(-10, 10)))
    g = np.float64(A) / 2688.0
    svals = decode(rng.integers(8, 0x7F, (rows, nb)).astype(np.uint8), E4M3FN, np.float64)
    x = _E2M1_TIES[rng.integers(0, 7, (rows, nb, 16))] * (svals * g)[..., None] * _ulps(rng, (rows, nb, 16))
    x *= _signs(rng, x.shape)
    x[..., 0] = 6.0 * svals * g * _ulps(rng, (rows, nb))
    x = x.reshape(rows, k)
    x[0, 0] = A
    out["e2m1_ties"] = x.astype(np.float32)
    # E4M3 ties: block amax / 6 / (A/2688) at the midpoint of two E4M3 values +- a few ulps
    lo = decode(np.arange(1, 0x7E, dtype=np.uint8), E4M3FN, np.float64)
    hi = decode(np.arange(2, 0x7F, dtype=np.uint8), E4M3FN, np.float64)
    mids = (lo + hi) / 2
    a = 6.0 * g * mids[rng.integers(0, mids.size, (rows, nb))] * _ulps(rng, (rows, nb), 2)
    x = rng.uniform(-1, 1, (rows, nb, 16)) * a[..., None]
    x[..., 0] = a
    x = x.reshape(rows, k)
    x[0, 0] = A
    out["e4m3_ties"] = x.astype(np.float32)
    # tiny and subnormal: tensor amax from 2^-110 down to 2^-135 (torchao 0.18's 1/pts overflows below ~2^-116.6)
    e = rng.integers(-135, -110, (rows, 1))
    out["tiny"] = (rng.standard_normal((rows, k)) * np.ldexp(1.0, e)).astype(np.float32)
    # a whole tensor that tiny: amax in [2^-136, 2^-118], so torchao 0.18's pts = A/2688 <= 2^-128 (1/pts = inf)
    e = rng.integers(-136, -121, (rows, 1))
    x = rng.standard_normal((rows, k)) * np.ldexp(1.0, e)
    x.reshape(rows, nb, 16)[rng.random((rows, nb)) < 0.2] = 0.0
    out["tiny_tensor"] = x.astype(np.float32)
    # zero blocks, zero rows, -0.0 and negatives that round to zero
    x = rng.standard_normal((rows, k)) * np.exp(rng.standard_normal((rows, 1)))
    x.reshape(rows, nb, 16)[rng.random((rows, nb)) < 0.3] = 0.0
    x[rng.random((rows, k)) < 0.1] = -0.0
    small = rng.random((rows, k)) < 0.05
    x[small] = -1e-6 * rng.random(int(small.sum()))
    out["zeros"] = x.astype(np.float32)
    # lognormal across many binades, per element
    out["lognormal"] = (_signs(rng, (rows, k)) * np.exp(rng.standard_normal((rows, k)) * 6.0)).astype(np.float32)
    return out


def _as(x: np.ndarray, dtype: str):
    """(torch tensor, numpy array for fp4ref) holding the same values."""
    if dtype == "bfloat16":
        xb = x.astype(ml_dtypes.bfloat16)
        return torch.from_numpy(xb.astype(np.float32)).to(torch.bfloat16), xb
    return torch.from_numpy(x.copy()), x


# NVFP4 blocks per family and dtype: 1,024 by default; 262,144 with -m slow (3.1 million over the 12 runs, plus
# 131,072 MX blocks per element format and mode in each)
SIZES = {"default": (32, 512), "slow": (1024, 4096)}


# ----------------------------------------------------------------------------------------------------- torchao NVFP4


def _torchao_nvfp4(x_t, two_level: bool):
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize as tq, per_tensor_amax_to_scale

    pts = per_tensor_amax_to_scale(torch.max(torch.abs(x_t))) if two_level else None
    scales, data = tq(x_t, 16, pts)
    return scales.view(torch.uint8).numpy().reshape(x_t.shape[0], -1), data.numpy(), pts


def check_torchao_nvfp4(x: np.ndarray, dtype: str) -> dict:
    pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    x_t, x_n = _as(x, dtype)
    seen = {}
    for recipe, two_level in (("torchao", True), ("torchao-single-level", False)):
        s_ao, c_ao, pts = _torchao_nvfp4(x_t, two_level)
        t = nvfp4_quantize(x_n, recipe=recipe)
        np.testing.assert_array_equal(t.scales, s_ao, err_msg=f"{recipe} scale bytes")
        if two_level:
            assert np.float32(t.global_decode_scale) == np.float32(pts.item())
        ours, theirs = unpack_fp4(t.codes), unpack_fp4(c_ao)
        diff = ours != theirs
        if two_level and pts.item() <= 2.0**-128:
            # torchao_nan_codes: only zero elements, which fp4ref gives the zero code of their sign
            xf = x_n.astype(np.float32)
            assert np.all(xf[diff] == 0), "torchao_nan_codes: only zero elements differ"
            np.testing.assert_array_equal(ours[xf == 0], np.where(np.signbit(xf[xf == 0]), 8, 0))
            seen["torchao_nan_codes"] = int(diff.sum())
            continue
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{recipe} element codes")
    return seen


# ----------------------------------------------------------------------------------------------------- torchao MX


def _torchao_mx(x_t, elem: str, mode: str):
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    dt = {"e2m1": torch.float4_e2m1fn_x2, "e2m3": DTYPE_FP6_E2M3, "e3m2": DTYPE_FP6_E3M2,
          "e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[elem]
    scale, data = to_mx(x_t, dt, 32, ScaleCalculationMode[mode.upper()])
    codes = data.contiguous().view(torch.uint8).numpy()
    return scale.view(torch.uint8).numpy().reshape(x_t.shape[0], -1), codes


def _fp4ref_mx_codes(t, elem):
    return pack_fp4(t.codes) if elem == "e2m1" else t.codes


def check_torchao_mx(x: np.ndarray, dtype: str, elem: str) -> dict:
    pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    x_t, x_n = _as(x, dtype)
    fmt = MX_ELEMENTS[elem]
    xf = np.asarray(x_n, np.float32)
    seen = {}
    for mode in ("floor", "ceil", "even", "rceil"):
        s_ao, c_ao = _torchao_mx(x_t, elem, mode)
        ours_mode = "rceil-torchao" if mode == "rceil" else mode
        t = mx_quantize(x_n, elem, mode=ours_mode)
        np.testing.assert_array_equal(t.scales, s_ao, err_msg=f"{elem} {ours_mode} scale bytes")
        # mx_scale_byte_0: torchao divides by 2^-126 (floor/ceil/even); rceil-torchao already multiplies by 1.0
        zero = np.repeat(t.scales == 0, 32, axis=1)
        want = _fp4ref_mx_codes(t, elem).copy()
        if mode != "rceil" and zero.any():
            alt = encode(np.clip(xf.astype(np.float64) * 2.0**126, -fmt.max, fmt.max), fmt, saturate=True)
            codes = np.where(zero, alt, t.codes)
            want = pack_fp4(codes) if elem == "e2m1" else codes
            if not np.array_equal(want, _fp4ref_mx_codes(t, elem)):
                seen["mx_scale_byte_0"] = seen.get("mx_scale_byte_0", 0) + 1
        np.testing.assert_array_equal(want, c_ao, err_msg=f"{elem} {ours_mode} element codes")
        if mode == "rceil":  # rceil_float_log2: the exact cuBLAS mode is one byte above where torchao's log2 errs
            exact = mx_quantize(x_n, elem, mode="rceil").scales
            d = exact != s_ao
            assert np.all(exact[d].astype(int) == s_ao[d].astype(int) + 1)
            if d.any():
                seen["rceil_float_log2"] = int(d.sum())
    return seen


# ----------------------------------------------------------------------------------------------------- ModelOpt


def check_modelopt(x: np.ndarray, dtype: str) -> dict:
    mo = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor")
    x_t, x_n = _as(x, dtype)
    q, s, s2 = mo.NVFP4QTensor.quantize(x_t, 16)
    t = nvfp4_quantize(x_n, recipe="modelopt")
    xf = x_n.astype(np.float32)
    sf2 = np.float32(s2.item())
    if sf2 == 0 and np.any(xf != 0):
        # modelopt_zero_global_scale: A / 2688 rounds to 0; ModelOpt keeps sf2 = 0 (every code from x / 0), fp4ref
        # uses 1 (its policy at A == 0)
        assert float(t.global_decode_scale) == 1.0
        return {"modelopt_zero_global_scale": 1}
    np.testing.assert_array_equal(t.scales, s.view(torch.uint8).numpy(), err_msg="modelopt scale bytes")
    assert np.float32(t.global_decode_scale) == sf2
    ours, theirs = unpack_fp4(t.codes), unpack_fp4(q._quantized_data.numpy())
    diff = ours != theirs
    if not diff.any():
        return {}
    # modelopt_nan_codes: only zero elements of blocks whose fp32(s) * sf2 rounds to 0, where ModelOpt's 0 / 0 is
    # NaN, cast to 0x7; fp4ref gives them 0x0
    under = np.repeat(decode(t.scales, E4M3FN).astype(np.float32) * sf2 == 0, 16, axis=-1)
    assert not np.any(diff & ~(under & (xf == 0))), "modelopt element codes: only 0 / 0 elements differ"
    assert np.all(theirs[diff] == 7) and np.all(ours[diff] == 0)
    return {"modelopt_nan_codes": int(diff.sum())}


# ----------------------------------------------------------------------------------------------------- tests

FAMILIES = ["e2m1_ties", "e4m3_ties", "tiny", "tiny_tensor", "zeros", "lognormal"]
DTYPES = ["float32", "bfloat16"]


def _run(size: str, family: str, dtype: str, seed: int, check, *args) -> dict:
    rows, k = SIZES[size]
    x = families(rows, k, seed)[family]
    return check(x, dtype, *args) or {}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_torchao_nvfp4(family, dtype):
    _run("default", family, dtype, 1, check_torchao_nvfp4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_modelopt_nvfp4(family, dtype):
    _run("default", family, dtype, 2, check_modelopt)


@pytest.mark.parametrize("elem", list(MX_ELEMENTS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_torchao_mx(family, dtype, elem):
    _run("default", family, dtype, 3, check_torchao_mx, elem)


def test_documented_differences_occur():
    # each named difference shows up on its family (so the checks above are not vacuous)
    seen = {}
    seen.update(check_torchao_nvfp4(families(32, 512, 1)["tiny_tensor"], "float32"))
    for elem in ("e2m1", "e4m3fn", "e5m2"):
        seen.update(check_torchao_mx(families(32, 512, 3)["tiny"], "float32", elem))
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = np.array([0x0DC00001], np.uint32).view(np.float32)[0]  # the documented RCEIL vector
    seen.update(check_torchao_mx(x, "float32", "e2m1"))
    # ModelOpt's tiny tensors: a block of one 2^-149 among zeros beside a block of amax 2^-130 (s * sf2 = 0 in the
    # second); a tensor amax of 2^-140 (A / 2688 = 0)
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 16] = 2.0**-130, 2.0**-149
    seen.update(check_modelopt(x, "float32"))
    x[0, 0] = 2.0**-140
    seen.update(check_modelopt(x, "float32"))
    assert {"torchao_nan_codes", "mx_scale_byte_0", "rceil_float_log2", "modelopt_nan_codes",
            "modelopt_zero_global_scale"} <= set(seen), seen


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_thorough_million_blocks(family, dtype):
    _run("slow", family, dtype, 11, check_torchao_nvfp4)
    _run("slow", family, dtype, 12, check_modelopt)
    for elem in MX_ELEMENTS:
        _run("slow", family, dtype, 13, check_torchao_mx, elem)
