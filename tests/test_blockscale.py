"""NVFP4 recipes and MX modes (fp4ref.blockscale).

Expected values come from (a) tests/_nvfp4_sim.py, a scalar model of each recipe in exact rational arithmetic, (b)
literal bytes derived with that model and listed in docs/quantization.md, (c) a line-by-line torch transcription of
each source's fp32 order (when torch is installed), (d) ml_dtypes casts and exact integer exponent arithmetic for MX,
(e) the public bug vectors (bug reports against the libraries; docs/quantization.md).
"""
from __future__ import annotations

import itertools
import math
import re
import struct
import zlib
from fractions import Fraction as Q

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import _nvfp4_sim as sim
from fp4ref.blockscale import (
    MX_ELEMENTS,
    MXMode,
    NVFP4Recipe,
    NVFP4Tensor,
    mx_dequantize,
    mx_quantize,
    nvfp4_dequantize,
    nvfp4_quantize,
)
from fp4ref import tables
from fp4ref.packing import unpack_fp4

RECIPES = [r.value for r in NVFP4Recipe]
assert RECIPES[:2] == ["te", "sol"] and "torchao-0.16" in RECIPES and "te-4over6" in RECIPES


def f32(h: int) -> float:
    return struct.unpack("<f", struct.pack("<I", h))[0]


def row(block0: list[int], block1: list[int]) -> np.ndarray:
    """A [1, 32] float32 row from the bit patterns of two 16-element blocks (zeros appended)."""
    bits = (block0 + [0] * 16)[:16] + (block1 + [0] * 16)[:16]
    return np.array(bits, dtype=np.uint32).view(np.float32)[None, :]


# ------------------------------------------------------------------------------------------ cross-recipe differences
# Each case: block 0 holds the tensor amax A (its only non-zero element); block 1 is the probe.
# Expected: per recipe, (scale byte of block 1, codes of block 1's first two elements). Found by a random search over
# block amaxes and near-tie elements, bytes derived with the exact-rational model (asserted below as well).
# Block 0's scale byte is 126 (0x7E = 448) and its first code 7 (+6) in every recipe and case.
CROSS_CASES = {
    # te: 84.29401 * (S_enc * fp32(1/6)) = 272.00003 -> 288 (0x79); sol: (84.29401/6) * S_enc = 272.0 exactly, a tie
    # between 256 and 288 -> even -> 256 (0x78).
    "te_sol_tie_272": (
        [0x430AD652], [0x42A89688],
        {"te": (121, [7, 0]), "sol": (120, [7, 0]), "torchao-0.16": (120, [7, 0]), "modelopt": (120, [7, 0]),
         "exact": (120, [7, 0])},
    ),
    # te's scale product rounds below the tie the others (and the exact quotient) land on the other side of.
    "scale_te_and_exact_vs_rest": (
        [0x427550F8], [0x416C8E13],
        {"te": (109, [7, 0]), "sol": (110, [7, 0]), "torchao-0.16": (110, [7, 0]), "modelopt": (110, [7, 0]),
         "exact": (109, [7, 0])},
    ),
    "scale_exact_vs_rest": (
        [0x42494B57], [0x4133BA20],
        {"te": (108, [7, 0]), "sol": (108, [7, 0]), "torchao-0.16": (108, [7, 0]), "modelopt": (108, [7, 0]),
         "exact": (109, [7, 0])},
    ),
    # modelopt divides once by (6 * sf2); torchao divides twice ((a/6)/pts).
    "scale_modelopt_vs_rest": (
        [0x403F934F], [0x3DE8A098],
        {"te": (89, [7, 0]), "sol": (89, [7, 0]), "torchao-0.16": (89, [7, 0]), "modelopt": (88, [7, 0]),
         "exact": (89, [7, 0])},
    ),
    # A/2688 (torchao, modelopt) vs 1/(2688/A) (te, sol) as the global scale.
    "scale_global_division": (
        [0x3EF8E674], [0x3E3AACD8],
        {"te": (115, [7, 0]), "sol": (115, [7, 0]), "torchao-0.16": (114, [7, 0]), "modelopt": (114, [7, 0]),
         "exact": (115, [7, 0])},
    ),
    # element 0x39992FAC sits just above an E2M1 tie (0.25) in exact arithmetic; every fp32 order rounds onto the tie.
    "element_exact_vs_rest": (
        [0x3C123924], [0x3BEA6351, 0x39992FAC],
        {"te": (123, [7, 0]), "sol": (123, [7, 0]), "torchao-0.16": (123, [7, 0]), "modelopt": (123, [7, 0]),
         "exact": (123, [7, 1])},
    ),
    # x * (1/(s*S_dec)) (te, sol) vs x / (s*g) (torchao, modelopt): the reciprocal multiply lands on the tie.
    "element_reciprocal_vs_division": (
        [0x3C123924], [0x3BAA5F97, 0x395ED0FB],
        {"te": (120, [7, 0]), "sol": (120, [7, 0]), "torchao-0.16": (120, [7, 1]), "modelopt": (120, [7, 1]),
         "exact": (120, [7, 1])},
    ),
    # policy: an all-zero block in a non-zero tensor (te/sol/exact 0x00, torchao floor 2^-6 = 0x08, modelopt 1.0 = 0x38)
    "zero_block": (
        [0x40C00000], [],
        {"te": (0x00, [0, 0]), "sol": (0x00, [0, 0]), "torchao-0.16": (0x08, [0, 0]), "modelopt": (0x38, [0, 0]),
         "exact": (0x00, [0, 0])},
    ),
    # policy: -0.0 (te, sol, modelopt -> 0x0; torchao, exact keep the sign -> 0x8) and -0.1 (all 0x8)
    "negative_zero": (
        [0x40C00000], [0x40C00000, 0x80000000, 0xBDCCCCCD],
        {"te": (126, [7, 0]), "sol": (126, [7, 0]), "torchao-0.16": (126, [7, 8]), "modelopt": (126, [7, 0]),
         "exact": (126, [7, 8])},
    ),
}

# The first two elements of the negative_zero case's block 1 are checked above; its third (-0.1) is 0x8 everywhere.


def _unpacked(t: NVFP4Tensor) -> np.ndarray:
    return unpack_fp4(t.codes)


@pytest.mark.parametrize("name", list(CROSS_CASES))
def test_cross_recipe_bytes(name):
    b0, b1, want = CROSS_CASES[name]
    x = row(b0, b1)
    x0 = x.copy()
    for recipe in want:
        t = nvfp4_quantize(x, recipe=recipe)
        scale, codes = want[recipe]
        assert t.scales.tolist() == [[126, scale]], (name, recipe, t.scales)
        c = _unpacked(t)[0]
        assert c[0] == 7
        assert c[16:18].tolist() == codes, (name, recipe, c[16:18])
        # the independent model gives the same bytes (so the literals above are derived, not copied from the code)
        s_sim, c_sim, g_sim = sim.quantize_row([float(v) for v in x[0]], recipe)
        assert s_sim == [126, scale] and c_sim[16:18] == codes, (name, recipe)
        assert c.tolist() == c_sim
        assert Q(float(t.global_decode_scale)) == g_sim
    np.testing.assert_array_equal(x, x0)


def _sim_case_bytes(case, recipe):
    x = tables.nvfp4_case_row(case)
    s_sim, c_sim, _ = sim.quantize_row([float(v) for v in x[0]], recipe)
    n = max(2, len(case[2]))
    return s_sim[0], s_sim[1], tuple(c_sim[16:16 + n])


@pytest.mark.parametrize("case", tables.NVFP4_CASES, ids=[c[0] for c in tables.NVFP4_CASES])
def test_documented_cases_match_the_model(case):
    # docs/quantization.md's case table shows fp4ref's bytes; the exact-rational model of each source agrees
    for recipe in RECIPES:
        assert tables.nvfp4_case_bytes(case, recipe) == _sim_case_bytes(case, recipe), recipe


def test_every_pair_of_recipes_differs_somewhere():
    got = [{r: _sim_case_bytes(case, r) for r in RECIPES} for case in tables.NVFP4_CASES]
    pairs = set(itertools.combinations(RECIPES, 2))
    differ = {(a, b) for g in got for a, b in pairs if g[a] != g[b]}
    assert differ == pairs
    # arithmetic order alone (the policy cases aside) separates every pair too
    arith = {(a, b) for case, g in zip(tables.NVFP4_CASES, got) if "(policy)" not in case[0]
             for a, b in pairs if g[a] != g[b]}
    assert arith == pairs
    # the 4over6 cases show each choice: map-to-4 (a 1.5x larger scale byte than sol's) and MAE != MSE
    by_name = {c[0]: g for c, g in zip(tables.NVFP4_CASES, got)}
    assert by_name["te vs sol: 272 tie"]["te-4over6"][1] > by_name["te vs sol: 272 tie"]["sol"][1]
    assert by_name["4over6: MAE vs MSE (e4m3_max 256)"]["te-4over6-256"] != \
        by_name["4over6: MAE vs MSE (e4m3_max 256)"]["te-4over6-mse-256"]


def test_tiny_amax_torchao_policy():
    # A = 2^-118: torchao 0.18's pts = A/2688 <= 2^-128, so 1/pts = inf: non-zero x -> +-6 (reproduced), x = 0 gives
    # NaN in the source and the zero code in fp4ref; torchao-0.16 divides and stays finite
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 16], x[0, 17], x[0, 18], x[0, 19] = 2.0**-118, 2.0**-119, -(2.0**-121), 0.0, -0.0
    c = _unpacked(nvfp4_quantize(x, recipe="torchao"))[0]
    assert c[16:20].tolist() == [7, 15, 0, 8]
    c16 = _unpacked(nvfp4_quantize(x, recipe="torchao-0.16"))[0]
    # pts = fp32(2^-118 / 2688) (subnormal), s = e4m3((2^-119 / 6) / pts) = 224, so -2^-121 / (pts * 224) is -1.5
    # to within 2^-19 relative: code 0xB
    assert c16[16:20].tolist() == [7, 11, 0, 8]


# ------------------------------------------------------------------------------------------ model vs implementation


def adversarial_rows(rng, nrows=6, nblocks=3):
    """Rows with varied magnitudes, zero blocks, signed zeros, subnormals and near-tie elements."""
    rows = []
    for i in range(nrows):
        scale = 2.0 ** rng.integers(-30, 30)
        x = (rng.standard_normal(16 * nblocks) * scale).astype(np.float32)
        if i % 3 == 0:
            x[16:32] = 0.0
            x[17] = -0.0
        if i % 3 == 1:
            # near E2M1 ties relative to the block's max
            a = np.float32(abs(x[0]) + 1.0 * scale)
            x[0] = a
            ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]) / 6.0
            x[1:8] = (a * ties * (1 + rng.integers(-2, 3, 7) * 2.0**-23)).astype(np.float32)
        if i % 3 == 2:
            x[5] = np.float32(1e-40)  # subnormal
            x[6] = -np.float32(1e-45)
        rows.append(x)
    return np.stack(rows)


@pytest.mark.parametrize("recipe", RECIPES)
def test_matches_exact_rational_model(recipe):
    rng = np.random.default_rng(12345)
    x = adversarial_rows(rng)
    for r in range(x.shape[0]):
        t = nvfp4_quantize(x[r:r + 1], recipe=recipe)
        s_sim, c_sim, g_sim = sim.quantize_row([float(v) for v in x[r]], recipe)
        assert t.scales[0].tolist() == s_sim, (recipe, r)
        assert _unpacked(t)[0].tolist() == c_sim, (recipe, r)
        assert Q(float(t.global_decode_scale)) == g_sim


@pytest.mark.parametrize("recipe", RECIPES)
def test_global_amax_argument_and_saturation(recipe):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((1, 48)) * 3).astype(np.float32)
    amax = float(np.max(np.abs(x)))
    if "single-level" in recipe:  # no global scale: a global amax is refused
        with pytest.raises(ValueError, match="global_amax=.*no global scale"):
            nvfp4_quantize(x, recipe=recipe, global_amax=amax)
        return
    # 0 (or NaN / inf) with non-zero data raises, naming global_amax; with all-zero data 0 is fine
    for bad in (0.0, 0, float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="global_amax="):
            nvfp4_quantize(x, recipe=recipe, global_amax=bad)
    z = nvfp4_quantize(np.zeros((1, 16), np.float32), recipe=recipe, global_amax=0.0)
    assert not np.any(nvfp4_dequantize(z))
    # a calibrated amax half the true one: blocks above it saturate (scale 448 / elements +-6) in every recipe
    t = nvfp4_quantize(x, recipe=recipe, global_amax=amax / 2)
    s_sim, c_sim, _ = sim.quantize_row([float(v) for v in x[0]], recipe, A=Q(float(np.float32(amax / 2))))
    assert t.scales[0].tolist() == s_sim
    assert _unpacked(t)[0].tolist() == c_sim
    # the default equals passing the true amax
    a = nvfp4_quantize(x, recipe=recipe)
    b = nvfp4_quantize(x, recipe=recipe, global_amax=amax)
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(a.scales, b.scales)
    with pytest.raises(ValueError, match="global_amax"):
        nvfp4_quantize(x, recipe=recipe, global_amax=-1.0)
    with pytest.raises(ValueError, match="global_amax"):
        nvfp4_quantize(x, recipe=recipe, global_amax=float("inf"))


def test_global_amax_takes_ints_as_reals_and_refuses_other_types():
    """global_amax is a real scalar, as weight_global_decode_scale of gemm.nvfp4_linear: a Python or numpy int is
    its value (same bytes as the float), a bool, str or array a TypeError naming it; an int beyond float64 (and so
    beyond float32) a ValueError naming it, as inf is (it was an OverflowError from the float32 cast)."""
    x = np.linspace(-5, 5, 32, dtype=np.float32).reshape(1, 32)
    want = nvfp4_quantize(x, global_amax=12.0)
    for amax in (12, np.int32(12), np.uint64(12)):
        t = nvfp4_quantize(x, global_amax=amax)
        np.testing.assert_array_equal(t.codes, want.codes)
        np.testing.assert_array_equal(t.scales, want.scales)
        assert t.global_decode_scale == want.global_decode_scale
    for bad in (True, np.bool_(True), "12.0", np.array([12.0])):
        with pytest.raises(TypeError, match="^global_amax must be a real number"):
            nvfp4_quantize(x, global_amax=bad)
    for huge in (10**400, -10**400, 10**39):
        with pytest.raises(ValueError, match="^global_amax=.*must be finite and >= 0"):
            nvfp4_quantize(x, global_amax=huge)


def _modelopt_sf2(a: float) -> np.float32:
    """ModelOpt's stored global decode scale for amax ``a``: fp32(fp32(a) / (6 * 448))."""
    return np.float32(np.float32(a) / np.float32(6 * 448))


# (0-d value, the float32 value its element has, exactly): the element is read bit for bit and rounded to float32
# once, as the Python number would be (1 + 2^-11 + 2^-40 rounded through float16 first would give 1 + 2^-10)
ZERO_D = [
    (np.array(1 + 2.0**-11 + 2.0**-40), 1 + 2.0**-11),
    (np.array(12.0, np.float32), 12.0),
    (np.array(65504.0, np.float16), 65504.0),
    (np.array(3.015625, ml_dtypes.bfloat16), 3.015625),
    (np.array(448.0, ml_dtypes.float8_e4m3fn), 448.0),
    (np.array(100, np.int8), 100.0),
    (np.array(2**40 + 1, np.uint64), 2.0**40),
    (ml_dtypes.bfloat16(3.015625), 3.015625),  # a bf16 array's .max() is this numpy scalar
]
NOT_SCALARS = [True, np.bool_(True), np.array(True), np.array(2 + 0j), np.complex64(2), np.array("2"),
               np.array(2.0, dtype=object), np.array([2.0]), np.array([[2.0]]), np.array([2.0, 3.0]), [2.0]]


@pytest.mark.parametrize("v,a32", ZERO_D)
def test_global_amax_takes_a_0d_array_as_its_element(v, a32):
    """global_amax given as a 0-d numpy array of any real dtype (or an ml_dtypes scalar) is its element: the same
    bytes as the Python float, the global decode scale amax / 2688 of that element's float32 value."""
    x = np.linspace(-5, 5, 64, dtype=np.float32).reshape(2, 32)
    want = nvfp4_quantize(x, recipe="modelopt", global_amax=a32)
    t = nvfp4_quantize(x, recipe="modelopt", global_amax=v)
    assert t.global_decode_scale == _modelopt_sf2(a32)
    np.testing.assert_array_equal(t.codes, want.codes)
    np.testing.assert_array_equal(t.scales, want.scales)


@pytest.mark.parametrize("bad", NOT_SCALARS, ids=repr)
def test_global_amax_refuses_bools_non_reals_and_arrays_with_dimensions(bad):
    """A 1-element 1-d array is not a scalar; bool, complex, str and object are not reals: TypeErrors naming it."""
    x = np.ones((1, 32), np.float32)
    with pytest.raises(TypeError, match="^global_amax must be a real number"):
        nvfp4_quantize(x, global_amax=bad)


def test_global_amax_takes_a_0d_torch_tensor_as_its_element():
    """``w.abs().max()`` in torch is a 0-d tensor: read as its element (bf16, fp16, fp32, fp64, int, e8m0 and
    a tensor that requires grad); a bool tensor and one with dimensions are refused, naming the argument."""
    torch = pytest.importorskip("torch")
    x = np.linspace(-5, 5, 64, dtype=np.float32).reshape(2, 32)
    w = torch.tensor([[-3.015625, 1.0]], dtype=torch.bfloat16)
    for v, a32 in ((w.abs().max(), 3.015625), (torch.tensor(1 + 2.0**-11 + 2.0**-40, dtype=torch.float64),
                                               1 + 2.0**-11),
                   (torch.tensor(65504.0, dtype=torch.float16), 65504.0), (torch.tensor(12.0), 12.0),
                   (torch.tensor(12.0, requires_grad=True), 12.0), (torch.tensor(100, dtype=torch.int32), 100.0),
                   (torch.tensor(4.0).to(torch.float8_e8m0fnu), 4.0), (torch.tensor(448.0).to(torch.float8_e4m3fn),
                                                                       448.0)):
        t = nvfp4_quantize(x, recipe="modelopt", global_amax=v)
        assert t.global_decode_scale == _modelopt_sf2(a32), v
        np.testing.assert_array_equal(t.codes, nvfp4_quantize(x, recipe="modelopt", global_amax=a32).codes)
    for bad in (torch.tensor(True), torch.tensor([2.0]), torch.tensor([[2.0]]), torch.tensor(2 + 1j)):
        with pytest.raises(TypeError, match="^global_amax"):
            nvfp4_quantize(x, global_amax=bad)


def test_int_and_str_arguments_refuse_other_types_with_a_type_error():
    """A value of the wrong type (32.0 for an int, 5 for a str) is a TypeError naming the argument; a value of
    the right type that is not allowed is a ValueError; numpy integers are ints."""
    x = np.ones((2, 64), np.float32)
    for bad in (32.0, "32", True, None, np.float32(32)):
        with pytest.raises(TypeError, match=r"^block="):
            mx_quantize(x, "e2m1", block=bad)
    for bad in (0, -32):
        with pytest.raises(ValueError, match=r"^block="):
            mx_quantize(x, "e2m1", block=bad)
    assert mx_quantize(x, "e2m1", block=np.int64(32)).block == 32
    for bad in (16.0, "16", True, None, [16, 16], (16.0, 16.0), (16, "16")):
        with pytest.raises(TypeError, match=r"^block="):
            nvfp4_quantize(x, block=bad)
    for bad in (32, (1, 32), (16, 16, 16)):
        with pytest.raises(ValueError, match=r"^block="):
            nvfp4_quantize(x, block=bad)
    assert nvfp4_quantize(x, block=np.int64(16)).block == (1, 16)
    t = nvfp4_quantize(x, block=(np.int64(16), np.int64(16)))
    assert t.block == (16, 16) and all(type(b) is int for b in t.block)
    for fn in (lambda a: mx_quantize(x, "e2m1", axis=a), lambda a: nvfp4_quantize(x, axis=a)):
        with pytest.raises(TypeError, match=r"^axis must be an int"):
            fn(1.0)
        assert fn(np.int8(1)).axis == 1
    with pytest.raises(TypeError, match=r"^elem=4: expected one of"):
        mx_quantize(x, 4)
    for fn in (lambda v: mx_quantize(x, "e2m1", nonfinite=v), lambda v: nvfp4_quantize(x, nonfinite=v)):
        with pytest.raises(TypeError, match=r"^nonfinite=None: expected one of"):
            fn(None)
        with pytest.raises(ValueError, match=r"^nonfinite='nan' is not one of"):
            fn("nan")


@pytest.mark.parametrize("recipe", RECIPES)
def test_two_dimensional_blocks(recipe):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((40, 32)) * np.exp(rng.standard_normal((40, 1)))).astype(np.float32)  # ragged M
    # one tile on the map-to-4 grid (a * {1/8, 3/8, 3/4, 1}): 4over6 picks map-to-4 there, map-to-6 elsewhere
    x[16:32, 0:16] = rng.choice([0.125, -0.375, 0.75, -1.0], (16, 16)).astype(np.float32) * np.float32(1.3)
    t = nvfp4_quantize(x, recipe=recipe, block=(16, 16))
    assert t.scales.shape == (40, 2) and t.block == (16, 16)
    codes = _unpacked(t)
    A = float(np.max(np.abs(x)))
    picks = {}
    if recipe in sim.FOUR_OVER_SIX:  # one choice per 16x16 tile: row errors added in TE's warp tree order
        e4m3_max, mode = sim.FOUR_OVER_SIX[recipe]
        se = sim.div(6 * e4m3_max, A)
        sd = sim.div(1, se)
        for tile in range(3):
            for j in range(2):
                blk = x[16 * tile:16 * tile + 16, 16 * j:16 * j + 16]
                a = float(np.max(np.abs(blk)))
                errs = []
                for r in range(16):
                    vals = [float(v) for v in blk[r]] if r < len(blk) else [0.0] * 16  # ragged tile: zero rows
                    c4, c6 = sim.four_over_six_block(vals, a, A, se, sd, e4m3_max, mode)
                    errs.append((c4[2], c6[2]))
                sums = []
                for k in (0, 1):
                    e = [pair[k] for pair in errs]
                    for half in (8, 4, 2, 1):
                        e = [sim.add(e[i], e[i + half]) for i in range(half)]
                    sums.append(e[0])
                picks[tile, j] = sums[0] < sums[1]
        assert len(set(picks.values())) == 2, "the data shows both choices"
    for r in range(40):
        tile = r // 16
        amaxes = [float(np.max(np.abs(x[16 * tile:16 * tile + 16, 16 * j:16 * j + 16]))) for j in range(2)]
        pick4 = [picks[tile, j] for j in range(2)] if picks else None
        s_sim, c_sim, _ = sim.quantize_row([float(v) for v in x[r]], recipe, A=A, block_amax=amaxes, pick4=pick4)
        assert t.scales[r].tolist() == s_sim, (recipe, r)
        assert codes[r].tolist() == c_sim, (recipe, r)
    # batched: leading dims are independent batches of [M, K]
    xb = np.stack([x, -x])
    tb = nvfp4_quantize(xb, recipe=recipe, block=(16, 16))
    np.testing.assert_array_equal(tb.scales[0], t.scales)
    with pytest.raises(ValueError, match="2 dimensions"):
        nvfp4_quantize(x[0], recipe=recipe, block=(16, 16))


# ------------------------------------------------------------------------------------------ torch transcriptions


def _torch_recipe(torch, x, recipe):
    """Line-by-line transcription of each source's fp32 order in torch (CPU, fp32 tensors)."""
    f = torch.float32
    x = torch.from_numpy(x).to(f)
    m, n = x.shape
    xb = x.view(m, n // 16, 16)
    vec_max = torch.amax(torch.abs(xb), dim=-1, keepdim=True)
    A = torch.max(torch.abs(x)).to(f)
    fmax = torch.tensor(torch.finfo(f).max, dtype=f)
    if recipe in ("te", "sol"):
        ge = torch.div(torch.tensor(448.0 * 6.0, dtype=f), A)
        ge = torch.min(ge, fmax)
        if ge == 0:
            ge = torch.tensor(1.0, dtype=f)
        gd = torch.div(1.0, ge)
        if recipe == "te":
            ds = vec_max * (ge * torch.reciprocal(torch.tensor(6.0, dtype=f)))
        else:
            ds = torch.div(vec_max, torch.tensor(6.0, dtype=f)) * ge
        ds = torch.min(ds, fmax)
        ds = torch.clamp(ds, min=-448.0, max=448.0).to(torch.float8_e4m3fn)
        enc = torch.min(torch.div(1.0, ds.to(f) * gd), fmax)
        y = torch.clamp(xb * enc, -6.0, 6.0).reshape(m, n)
        return ds.squeeze(-1), y, gd, "te"
    if recipe in ("torchao", "torchao-0.16"):
        pts = A / (448.0 * 6.0)
        bs = vec_max.squeeze(-1) / 6.0
        sbs = torch.clamp(bs / pts, min=torch.finfo(torch.float8_e4m3fn).tiny, max=448.0).to(torch.float8_e4m3fn)
        if recipe == "torchao":  # 0.18: x * ((1 / pts) / s)
            y = xb * ((1.0 / pts) / sbs.to(f)).unsqueeze(-1)
        else:  # <= 0.16: x / (pts * s)
            y = xb / (pts * sbs.to(f)).unsqueeze(-1)
        return sbs, torch.clamp(y, -6.0, 6.0).reshape(m, n), pts, "signed"
    if recipe == "modelopt":
        sf2 = A / (6.0 * 448.0)
        pbs = vec_max.squeeze(-1) / (6.0 * sf2)
        pbs[pbs == 0] = 1.0
        pbs = pbs.clamp(min=2**-9, max=448.0).to(torch.float8_e4m3fn)
        y = (xb / (pbs.to(f) * sf2).unsqueeze(-1)).reshape(m, n)
        return pbs, y, sf2, "modelopt"
    raise ValueError(recipe)


def _e2m1_codes_by_comparison(y: np.ndarray, sign_rule: str) -> np.ndarray:
    """E2M1 codes by the comparison tables of the sources (TE cast_to_fp4x2 thresholds, ties to even)."""
    a = np.abs(y.astype(np.float64))
    bounds_gt = [(0.25, True), (0.75, False), (1.25, True), (1.75, False), (2.5, True), (3.5, False), (5.0, True)]
    mag = np.zeros(a.shape, dtype=np.uint8)
    for b, strict in bounds_gt:
        mag += (a > b) if strict else (a >= b)
    if sign_rule == "signed":
        neg = np.signbit(y)
    else:  # te: x < -0.0 ... i.e. (x < 0); modelopt: (x < 0)
        neg = y < 0
    return mag | (neg.astype(np.uint8) << 3)


@pytest.mark.parametrize("recipe", ["te", "sol", "torchao", "torchao-0.16", "modelopt"])
def test_matches_torch_transcription(recipe):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2024)
    x = np.concatenate([adversarial_rows(rng, nrows=30, nblocks=8),
                        (rng.standard_normal((34, 128)) * 0.02).astype(np.float32)])
    scales, y, g, rule = _torch_recipe(torch, x, recipe)
    t = nvfp4_quantize(x, recipe=recipe)
    np.testing.assert_array_equal(t.scales, scales.view(torch.uint8).numpy())
    np.testing.assert_array_equal(_unpacked(t), _e2m1_codes_by_comparison(y.numpy(), rule))
    assert np.float32(t.global_decode_scale) == np.float32(g.item())


# ------------------------------------------------------------------------------------------ zero, NaN, shapes, errors


@pytest.mark.parametrize("recipe", RECIPES)
def test_all_zero_tensor_and_blocks(recipe):
    for x in (np.zeros((3, 32), np.float32), -np.zeros((2, 16), np.float32)):
        t = nvfp4_quantize(x, recipe=recipe)
        assert not np.any(_unpacked(t) & 7), "zero codes (0x8 = -0.0 where the recipe keeps the sign)"
        assert not np.any((t.scales & 0x7F) == 0x7F), "no NaN scale byte"
        assert np.isfinite(t.global_decode_scale) and t.global_decode_scale > 0
        d = nvfp4_dequantize(t)
        assert not np.any(np.isnan(d)) and not np.any(d)
    # public bug vector: an all-zero block with a positive global amax -> scale byte must not be 0x7F
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 3.0
    t = nvfp4_quantize(x, recipe=recipe)
    assert t.scales[0, 1] != 0x7F and not np.any(_unpacked(t)[0, 16:])


@pytest.mark.parametrize("recipe", RECIPES)
def test_nonfinite_policy(recipe):
    x = np.ones((1, 32), np.float32)
    x[0, 3] = np.nan
    x[0, 20] = -np.inf
    with pytest.raises(ValueError, match="NaN/inf"):
        nvfp4_quantize(x, recipe=recipe)
    t = nvfp4_quantize(x, recipe=recipe, nonfinite="zero")
    y = x.copy()
    y[0, 3] = 0.0
    y[0, 20] = 0.0
    u = nvfp4_quantize(y, recipe=recipe)
    np.testing.assert_array_equal(t.codes, u.codes)
    np.testing.assert_array_equal(t.scales, u.scales)
    assert np.isnan(x[0, 3]), "input untouched"
    with pytest.raises(ValueError, match="nonfinite"):
        nvfp4_quantize(x, recipe=recipe, nonfinite="ignore")


def test_axis_dtypes_and_errors():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((32, 3)).astype(np.float32)
    t = nvfp4_quantize(x, axis=0)
    u = nvfp4_quantize(np.ascontiguousarray(x.T))
    assert t.codes.shape == (16, 3) and t.scales.shape == (2, 3) and t.axis == 0
    np.testing.assert_array_equal(t.codes, u.codes.T)
    np.testing.assert_array_equal(t.scales, u.scales.T)
    np.testing.assert_array_equal(nvfp4_dequantize(t), nvfp4_dequantize(u).T)
    # bfloat16 / float16 widen exactly; float64 holding float32 values is accepted
    xb = x.T.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(nvfp4_quantize(xb).codes, nvfp4_quantize(xb.astype(np.float32)).codes)
    np.testing.assert_array_equal(nvfp4_quantize(x.T.astype(np.float64)).codes, u.codes)
    with pytest.raises(ValueError, match="not float32 values"):
        nvfp4_quantize(np.full((1, 16), 0.1, np.float64))
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4_quantize(np.ones((2, 24), np.float32))
    with pytest.raises(TypeError, match="x must be"):
        nvfp4_quantize(np.ones((2, 16), np.int32))
    with pytest.raises(ValueError, match=r"^recipe='cublas' is not one of \['te', 'sol', .*'te-4over6-mse-256'\]$"):
        nvfp4_quantize(x, recipe="cublas")
    for bad in (1, None):  # not a str: a TypeError naming the argument, with the names
        with pytest.raises(TypeError, match=rf"^recipe={bad}: expected an NVFP4Recipe or one of its names "
                                            r"\['te', 'sol', .*\], got"):
            nvfp4_quantize(x, recipe=bad)
    with pytest.raises(ValueError, match="block="):
        nvfp4_quantize(x, block=32)
    with pytest.raises(ValueError, match="0-d"):
        nvfp4_quantize(np.float32(1.0))
    with pytest.raises(TypeError, match="NVFP4Tensor"):
        nvfp4_dequantize(x)
    assert nvfp4_quantize(x, recipe=NVFP4Recipe.SOL, axis=0).recipe == "sol"


@pytest.mark.parametrize("recipe", RECIPES)
@given(data=st.data())
def test_dequantize_is_the_elementwise_reference(recipe, data):
    rows = data.draw(st.integers(1, 4))
    nb = data.draw(st.integers(1, 3))
    seed = data.draw(st.integers(0, 2**32 - 1))
    scale = 2.0 ** data.draw(st.integers(-40, 40))
    x = (np.random.default_rng(seed).standard_normal((rows, 16 * nb)) * scale).astype(np.float32)
    t = nvfp4_quantize(x, recipe=recipe)
    d32 = nvfp4_dequantize(t)
    d64 = nvfp4_dequantize(t, dtype=np.float64)
    assert d32.dtype == np.float32 and d64.dtype == np.float64 and d32.shape == x.shape
    codes = _unpacked(t)
    g = Q(float(t.global_decode_scale))
    for r in range(rows):
        for k in range(16 * nb):
            exact = Q(sim.E2M1_MAG[codes[r, k] & 7]) * (-1 if codes[r, k] & 8 else 1) \
                * sim.e4m3_value(int(t.scales[r, k // 16]) & 0x7F) * g
            assert Q(float(d64[r, k])) == exact
            want32 = sim.round_rne(exact, 24, -126)
            assert Q(float(d32[r, k])) == want32


# ------------------------------------------------------------------------------------------ MX


def test_mx_public_vectors():
    # public bug report: MXFP4 block [6, 0, .24, .25, .75, .99, 1.2, 1.3] x4, FLOOR -> scale 2^0, elements
    # [6, 0, 0, 0, 1, 1, 1, 1.5]
    x = np.tile(np.array([6, 0, 0.24, 0.25, 0.75, 0.99, 1.2, 1.3], np.float32), 4)[None]
    t = mx_quantize(x, "e2m1", mode="floor")
    assert t.scales.tolist() == [[127]]
    vals = mx_dequantize(t)[0, :8].tolist()
    assert vals == [6, 0, 0, 0, 1, 1, 1, 1.5]
    # MX from fp32 bits 0x43FFFFFF with FLOOR for E4M3 elements: scale byte 127, element byte 0x7E
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = f32(0x43FFFFFF)
    t = mx_quantize(x, "e4m3", mode="floor")
    assert t.scales.tolist() == [[127]] and t.codes[0, 0] == 0x7E
    # float log2 is off by one near powers of two: floor(log2(7.9999995f)) = 2, not 3
    x[0, 0] = np.float32(7.9999995)
    assert np.floor(np.log2(np.float32(7.9999995))) == 3  # the trap: float32 log2 rounds up to 3.0
    t = mx_quantize(x, "e2m1", mode="floor")
    assert t.scales.tolist() == [[127]]  # e = 2 - emax(E2M1)=2 -> 0 -> byte 127
    assert t.codes[0, 0] == 0x7  # 7.9999995 saturates to 6


def _expected_exponent(a: float, fmt, mode: str) -> int:
    """Exact unbiased scale exponent (before clamping) from rational arithmetic."""
    emax = fmt.emax
    if a == 0:
        return -127
    qa = Q(a)
    fl = sim._floor_log2(qa)
    if mode == "floor":
        return fl - emax
    if mode == "ceil":
        return fl + (0 if Q(2) ** fl == qa else 1) - emax
    if mode == "even":
        # a rounded to (mbits+1) significant bits, ties away from zero (torchao's add-half-then-truncate on the bits)
        if fl < -126:  # float32 subnormal: the bit trick works on the 23-bit field with exponent field 0
            field = int(qa / Q(2) ** -149)
            field += 1 << (23 - fmt.mbits - 1)
            return (-126 if field >= 1 << 23 else -(10**6)) - emax
        quantum = Q(2) ** (fl - fmt.mbits)
        r = math.floor(qa / quantum + Q(1, 2)) * quantum
        return sim._floor_log2(r) - emax
    if mode == "rceil":
        q = sim.f32(qa / Q(fmt.max))
        if q == 0:
            return -127
        flq = sim._floor_log2(q)
        return flq + (0 if Q(2) ** flq == q else 1)
    if mode == "rceil-torchao":  # ceil of the correctly rounded fp32 log2 of fp32(a / max), via mpmath at 200 bits
        q = sim.f32(qa / Q(fmt.max))
        if q == 0:
            return -127
        return math.ceil(sim.round_rne(_mp_log2(q), 24, -126))
    raise ValueError(mode)


def _mp_log2(q: Q) -> Q:
    import mpmath

    with mpmath.workprec(200):
        sign, man, exp, _ = mpmath.log(mpmath.mpf(q.numerator) / q.denominator, 2)._mpf_
    return (-1) ** sign * Q(int(man)) * Q(2) ** int(exp)


ML = {"e2m1": ml_dtypes.float4_e2m1fn, "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
      "e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


@pytest.mark.parametrize("elem", list(MX_ELEMENTS))
@pytest.mark.parametrize("mode", [m.value for m in MXMode])
def test_mx_scales_and_elements(elem, mode):
    fmt = MX_ELEMENTS[elem]
    rng = np.random.default_rng(zlib.crc32(f"{elem} {mode}".encode()))  # (hash() of a str varies per process)
    nblocks = 64
    x = (rng.standard_normal((nblocks, 32)) * 2.0 ** rng.integers(-60, 60, (nblocks, 1))).astype(np.float32)
    # adversarial block maxima: powers of two, one ulp below, near the element max, subnormal, zero
    specials = [8.0, np.nextafter(np.float32(8.0), np.float32(0)), 7.9999995, fmt.max, fmt.max * 1.0000001,
                2.0**-130, 1e-45, 0.0, 2.0**127, 3.0e38]
    for i, s in enumerate(specials):
        x[i] = np.clip(x[i], -abs(np.float32(s)), abs(np.float32(s))) * 0.5
        x[i, 0] = np.float32(s)
    x0 = x.copy()
    t = mx_quantize(x, elem, mode=mode)
    np.testing.assert_array_equal(x, x0)
    assert t.scales.shape == (nblocks, 1) and t.codes.shape == x.shape
    d = mx_dequantize(t, dtype=np.float64)
    for i in range(nblocks):
        a = float(np.max(np.abs(x[i])))
        e = max(-127, min(127, _expected_exponent(a, fmt, mode)))
        assert int(t.scales[i, 0]) == e + 127, (i, a)
        # elements: exact x / 2^e, clamped to +-max, one ml_dtypes RNE cast (torchao's RCEIL: scale 1 at byte 0)
        ee = 0 if mode == "rceil-torchao" and e == -127 else e
        q = np.clip(np.ldexp(x[i].astype(np.float64), -ee), -fmt.max, fmt.max)
        want = q.astype(np.float32).astype(ML[elem]).view(np.uint8)
        if elem in ("e2m1", "e2m3", "e3m2"):
            want = want & np.uint8((1 << fmt.nbits) - 1)
        np.testing.assert_array_equal(t.codes[i], want, err_msg=f"block {i} amax {a}")
        # decoded: the element's value (ml_dtypes) times the block's 2^e, exact in float64
        want_d = np.ldexp(want.view(ML[elem]).astype(np.float64), ee)
        np.testing.assert_array_equal(d[i], want_d, err_msg=f"block {i} amax {a}")


def test_mx_zero_nonfinite_axis_errors():
    z = np.zeros((2, 64), np.float32)
    t = mx_quantize(z, "e4m3")
    assert t.scales.tolist() == [[0, 0], [0, 0]] and not np.any(t.codes)
    assert not np.any(mx_dequantize(t))
    x = np.ones((1, 64), np.float32)
    x[0, 40] = np.nan
    with pytest.raises(ValueError, match="NaN/inf"):
        mx_quantize(x, "e2m1")
    t = mx_quantize(x, "e2m1", nonfinite="nan_scale")
    assert t.scales.tolist() == [[125, 255]] and not np.any(t.codes[0, 32:])  # amax 1: 2^(0 - 2)
    d = mx_dequantize(t)
    assert np.all(np.isnan(d[0, 32:])) and np.all(d[0, :32] == 1.0)
    # axis
    rng = np.random.default_rng(1)
    y = rng.standard_normal((64, 2)).astype(np.float32)
    a, b = mx_quantize(y, "e5m2", axis=0), mx_quantize(np.ascontiguousarray(y.T), "e5m2")
    np.testing.assert_array_equal(a.codes, b.codes.T)
    np.testing.assert_array_equal(a.scales, b.scales.T)
    np.testing.assert_array_equal(mx_dequantize(a), mx_dequantize(b).T)
    with pytest.raises(ValueError, match="multiple of block"):
        mx_quantize(np.ones((1, 48), np.float32), "e2m1")
    with pytest.raises(ValueError, match="elem="):
        mx_quantize(y, "e4m3fnuz")
    with pytest.raises(ValueError, match=r"^mode='nearest' is not one of \['floor', 'ceil', "):
        mx_quantize(y, "e2m1", mode="nearest")
    with pytest.raises(TypeError, match=r"^mode=1: expected an MXMode or one of its names \['floor', .*\], got int$"):
        mx_quantize(y, "e2m1", mode=1)
    assert mx_quantize(y, "e2m1", mode=MXMode.RCEIL, axis=0).mode == "rceil"


# ------------------------------------------------------------------------------------------ E2M1 table path


def _all_classes_and_neighbours():
    hi = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    bits = (hi[:, None] | lows[None, :]).reshape(-1)
    v = bits.view(np.float32)
    return v[np.isfinite(v)]


def test_e2m1_table_path_equals_encode_on_every_class():
    from fp4ref.blockscale import _e2m1_f32
    from fp4ref.formats import E2M1, encode

    v = _all_classes_and_neighbours()
    want = encode(v, E2M1, rounding="rne", saturate=True)
    np.testing.assert_array_equal(_e2m1_f32(v), want)
    # the sign-of-zero variant differs from encode only at -0.0 exactly
    alt = _e2m1_f32(v, negative_zero=False)
    negzero = (v == 0) & np.signbit(v)
    np.testing.assert_array_equal(alt[~negzero], want[~negzero])
    assert np.all(alt[negzero] == 0) and np.all(want[negzero] == 8)
    rng = np.random.default_rng(9)
    r = rng.integers(0, 2**32, size=1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    r = r[np.isfinite(r)]
    np.testing.assert_array_equal(_e2m1_f32(r), encode(r, E2M1, rounding="rne", saturate=True))


@pytest.mark.slow
def test_e2m1_table_path_equals_encode_exhaustive():
    from fp4ref.blockscale import _e2m1_f32
    from fp4ref.formats import E2M1, encode

    step = 1 << 24
    for start in range(0, 1 << 32, step):
        v = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        v = v[np.isfinite(v)]
        np.testing.assert_array_equal(_e2m1_f32(v), encode(v, E2M1, rounding="rne", saturate=True))


# --------------------------------------------------------------------------------------- Hypothesis (fp4ref.strategies)


@pytest.mark.parametrize("recipe", RECIPES)
@given(data=st.data())
def test_adversarial_bf16_inputs_match_the_model(recipe, data):
    from fp4ref.strategies import nvfp4_inputs

    x = data.draw(nvfp4_inputs(2, 48))
    t = nvfp4_quantize(x, recipe=recipe)
    codes = _unpacked(t)
    for r in range(2):
        s_sim, c_sim, g_sim = sim.quantize_row([float(v) for v in x[r].astype(np.float32)], recipe,
                                               A=float(np.max(np.abs(x.astype(np.float32)))))
        assert t.scales[r].tolist() == s_sim
        assert codes[r].tolist() == c_sim
        assert Q(float(t.global_decode_scale)) == g_sim


@given(data=st.data())
def test_dequantize_raw_operands(data):
    from fp4ref.strategies import nvfp4_operands

    op = data.draw(nvfp4_operands(3, 32, allow_nan_scale=True))
    t = NVFP4Tensor(codes=op["codes"], scales=op["scales"], global_decode_scale=op["global_decode_scale"],
                    shape=(3, 32), recipe="te", block=(1, 16), axis=1)
    d = nvfp4_dequantize(t)
    c = unpack_fp4(op["codes"])
    g = Q(float(op["global_decode_scale"]))
    for r in range(3):
        for k in range(32):
            sbyte = int(op["scales"][r, k // 16]) & 0x7F
            if sbyte == 0x7F:
                assert np.isnan(d[r, k])
                continue
            v = Q(sim.E2M1_MAG[c[r, k] & 7]) * (-1 if c[r, k] & 8 else 1) * sim.e4m3_value(sbyte) * g
            assert Q(float(d[r, k])) == sim.round_rne(v, 24, -126)


def test_mx_elem_accepts_the_registry_name_e4m3fn():
    x = np.linspace(-300, 300, 64, dtype=np.float32).reshape(2, 32)
    a, b = mx_quantize(x, "e4m3"), mx_quantize(x, "E4M3FN")
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(a.scales, b.scales)
    with pytest.raises(ValueError, match="elem="):
        mx_quantize(x, "e4m3fnuz")


def test_mx_elem_is_the_registry_name_and_round_trips():
    """MXTensor.elem is the fp4ref.formats name (it was "e4m3", which fp4ref.decode refuses); mx_dequantize takes
    every spelling mx_quantize takes, in any case (it raised KeyError for "e4m3fn" and "E4M3")."""
    import dataclasses

    import fp4ref

    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    for elem in ("e2m1", "E2M3", "e3m2", "e4m3", "E4M3FN", "e5m2"):
        m = mx_quantize(x, elem)
        assert m.elem == elem.lower().replace("e4m3fn", "e4m3").replace("e4m3", "e4m3fn")
        assert m.elem in MX_ELEMENTS and MX_ELEMENTS[m.elem].name == m.elem
        np.testing.assert_array_equal(fp4ref.decode(m.codes, m.elem), fp4ref.decode(m.codes, MX_ELEMENTS[m.elem]))
    m = mx_quantize(x, "e4m3fn")
    want = mx_dequantize(m)
    for spelling in ("e4m3", "E4M3", "e4m3fn", "E4M3FN", "E4m3Fn"):
        np.testing.assert_array_equal(mx_dequantize(dataclasses.replace(m, elem=spelling)), want)
    with pytest.raises(ValueError, match=r"^t\.elem='e4m3fnuz' is not one of"):
        mx_dequantize(dataclasses.replace(m, elem="e4m3fnuz"))
    with pytest.raises(TypeError, match=r"^t\.elem=None: expected one of"):
        mx_dequantize(dataclasses.replace(m, elem=None))


def test_hand_built_tensors_with_a_bad_axis_or_block_name_the_field():
    """A negative axis counts from the end; an axis out of range, a bad block or shape is a ValueError / TypeError
    naming t.axis / t.block / t.shape (they were IndexError, a misleading "inconsistent" error, or accepted)."""
    import dataclasses

    from fp4ref import gemm

    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    m, q = mx_quantize(x, "e4m3fn"), nvfp4_quantize(x)
    mx_want, nv_want = mx_dequantize(m), nvfp4_dequantize(q)
    for ax in (-1, np.int64(-1)):
        np.testing.assert_array_equal(mx_dequantize(dataclasses.replace(m, axis=ax)), mx_want)
        np.testing.assert_array_equal(nvfp4_dequantize(dataclasses.replace(q, axis=ax)), nv_want)
    assert gemm.nvfp4_gemm(dataclasses.replace(q, axis=-1), q).K == 64
    for fn, t in ((mx_dequantize, m), (nvfp4_dequantize, q)):
        for ax in (2, 3, 5, -3):
            with pytest.raises(ValueError, match=rf"^t\.axis={ax} is out of range for an array with 2 dim"):
                fn(dataclasses.replace(t, axis=ax))
        with pytest.raises(TypeError, match=r"^t\.axis must be an int"):
            fn(dataclasses.replace(t, axis=1.0))
        with pytest.raises(TypeError, match=r"^t\.shape="):
            fn(dataclasses.replace(t, shape=(4, 64.0)))
        with pytest.raises(ValueError, match=r"^t\.shape=.*negative"):
            fn(dataclasses.replace(t, shape=(-4, 64)))
    for bad in ((3, 3), (1, 32), 32, 0):
        with pytest.raises(ValueError, match=rf"^t\.block={re.escape(repr(bad))} is not an NVFP4 block"):
            nvfp4_dequantize(dataclasses.replace(q, block=bad))
    for bad in ((16.0, 16.0), "16", None, [16, 16]):
        with pytest.raises(TypeError, match=r"^t\.block="):
            nvfp4_dequantize(dataclasses.replace(q, block=bad))
    with pytest.raises(ValueError, match=r"^xq\.block=\(3, 3\) is not an NVFP4 block"):
        gemm.nvfp4_gemm(dataclasses.replace(q, block=(3, 3)), q)
    with pytest.raises(ValueError, match=r"^wq\.axis=5 is out of range"):
        gemm.nvfp4_gemm(q, dataclasses.replace(q, axis=5))
    np.testing.assert_array_equal(nvfp4_dequantize(dataclasses.replace(q, block=16)), nv_want)
    with pytest.raises(ValueError, match=r"^t\.block=\(16, 16\) needs a shape with at least 2 dim"):
        nvfp4_dequantize(dataclasses.replace(nvfp4_quantize(x[0]), block=(16, 16)))
    with pytest.raises(ValueError, match=r"^t\.shape=\(4, 24\) has length 24 along t\.axis=1; NVFP4 needs a "):
        nvfp4_dequantize(dataclasses.replace(q, shape=(4, 24)))
    for bad in (0, -32):
        with pytest.raises(ValueError, match=rf"^t\.block={bad} must be a positive int"):
            mx_dequantize(dataclasses.replace(m, block=bad))
    for bad in (32.0, "32", True, None):
        with pytest.raises(TypeError, match=r"^t\.block="):
            mx_dequantize(dataclasses.replace(m, block=bad))
    with pytest.raises(ValueError, match=r"^t\.shape=\(4, 64\) has length 64 along t\.axis=1; it must be a "
                                         r"multiple of t\.block=24"):
        mx_dequantize(dataclasses.replace(m, block=24))
    with pytest.raises(ValueError, match=r"^t is inconsistent: .* block 16 needs codes \(4, 64\) and scales"):
        mx_dequantize(dataclasses.replace(m, block=16))


def test_mx_dequantize_names_the_bad_field():
    import dataclasses

    t = mx_quantize(np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32), "e4m3fn")
    with pytest.raises(TypeError, match="t.scales"):
        mx_dequantize(dataclasses.replace(t, scales=t.scales.astype(np.float32)))
    with pytest.raises(TypeError, match="t.codes"):
        mx_dequantize(dataclasses.replace(t, codes=t.codes.astype(np.float32)))


def test_mx_dequantize_checks_the_mode():
    """MXTensor(mode="bogus") or mode=None decoded without a word, though mx_dequantize checks a hand-built tensor's
    fields: mode is parsed as mx_quantize parses it (an MXMode or its name, any case), errors naming t.mode.
    NVFP4Tensor.recipe is a label that decoding does not check (nvfp4_operands gives "raw")."""
    import dataclasses

    t = mx_quantize(np.random.default_rng(6).standard_normal((2, 64)).astype(np.float32), "e2m1", mode="even")
    want = mx_dequantize(t)
    for ok in ("EVEN", MXMode.EVEN, MXMode.FLOOR, "rceil-torchao"):
        np.testing.assert_array_equal(mx_dequantize(dataclasses.replace(t, mode=ok)), want)
    with pytest.raises(ValueError, match=r"^t\.mode='bogus' is not one of \['floor', "):
        mx_dequantize(dataclasses.replace(t, mode="bogus"))
    for bad in (None, 3, b"floor"):
        with pytest.raises(TypeError, match=rf"^t\.mode={re.escape(repr(bad))}: expected an MXMode or one of its "):
            mx_dequantize(dataclasses.replace(t, mode=bad))
    q = nvfp4_quantize(np.ones((1, 16), np.float32), recipe="sol")
    np.testing.assert_array_equal(nvfp4_dequantize(dataclasses.replace(q, recipe="raw")), nvfp4_dequantize(q))


def test_dequantize_reads_int8_codes_and_scales_as_bytes():
    """int8 codes / scale bytes (torch int8 storage) decode as the same bytes, as fp4ref.decode reads them; they
    were refused as "values outside the 8-bit code range 0..255". Other dtypes stay a TypeError naming the field."""
    import dataclasses

    x = np.random.default_rng(5).standard_normal((3, 64)).astype(np.float32) * 100
    m = mx_quantize(x, "e4m3fn")
    assert (m.codes >= 128).any()  # negative elements: int8 views below zero
    want = mx_dequantize(m)
    for kw in ({"codes": m.codes.view(np.int8)}, {"scales": m.scales.view(np.int8)},
               {"codes": m.codes.view(np.int8), "scales": m.scales.view(np.int8)}):
        np.testing.assert_array_equal(mx_dequantize(dataclasses.replace(m, **kw)), want)
    q = nvfp4_quantize(x, recipe="sol")
    assert (q.codes >= 128).any()
    want = nvfp4_dequantize(q)
    for kw in ({"codes": q.codes.view(np.int8)}, {"scales": q.scales.view(np.int8)},
               {"codes": q.codes.view(np.int8), "scales": (q.scales | 0x80).view(np.int8)}):  # sign bit ignored
        np.testing.assert_array_equal(nvfp4_dequantize(dataclasses.replace(q, **kw)), want)
    for bad in (np.float16, ml_dtypes.float8_e4m3fn, np.bool_):
        with pytest.raises(TypeError, match=r"^t\.codes must be an integer array"):
            mx_dequantize(dataclasses.replace(m, codes=m.codes.astype(bad)))
        with pytest.raises(TypeError, match=r"^t\.scales must be an integer array"):
            nvfp4_dequantize(dataclasses.replace(q, scales=q.scales.astype(bad)))


def test_float64_beyond_float32_is_a_value_error_without_a_warning():
    import warnings

    x = np.full((1, 16), 1e300)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow RuntimeWarning would surface here instead of the ValueError
        with pytest.raises(ValueError, match="not float32 values"):
            nvfp4_quantize(x, recipe="sol")


# ------------------------------------------------------------------------------------------ MX: scale byte 0, RCEIL


def _f32_next(v: float, up: bool) -> float:
    return float(np.nextafter(np.float32(v), np.float32(np.inf if up else 0)))


@pytest.mark.parametrize("elem", list(MX_ELEMENTS))
def test_mx_zero_scale_byte_thresholds(elem):
    # byte 0 iff e <= -127: FLOOR a < 2^(emax-126); CEIL a <= 2^(emax-127); EVEN a' < 2^(emax-126); RCEIL
    # fp32(a/max) <= 2^-127. Hand values: 2^-124 E2M1/E2M3, 2^-122 E3M2, 2^-118 E4M3, 2^-111 E5M2.
    fmt = MX_ELEMENTS[elem]
    t = {"e2m1": -124, "e2m3": -124, "e3m2": -122, "e4m3fn": -118, "e5m2": -111}[elem]
    assert fmt.emax - 126 == t

    def byte(a, mode):
        x = np.zeros((1, 32), np.float32)
        x[0, 0] = a
        return int(mx_quantize(x, elem, mode=mode).scales[0, 0])

    assert byte(2.0**t, "floor") == 1 and byte(_f32_next(2.0**t, False), "floor") == 0
    assert byte(2.0 ** (t - 1), "ceil") == 0 and byte(_f32_next(2.0 ** (t - 1), True), "ceil") == 1
    edge = 2.0**t * (1 - 2.0 ** -(fmt.mbits + 2))  # a' = a rounded to mbits+1 bits, ties away, reaches 2^t
    assert byte(edge, "even") == 1 and byte(_f32_next(edge, False), "even") == 0
    # RCEIL: the largest a with fp32(a / max) <= 2^-127 gets byte 0, the next float byte 1
    a = np.float32(2.0**-127 * fmt.max)
    while np.float32(a) / np.float32(fmt.max) > np.float32(2.0**-127):
        a = np.float32(_f32_next(a, False))
    while np.float32(_f32_next(a, True)) / np.float32(fmt.max) <= np.float32(2.0**-127):
        a = np.float32(_f32_next(a, True))
    assert byte(a, "rceil") == 0 and byte(_f32_next(a, True), "rceil") == 1
    # torchao's fp32 log2 rounds d a few ulps above 2^-127 down to -127 too: byte 0 a little further
    assert byte(a, "rceil-torchao") == 0 and byte(_f32_next(a, True), "rceil-torchao") == 0
    assert byte(np.float32(a * 1.0001), "rceil-torchao") == 1
    # in a byte-0 block fp4ref divides by 2^-127 (the byte's value); rceil-torchao multiplies by 1.0 (torchao)
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = _f32_next(2.0**t, False)
    t0 = mx_quantize(x, elem, mode="floor")
    assert t0.scales[0, 0] == 0 and mx_dequantize(t0, dtype=np.float64)[0, 0] == decode_value(fmt, t0.codes[0, 0])
    assert mx_dequantize(t0, dtype=np.float64)[0, 0] > 0


def decode_value(fmt, code) -> float:
    from fp4ref.formats import decode

    return float(decode(np.array([code], np.uint8), fmt, dtype=np.float64)[0]) * 2.0**-127


def test_mx_rceil_torchao_vs_exact():
    # the vector: fp32 bits 0x0DC00001 with E2M1 elements: torchao's eager ceil(log2) 25, exact 26
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = f32(0x0DC00001)
    assert mx_quantize(x, "e2m1", mode="rceil-torchao").scales.tolist() == [[25]]
    assert mx_quantize(x, "e2m1", mode="rceil").scales.tolist() == [[26]]
    # d = fp32(a/6) just above 2^k: log2 rounds to k while |log2 m| is below half the fp32 spacing at k
    assert _expected_exponent(f32(0x0DC00001), MX_ELEMENTS["e2m1"], "rceil-torchao") == 25 - 127


def test_mx_rceil_torchao_matches_torch_log2():
    torch = pytest.importorskip("torch")
    from fp4ref.blockscale import _ceil_rn_log2_f32

    # every k, m = 1 + j 2^-23 for j in 0..63 (the round-down band is at most ~23 ulps wide), subnormals too
    bits = []
    for expf in range(0, 255):
        for j in range(64):
            bits.append((expf << 23) | j)
            bits.append((expf << 23) | (0x7FFFFF - j))
    d = np.array(bits, np.uint32).view(np.float32)
    d = d[d > 0]
    want = torch.ceil(torch.log2(torch.from_numpy(np.tile(d, 4)))).numpy()[: d.size].astype(np.int64)
    np.testing.assert_array_equal(_ceil_rn_log2_f32(d), want)


# ------------------------------------------------------------ fast path (te, sol, modelopt) == the reference rows

FAST = ["te", "sol", "modelopt"]


def _reference_rows(recipe: str, x: np.ndarray, gs: dict) -> tuple:
    """Packed codes and scale bytes of x [r, K] by the reference path (_nvfp4_rows + _pack)."""
    from fp4ref.blockscale import _nvfp4_rows, _pack

    xf = x.astype(np.float32)
    xb = xf.reshape(xf.shape[0], xf.shape[1] // 16, 16)
    sb, cb = _nvfp4_rows(NVFP4Recipe(recipe), xb, np.max(np.abs(xb), axis=-1), gs)
    return _pack(cb.reshape(xf.shape)), sb


def _assert_fast_equals_reference(recipe: str, x: np.ndarray, amax=None) -> None:
    __tracebackhide__ = True
    from fp4ref.blockscale import _error_stats, _global_scales, _nvfp4_rows_fast

    xf = x.astype(np.float32)
    a = np.float32(np.max(np.abs(xf))) if amax is None else np.float32(amax)
    gs = _global_scales(NVFP4Recipe(recipe), a)
    want_c, want_s = _reference_rows(recipe, x, gs)
    codes, scales, stats = _nvfp4_rows_fast(NVFP4Recipe(recipe), x, gs, stats=True)
    for what, got, want in (("codes", codes, want_c), ("scale bytes", scales, want_s)):
        bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
        assert bad.size == 0, (
            f"fast path != reference ({recipe}): {what} differ at {bad.size} of {got.size} positions; first flat "
            f"index {bad[:4].tolist()}: ACTUAL {got.reshape(-1)[bad[:4]].tolist()} DESIRED "
            f"{want.reshape(-1)[bad[:4]].tolist()}")
    t = NVFP4Tensor(codes, scales, np.float32(gs["stored"]), x.shape, recipe, (1, 16), 1)
    ref = _error_stats(xf, nvfp4_dequantize(t), 16)
    assert stats.max_abs_err == ref.max_abs_err and stats.zero_blocks == ref.zero_blocks
    assert stats.sum_sq == pytest.approx(ref.sum_sq, rel=1e-12, abs=0)
    assert stats.sum_err_sq == pytest.approx(ref.sum_err_sq, rel=1e-12, abs=0)


def test_fast_e2m1_entries_on_every_class():
    """The fast path's one gather: the code of every float32 rounding class (and the class neighbours) as
    _e2m1_f32(negative_zero=False), in the low or the high nibble of the low byte, the value in the other bits."""
    from fp4ref.blockscale import _e2m1_entries, _e2m1_f32
    from fp4ref.formats import E2M1, decode

    rng = np.random.default_rng(17)
    r = rng.integers(0, 2**32, size=1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    for v in (_all_classes_and_neighbours(), r[np.isfinite(r)]):
        want = _e2m1_f32(v, negative_zero=False)
        for high in (False, True):
            ent = _e2m1_entries(v, np.empty(v.size, np.intp), np.empty(v.size, np.uint32), high=high)
            np.testing.assert_array_equal(ent & 0xFF, want << 4 if high else want)
            np.testing.assert_array_equal(ent & 0xFFFFFF00, decode(want, E2M1).view(np.uint32))


def test_e4m3_table_path_equals_encode_on_every_class():
    from fp4ref.blockscale import _e4m3_f32
    from fp4ref.formats import E4M3FN, encode

    rng = np.random.default_rng(18)
    r = rng.integers(0, 2**32, size=1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    for v in (_all_classes_and_neighbours(), r[np.isfinite(r)]):
        np.testing.assert_array_equal(_e4m3_f32(v), encode(v, E4M3FN, rounding="rne", saturate=True))


@pytest.mark.parametrize("recipe", FAST)
def test_fast_path_every_scale_byte_and_tie(recipe):
    """Every E4M3 scale byte (block amax on each E4M3 value, on each midpoint and one fp32 ulp either side) with,
    in every block, elements on each E2M1 tie (and the grid points) of that block's scale and one and two fp32 ulps
    either side, both signs; in bf16 (rounded) and fp32."""
    from fp4ref.blockscale import _fast_block_scales, _global_scales

    vals = ml_dtypes.finfo(ml_dtypes.float8_e4m3fn)
    e4 = np.arange(0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)  # 0 .. 448
    mids = (e4[1:] + e4[:-1]) / 2
    amax_e4 = np.concatenate([e4, mids, [float(vals.max) * 1.1]]).astype(np.float32)
    amax_e4 = np.concatenate([amax_e4, np.nextafter(amax_e4, np.float32(np.inf)),
                              np.nextafter(amax_e4, np.float32(0))])
    for tensor_amax in (2688.0, 1.0, 3.0e-3):
        # block amax chosen so that the recipe's pre-cast scale is about each E4M3 value / midpoint
        ab = (amax_e4.astype(np.float64) * 6 * tensor_amax / 2688).astype(np.float32)
        ab = ab[(ab <= tensor_amax) & (ab > 0)]
        gs = _global_scales(NVFP4Recipe(recipe), np.float32(tensor_amax))
        _, f, _ = _fast_block_scales(NVFP4Recipe(recipe), ab, gs)
        grid = np.array([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6], np.float64)
        with np.errstate(over="ignore", divide="ignore"):
            per = grid[None, :] * f[:, None] if recipe == "modelopt" else grid[None, :] / f[:, None]
        per = per.astype(np.float32)
        near = np.concatenate([per, np.nextafter(per, np.float32(np.inf)), np.nextafter(per, np.float32(0)),
                               np.nextafter(np.nextafter(per, np.float32(np.inf)), np.float32(np.inf)),
                               np.nextafter(np.nextafter(per, np.float32(0)), np.float32(0))], axis=1)
        near = np.where(np.abs(near) <= ab[:, None], near, 0).astype(np.float32)
        sign = np.where(np.arange(near.shape[1]) % 2, -1, 1).astype(np.float32)
        elems = np.concatenate([near * sign, -near * sign], axis=1)  # [blocks, 150]
        pad = (-elems.shape[1]) % 15
        elems = np.concatenate([elems, np.zeros((elems.shape[0], pad), np.float32)], axis=1)
        elems = elems.reshape(elems.shape[0], -1, 15)
        blocks = np.concatenate([np.broadcast_to(ab[:, None, None], elems.shape[:2] + (1,)), elems], axis=2)
        x = blocks.reshape(1, -1)
        x[0, 0] = tensor_amax
        _assert_fast_equals_reference(recipe, x, tensor_amax)
        _assert_fast_equals_reference(recipe, x.astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize("recipe", FAST)
def test_fast_path_special_values(recipe, monkeypatch):
    """Zero blocks, -0.0, float32 and bf16 subnormals, bf16 extremes, a tiny and a huge tensor amax, float16 and
    bfloat16 input, several ragged sub-chunks, no rows."""
    import fp4ref.blockscale as B

    monkeypatch.setattr(B, "_FAST_SUB", 3)  # sub-chunks of 3 blocks: every boundary case below crosses several
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    bmax = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    bsub = float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal)
    rows = [
        np.zeros(64),
        np.r_[-0.0, np.zeros(15), -0.0 * np.ones(16), 1.0, -0.0, np.zeros(30)],
        np.r_[tiny * np.arange(16), -tiny * np.arange(16), tiny, -tiny, np.zeros(30)],
        np.r_[bmax, -bmax, bsub, -bsub, 1.0, np.zeros(11), bsub * np.arange(16), np.full(32, bmax / 3)],
        np.r_[np.full(16, 1e-30), np.full(16, -3e-38), np.linspace(-6, 6, 32)],
    ]
    for r in rows:
        x = np.asarray(r, np.float64).astype(np.float32).reshape(1, -1)
        if np.max(np.abs(x)) == 0:
            continue  # all zero: the global amax is 0, which nvfp4_quantize handles before any fast path
        _assert_fast_equals_reference(recipe, x)
        _assert_fast_equals_reference(recipe, x.astype(ml_dtypes.bfloat16))
        if np.max(np.abs(x)) < 1e30:
            _assert_fast_equals_reference(recipe, x, amax=np.max(np.abs(x)) * 1e6)  # a calibrated amax above max|x|
    x16 = np.random.default_rng(3).standard_normal((5, 80)).astype(np.float16)
    _assert_fast_equals_reference(recipe, x16)
    _assert_fast_equals_reference(recipe, np.zeros((0, 32), np.float32), amax=1.0)


@pytest.mark.parametrize("recipe", FAST)
@given(data=st.data())
def test_fast_path_random_blocks(recipe, data):
    """Hypothesis: adversarial bf16 blocks (fp4ref.strategies.nvfp4_inputs) and raw finite float32 bit patterns,
    with the tensor amax or a calibrated amax above it."""
    from fp4ref.strategies import nvfp4_inputs

    rows = data.draw(st.integers(1, 5))
    nb = data.draw(st.integers(1, 6))
    x = data.draw(nvfp4_inputs(rows, 16 * nb))
    if np.max(np.abs(x.astype(np.float32))) > 0:
        _assert_fast_equals_reference(recipe, x)
    seed = data.draw(st.integers(0, 2**32 - 1))
    bits = np.random.default_rng(seed).integers(0, 2**32, size=(rows, 16 * nb), dtype=np.uint64).astype(np.uint32)
    bits = np.where(((bits >> 23) & 0xFF) == 0xFF, bits & 0x807FFFFF, bits)  # NaN/inf patterns -> finite
    y = bits.view(np.float32)
    scale = data.draw(st.sampled_from([1.0, 2.0**-100, 2.0**-140]))
    y = (y.astype(np.float64) * scale).astype(np.float32)  # rescaled: tiny and subnormal magnitudes too
    a = float(np.max(np.abs(y)))
    if a > 0:
        _assert_fast_equals_reference(recipe, y)
        factor = data.draw(st.sampled_from([1.5, 1e3]))
        if a * factor < 3e38:  # a finite float32 amax
            _assert_fast_equals_reference(recipe, y, amax=a * factor)


@pytest.mark.parametrize("recipe", FAST)
def test_nvfp4_quantize_uses_the_reference_bytes(recipe):
    """The public nvfp4_quantize (fast path for these recipes) equals the reference rows on a real-sized chunk."""
    from fp4ref.blockscale import _global_scales

    x = (np.random.default_rng(5).standard_normal((64, 4096), dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
    t = nvfp4_quantize(x, recipe=recipe)
    want_c, want_s = _reference_rows(recipe, x, _global_scales(NVFP4Recipe(recipe),
                                                               np.float32(np.max(np.abs(x.astype(np.float32))))))
    np.testing.assert_array_equal(t.codes, want_c)
    np.testing.assert_array_equal(t.scales, want_s)


def test_nvfp4_quantize_global_amax_minus_zero_is_the_magnitude_zero():
    """global_amax is a magnitude: -0.0 on all-zero x gives the tensor +0.0 gives (it gave a RuntimeWarning and
    global decode scale -0.0, refused by nvfp4_dequantize); on non-zero x it is refused as 0 is."""
    import warnings

    from fp4ref import blockscale as bs

    x = np.zeros((1, 16), np.float32)
    # te / sol / te-4over6 with amax 0: the global decode scale is the float32 of 2^-128 (a subnormal), 1.0 else
    want = {"te": 2.0**-128, "sol": 2.0**-128, "te-4over6": 2.0**-128, "torchao": 1.0, "modelopt": 1.0, "exact": 1.0}
    for rec in [r.value for r in bs.NVFP4Recipe if r not in bs._TORCHAO_SINGLE]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            q0 = bs.nvfp4_quantize(x, recipe=rec, global_amax=0.0)
            qm = bs.nvfp4_quantize(x, recipe=rec, global_amax=-0.0)
            qa = bs.nvfp4_quantize(x, recipe=rec, global_amax=np.array(-0.0, np.float32))
            for q in (qm, qa):
                assert math.copysign(1.0, float(q.global_decode_scale)) == 1.0, rec
                assert float(q.global_decode_scale) == float(q0.global_decode_scale), rec
                assert np.array_equal(q.codes, q0.codes) and np.array_equal(q.scales, q0.scales), rec
                assert not q.codes.any(), rec
                assert bs.nvfp4_dequantize(q).tolist() == [[0.0] * 16], rec
        if rec in want:
            assert float(qm.global_decode_scale) == want[rec], rec
        with pytest.raises(ValueError, match=r"global_amax=-0\.0 but x holds non-zero values"):
            bs.nvfp4_quantize(np.ones((1, 16), np.float32), recipe=rec, global_amax=-0.0)


def _one_block(g):
    from fp4ref import blockscale as bs

    # 16 codes 0x2 (E2M1 1.0), scale byte 0x38 (E4M3 1.0): each value is 1.0 * 1.0 * float32(g)
    return bs.NVFP4Tensor(codes=np.full((1, 8), 0x22, np.uint8), scales=np.full((1, 1), 0x38, np.uint8),
                          global_decode_scale=g, shape=(1, 16), recipe="sol", block=(1, 16), axis=1)


def test_nvfp4_tensor_global_decode_scale_is_a_finite_positive_float32():
    """An NVFP4Tensor's global decode scale is checked as nvfp4_linear's: rounded to float32 once, finite and > 0,
    a bool refused (1e39 and 3.5e38 decoded to inf with overflow warnings, 1e-46 to zeros, True was 1.0); a
    one-element array (compressed-tensors' shape [1]) is its element."""
    import warnings

    from fp4ref import blockscale as bs
    from fp4ref import gemm

    f32 = np.finfo(np.float32)
    for bad in (1e39, 3.5e38, 2.0**128, 10**400, 1e-46, 0.0, -0.0, -1.0, math.nan, math.inf,
                np.array([1e39]), np.array([-2.0], np.float32)):
        with pytest.raises(ValueError, match=r"^t\.global_decode_scale=.*expected a finite positive float"):
            bs.nvfp4_dequantize(_one_block(bad))
        with pytest.raises(ValueError, match=r"^xq\.global_decode_scale=.*expected a finite positive float"):
            gemm.nvfp4_gemm(_one_block(bad), _one_block(1.0))
    for bad in (True, np.True_, np.array(True), np.array([True]), np.array([1.0, 2.0]), 1 + 0j, "1.0"):
        with pytest.raises(TypeError, match=r"t\.global_decode_scale must be a real number"):
            bs.nvfp4_dequantize(_one_block(bad))
    # accepted: the float32 value of the scale, times 1.0; float64 decoding uses that float32 value as well
    cases = [(3, 3.0), (0.1, float(np.float32(0.1))), (np.float32(0.25), 0.25), (np.array(0.5), 0.5),
             (np.array([0.375], np.float32), 0.375), (np.array([[2.0]]), 2.0), (float(f32.max), float(f32.max)),
             (1e-45, 2.0**-149), (float(f32.smallest_normal), 2.0**-126)]
    for g, want in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for dt in (np.float32, np.float64):
                out = bs.nvfp4_dequantize(_one_block(g), dt)
                assert out.dtype == dt and out.tolist() == [[want] * 16], (g, dt)
    # nvfp4_gemm with a shape-[1] scale: 16 products 1 * 1, times 0.375 * 2 = 12 exactly
    ref = gemm.nvfp4_gemm(_one_block(np.array([0.375], np.float32)), _one_block(np.array([2.0], np.float32)))
    assert np.asarray(ref.exact, np.float64).tolist() == [[12.0]]


# ------------------------------------------------------------------------------------ non-native byte order

def _swapped(a: np.ndarray) -> np.ndarray:
    out = a.astype(a.dtype.newbyteorder("S"))
    assert not out.dtype.isnative and np.array_equal(out, a)
    return out


def _same_tensor(t1, t0):
    assert type(t1) is type(t0) and t1.shape == t0.shape and t1.axis == t0.axis and t1.block == t0.block
    assert t1.codes.dtype == t0.codes.dtype == np.uint8 and np.array_equal(t1.codes, t0.codes)
    assert t1.scales.dtype == t0.scales.dtype == np.uint8 and np.array_equal(t1.scales, t0.scales)
    if isinstance(t0, NVFP4Tensor):
        assert np.float32(t1.global_decode_scale).view(np.uint32) == np.float32(t0.global_decode_scale).view(np.uint32)


def test_float64_not_float32_big_endian_is_a_value_error():
    # '>f8' was not "float64" to a dtype == test, so 0.1 (not a float32 value) was rounded to float32 silently
    x = np.full((1, 32), 0.1)
    for f in (lambda a: nvfp4_quantize(a), lambda a: mx_quantize(a)):
        for a in (x, _swapped(x)):
            with pytest.raises(ValueError, match=r"^x is float64 and 32 value\(s\) are not float32 values"):
                f(a)


@pytest.mark.parametrize("dt", ["f2", "f4", "f8"])
def test_quantize_non_native_byte_order_is_bit_identical(dt):
    rng = np.random.default_rng(31)
    x = (rng.standard_normal((4, 64)) * np.exp2(rng.integers(-6, 6, (4, 64)))).astype(np.float32).astype(dt)
    for recipe in RECIPES:
        _same_tensor(nvfp4_quantize(_swapped(x), recipe=recipe), nvfp4_quantize(x, recipe=recipe))
    for elem in MX_ELEMENTS:
        for mode in MXMode:
            _same_tensor(mx_quantize(_swapped(x), elem, mode=mode), mx_quantize(x, elem, mode=mode))
    _same_tensor(nvfp4_quantize(x, global_amax=_swapped(np.array(7.5))), nvfp4_quantize(x, global_amax=7.5))


def test_dequantize_non_native_fields():
    import dataclasses

    rng = np.random.default_rng(32)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    q = nvfp4_quantize(x, recipe="sol")
    q_be = dataclasses.replace(q, codes=_swapped(q.codes.astype(np.uint16)),
                               scales=_swapped(q.scales.astype(np.uint32)),
                               global_decode_scale=_swapped(np.array(q.global_decode_scale)))
    assert np.array_equal(nvfp4_dequantize(q_be).view(np.uint32), nvfp4_dequantize(q).view(np.uint32))
    m = mx_quantize(x, "e4m3fn")
    m_be = dataclasses.replace(m, codes=_swapped(m.codes.astype(np.uint16)), scales=_swapped(m.scales.astype(np.int16)))
    assert np.array_equal(mx_dequantize(m_be).view(np.uint32), mx_dequantize(m).view(np.uint32))


def test_dequantize_dtype_none_is_refused_as_decode_refuses_it():
    # np.dtype(None) is float64: dtype=None silently gave float64 where fp4ref.decode raises
    q = nvfp4_quantize(np.ones((1, 16), np.float32), recipe="sol")
    m = mx_quantize(np.ones((1, 32), np.float32))
    for f, t in ((nvfp4_dequantize, q), (mx_dequantize, m)):
        for bad in (None, np.float16, "int32", "nope", object, ml_dtypes.bfloat16):
            with pytest.raises(TypeError, match=rf"^dtype must be float32 or float64, got {re.escape(repr(bad))}$"):
                f(t, dtype=bad)
        assert f(t, dtype="float64").dtype == np.float64 and f(t, dtype=np.float32).dtype == np.float32
        assert f(t).dtype == np.float32
    with pytest.raises(TypeError, match="dtype must be float32 or float64, got None"):
        from fp4ref import decode
        decode(np.array([1], np.uint8), "e2m1", dtype=None)


@pytest.mark.parametrize("elem, nbits", [("e2m1", 4), ("e2m3", 6), ("e3m2", 6)])
def test_mx_dequantize_names_t_codes_for_out_of_range_codes(elem, nbits):
    import dataclasses

    m = mx_quantize(np.ones((1, 32), np.float32), elem)
    for bad, dt in ((1 << nbits, np.uint8), (255, np.uint8), (-1, np.int8), (-1, np.int16)):
        codes = m.codes.astype(dt)
        codes[0, 5] = bad
        with pytest.raises(ValueError, match=rf"^t\.codes holds 1 value\(s\) outside the {nbits}-bit code range "
                                             rf"0\.\.{(1 << nbits) - 1} \(first {bad} at index \(0, 5\)\)"):
            mx_dequantize(dataclasses.replace(m, codes=codes))
    # the element's whole range decodes, from uint8 and int8 alike
    codes = np.arange(32, dtype=np.uint8).reshape(1, 32) % (1 << nbits)
    want = mx_dequantize(dataclasses.replace(m, codes=codes), dtype=np.float64)
    assert np.array_equal(mx_dequantize(dataclasses.replace(m, codes=codes.view(np.int8)), dtype=np.float64), want)
