"""Block-scaled formats: NVFP4 (E2M1 elements, E4M3FN block scales, fp32 global scale) and MX (OCP Microscaling:
E2M1/E2M3/E3M2/E4M3/E5M2 elements, UE8M0 block scales), with named recipes that reproduce their source bit for bit.

NVFP4 recipes (:class:`NVFP4Recipe`; :data:`NVFP4_RECIPES` gives each one's source, release and file; the fp32
arithmetic of each, in the source's order, is in its docstring)
    ``"te"``                    TransformerEngine >= 2.14's python reference (the default).
    ``"sol"``                   the NVFP4-linear workload's quantizer = TransformerEngine <= 2.13's order.
    ``"torchao"``               torchao 0.18 ``NVFP4Tensor.to_nvfp4`` (two-level, PyTorch path).
    ``"torchao-single-level"``  the same without a per-tensor scale.
    ``"torchao-0.16"``          torchao <= 0.16 (true division), and ``"torchao-0.16-single-level"``.
    ``"modelopt"``              NVIDIA ModelOpt 0.47 ``NVFP4QTensor.quantize``.
    ``"exact"``                 block scale and element codes from exact real quotients, each rounded once (RNE).
    ``"te-4over6"``             TransformerEngine 2.18's 4over6 block choice (MAE, e4m3_max 448), and its variants
                                ``"te-4over6-mse"``, ``"te-4over6-256"``, ``"te-4over6-mse-256"``.
  Every fp32 step is a numpy float32 operation (IEEE 754 binary32, round to nearest even: the same result as the
  source's torch/CUDA fp32 op); every "cast to E4M3FN / E2M1" step is :func:`fp4ref.formats.encode` (one exact RNE
  rounding) followed by the source's sign-of-zero rule. docs/quantization.md lists, for every pair of recipes, an
  input on which their bytes differ.

Scale layouts (``to_blocked`` / ``from_blocked``) are in :mod:`fp4ref.layouts` and re-exported here.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import math
import sys
from typing import NamedTuple

import numpy as np

from ._validate import (as_code_array, as_float_array, float32_of, global_scale_float32, is_int, normalize_axis,
                        real_scalar)
from .formats import E2M1, E2M3, E3M2, E4M3FN, E5M2, UE8M0, FloatFormat, decode, encode
from .layouts import LAYOUTS, blocked_offsets, blocked_size, from_blocked, to_blocked
from .packing import pack_fp4, unpack_fp4

__all__ = [
    "NVFP4Recipe",
    "NVFP4_RECIPES",
    "RecipeSource",
    "NVFP4Tensor",
    "nvfp4_quantize",
    "nvfp4_dequantize",
    "MXMode",
    "MXTensor",
    "MX_ELEMENTS",
    "mx_quantize",
    "mx_dequantize",
    "LAYOUTS",
    "to_blocked",
    "from_blocked",
    "blocked_offsets",
    "blocked_size",
]

_F32 = np.float32
_FLT_MAX = _F32(np.finfo(np.float32).max)
_E4M3_MAX = _F32(448.0)
_E2M1_MAX = _F32(6.0)
_NVFP4_BLOCK = 16
_CHUNK_ELEMS = 1 << 20  # elements per row chunk: bounds temporaries (peak memory) and keeps them cache-friendly


# ---------------------------------------------------------------------------------------------------------- NVFP4


class NVFP4Recipe(str, enum.Enum):
    """Named NVFP4 quantization recipes, each reproducing one release of its source byte for byte.

    Notation: x the input in fp32, A = max|x| over the tensor (or the ``global_amax`` given), a = max|x| over the
    block, all arithmetic fp32 RNE in the order written, e4m3(.) = RNE cast to E4M3FN, e2m1(.) = RNE cast to E2M1,
    FLT_MAX = 3.4028235e38. :data:`NVFP4_RECIPES` gives each recipe's source, release and file;
    docs/quantization.md (generated from it) lists, for every pair of recipes, a two-block input on which their
    bytes differ.
    """

    TE = "te"
    """TransformerEngine >= 2.14 (modelled on 2.18; the source is the same in 2.20.2),
    ``NVFP4QuantizerRef._quantize_blockwise_reference`` in transformer_engine/pytorch/custom_recipes/
    quantization_ref_nvfp4.py (reference_nvfp4.py from 2.19; and, at 2.18, its CUDA kernels' default path)::

        S_enc = min(2688 / A, FLT_MAX); if S_enc == 0: S_enc = 1      # 2688 = 448 * 6
        S_dec = 1 / S_enc                                             # stored global decode scale
        m     = S_enc * fp32(1/6)                                     # fp32(1/6) = torch.reciprocal(6.0)
        s     = e4m3(clamp(min(a * m, FLT_MAX), -448, 448))
        enc   = min(1 / (fp32(s) * S_dec), FLT_MAX)
        code  = e2m1(clamp(x * enc, -6, 6))
    Sign of zero: the source casts by comparisons (``cast_to_fp4x2``): [-0.25, -0) -> 0x8 but -0.0 itself -> 0x0.
    Smallest differing inputs (docs/quantization.md case #): sol 1, torchao 1, torchao-single-level 1,
    torchao-0.16 1, torchao-0.16-single-level 1, modelopt 1, exact 1, te-4over6 1, te-4over6-mse 1, te-4over6-256
    1, te-4over6-mse-256 1.
    """

    SOL = "sol"
    """The NVFP4-linear workload's quantizer, which is TransformerEngine <= 2.13's order
    (``s = (a / 6) * S_enc``: quantization_nvfp4.py before the ``global_encode_scale_multiplier`` change, and the
    ``ComputeDecodeScaleFP4`` CUDA helper ``decode_scale = amax / 6.0f; decode_scale *= global_encode_scale``)::

        S_enc = min(2688 / A, FLT_MAX); if S_enc == 0: S_enc = 1
        S_dec = 1 / S_enc
        s     = e4m3(clamp(min((a / 6) * S_enc, FLT_MAX), -448, 448))
        enc   = min(1 / (fp32(s) * S_dec), FLT_MAX)
        code  = e2m1(clamp(x * enc, -6, 6))            # -0.0 -> 0x0, [-0.25, -0) -> 0x8
    Differs from "te" only in the block-scale product: (a/6)*S_enc vs a*(S_enc*fp32(1/6)).
    Smallest differing inputs (docs/quantization.md case #): te 1, torchao 5, torchao-single-level 1, torchao-0.16
    5, torchao-0.16-single-level 1, modelopt 4, exact 2, te-4over6 1, te-4over6-mse 1, te-4over6-256 1,
    te-4over6-mse-256 1.
    """

    TORCHAO = "torchao"
    """torchao 0.18.0 ``NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_amax_to_scale(A))``, PyTorch path
    (``nvfp4_quantize`` in torchao/prototype/mx_formats/nvfp4_tensor.py; two-level scaling)::

        pts   = A / 2688                                              # stored global decode scale
        s     = e4m3(clamp((a / 6) / pts, 2^-6, 448))                 # E4M3_EPS = finfo(e4m3fn).tiny = 2^-6
        r     = (1 / pts) / fp32(s)                                   # reciprocal order (torchao >= 0.17)
        code  = e2m1(clamp(x * r, -6, 6))                             # -0.0 -> 0x8 (sign kept)
    fp4ref policies where the source gives NaN: A == 0 (or A/2688 rounding to 0) uses pts = 1 (the source divides
    0/0); when 1/pts overflows to inf (pts <= 2^-128, i.e. 0 < A < about 2688 * 2^-128) the source's x * inf makes
    every non-zero element +-6 (reproduced) and every zero element NaN, whose codes torchao derives from the NaN's
    bits; fp4ref gives those elements the zero code of their sign (0x0 / 0x8). Such tensors dequantize to garbage in
    the source too: use "torchao-0.16" or "exact" for them.
    Smallest differing inputs (docs/quantization.md case #): te 1, sol 5, torchao-single-level 1, torchao-0.16 7,
    torchao-0.16-single-level 1, modelopt 4, exact 2, te-4over6 1, te-4over6-mse 1, te-4over6-256 1,
    te-4over6-mse-256 1.
    """

    TORCHAO_SINGLE_LEVEL = "torchao-single-level"
    """torchao 0.18.0 ``NVFP4Tensor.to_nvfp4(x)`` without a per-tensor scale (single-level scaling), same file::

        s     = e4m3(clamp(a / 6, 2^-6, 448))                         # blocks with a > 2688 saturate
        code  = e2m1(clamp(x * (1 / fp32(s)), -6, 6))                 # -0.0 -> 0x8
    The global decode scale is 1.0.
    Smallest differing inputs (docs/quantization.md case #): te 1, sol 1, torchao 1, torchao-0.16 1,
    torchao-0.16-single-level 9, modelopt 1, exact 1, te-4over6 1, te-4over6-mse 1, te-4over6-256 1,
    te-4over6-mse-256 1.
    """

    TORCHAO_0_16 = "torchao-0.16"
    """torchao <= 0.16 (checked against 0.16.0), two-level, same function: true division, for checkpoints made with
    those releases (fp4ref's "torchao" before it followed 0.18)::

        pts   = A / 2688
        s     = e4m3(clamp((a / 6) / pts, 2^-6, 448))
        code  = e2m1(clamp(x / (pts * fp32(s)), -6, 6))               # -0.0 -> 0x8
    fp4ref policies where the source gives NaN: pts = 1 when A/2688 rounds to 0; where pts * fp32(s) rounds to 0
    (A below about 2688 * 2^-144), a zero element's 0 / 0 gets the zero code of its sign (0x0 / 0x8).
    Smallest differing inputs (docs/quantization.md case #): te 1, sol 5, torchao 7, torchao-single-level 1,
    torchao-0.16-single-level 1, modelopt 4, exact 2, te-4over6 1, te-4over6-mse 1, te-4over6-256 1,
    te-4over6-mse-256 1.
    """

    TORCHAO_0_16_SINGLE_LEVEL = "torchao-0.16-single-level"
    """torchao <= 0.17 (checked against 0.16.0) without a per-tensor scale::

        s     = e4m3(clamp(a / 6, 2^-6, 448))
        code  = e2m1(clamp(x / fp32(s), -6, 6))                       # -0.0 -> 0x8
    Smallest differing inputs (docs/quantization.md case #): te 1, sol 1, torchao 1, torchao-single-level 9,
    torchao-0.16 1, modelopt 1, exact 1, te-4over6 1, te-4over6-mse 1, te-4over6-256 1, te-4over6-mse-256 1.
    """

    MODELOPT = "modelopt"
    """NVIDIA ModelOpt 0.47.0 ``NVFP4QTensor.quantize`` (modelopt/torch/quantization/qtensor/nvfp4_tensor.py)::

        sf2   = A / 2688                                              # weight_scale_2, stored global decode scale
        p     = a / (6 * sf2); p[p == 0] = 1.0                        # zero blocks get scale 1.0
        s     = e4m3(clamp(p, 2^-9, 448))                             # _cast_per_block_scale_to_fp8
        code  = e2m1(x / (fp32(s) * sf2))                             # true division, saturating at 6
    Sign of zero: ``_cast_fp4`` takes sign = (x < 0), so -0.0 -> 0x0 and [-0.25, -0) -> 0x8; ties by its bound
    table are RNE. fp4ref policies where the source gives NaN: A == 0, or A / 2688 rounding to 0 (0 < A < about
    2688 * 2^-150), uses sf2 = 1 (as ModelOpt's numpy export helper ``get_weights_scaling_factor_2`` does at A == 0;
    ModelOpt 0.47.0 keeps sf2 = 0 there, and every code comes from x / 0); where fp32(s) * sf2 rounds to 0 (tensor
    amax below about 2^-129.6) a zero element's 0 / 0 is NaN in the source, cast to 0x7 (+6), and fp4ref gives it
    0x0 (docs/quantization.md, "ModelOpt").
    Smallest differing inputs (docs/quantization.md case #): te 1, sol 4, torchao 4, torchao-single-level 1,
    torchao-0.16 4, torchao-0.16-single-level 1, exact 2, te-4over6 1, te-4over6-mse 1, te-4over6-256 1,
    te-4over6-mse-256 1.
    """

    EXACT = "exact"
    """Exact quotients, each rounded once (RNE), the global scale as the others store it::

        d    = fp32(A / 2688)                                         # one rounding (fp32 division)
        s    = e4m3_sat(a / (6 d))                                    # exact real quotient, one RNE rounding
        code = e2m1_sat(x / (fp32(s) d))                              # exact real quotient, one RNE rounding
    Computed in float64: 6d and s*d are exact products (<= 28 significant bits), and a float64 quotient of a
    24-bit numerator by a <= 28-bit denominator cannot land on an E4M3/E2M1 rounding tie unless the real quotient
    is that tie (the tie times the denominator has <= 33 bits, so a non-zero difference is >= 2^-34 relative),
    so the float64 quotient rounds to the same code as the real one. Policies: -0.0 and negative values that round
    to zero give 0x8 (as :func:`fp4ref.formats.encode`); a block whose scale rounds to 0 gets codes 0; A == 0 uses
    d = 1; a non-zero A below 2688 * 2^-150 (d would be 0) uses d = 2^-149.
    Smallest differing inputs (docs/quantization.md case #): te 1, sol 2, torchao 2, torchao-single-level 1,
    torchao-0.16 2, torchao-0.16-single-level 1, modelopt 2, te-4over6 1, te-4over6-mse 1, te-4over6-256 1,
    te-4over6-mse-256 1.
    """

    TE_4OVER6 = "te-4over6"
    """TransformerEngine 2.18's "4over6" option (``NVFP4QuantizerRef(nvfp4_use_4over6=True)``, defaults
    ``nvfp4_e4m3_max=448``, ``nvfp4_4over6_err_mode="MAE"``; ``_quantize_blockwise_4over6_reference`` in
    transformer_engine/pytorch/custom_recipes/quantization_ref_nvfp4.py, first in 2.17; reference_nvfp4.py from
    2.19, the same arithmetic through 2.20.2). Each block is quantized
    twice, with its amax mapped to 6 and to 4 (a 1.5x larger block scale), and keeps the candidate with the smaller
    block error (a tie keeps map-to-6)::

        S_enc = min((6 * E) / A, FLT_MAX); if S_enc == 0: S_enc = 1   # E = nvfp4_e4m3_max (448 here)
        S_dec = 1 / S_enc
        b     = (a / 6) * S_enc                                       # TE <= 2.13's order, as "sol"
        s6    = e4m3(clamp(b, -448, 448));  s4 = e4m3(clamp(b * 1.5, -448, 448))
        code_k = e2m1(clamp(x * min(1 / (fp32(s_k) * S_dec), FLT_MAX), -6, 6))   # k = 4, 6; -0.0 -> 0x0
        err_k = sum over the block's 16 elements in order of |((e2m1(code_k) * fp32(s_k)) * A) / (6 * E) - x|
        pick map-to-4 iff err_4 < err_6                               # fp32 throughout
    With ``block=(16, 16)`` the 16 rows' errors of a tile are added in the CUDA warp's tree order
    (rows i and i+8, then i and i+4, i+2, i+1) and the tile picks once.
    Smallest differing inputs (docs/quantization.md case #): te 1, sol 1, torchao 1, torchao-single-level 1,
    torchao-0.16 1, torchao-0.16-single-level 1, modelopt 1, exact 1, te-4over6-mse 8, te-4over6-256 1,
    te-4over6-mse-256 1.
    """

    TE_4OVER6_MSE = "te-4over6-mse"
    """As "te-4over6" with ``nvfp4_4over6_err_mode="MSE"``: err_k sums (v - x) * (v - x) instead of |v - x|.
    Smallest differing inputs (docs/quantization.md case #): te 1, sol 1, torchao 1, torchao-single-level 1,
    torchao-0.16 1, torchao-0.16-single-level 1, modelopt 1, exact 1, te-4over6 8, te-4over6-256 1,
    te-4over6-mse-256 1.
    """

    TE_4OVER6_256 = "te-4over6-256"
    """As "te-4over6" with ``nvfp4_e4m3_max=256``: S_enc = 1536 / A (global decode scale A / (6 * 256)), leaving
    headroom so that map-to-4 block scales (1.5x) stay below 448; the error divides by 6 * 256 = 1536.
    Smallest differing inputs (docs/quantization.md case #): te 1, sol 1, torchao 1, torchao-single-level 1,
    torchao-0.16 1, torchao-0.16-single-level 1, modelopt 1, exact 1, te-4over6 1, te-4over6-mse 1,
    te-4over6-mse-256 11.
    """

    TE_4OVER6_MSE_256 = "te-4over6-mse-256"
    """As "te-4over6" with ``nvfp4_4over6_err_mode="MSE"`` and ``nvfp4_e4m3_max=256``.
    Smallest differing inputs (docs/quantization.md case #): te 1, sol 1, torchao 1, torchao-single-level 1,
    torchao-0.16 1, torchao-0.16-single-level 1, modelopt 1, exact 1, te-4over6 1, te-4over6-mse 1, te-4over6-256
    11.
    """


@dataclass(frozen=True)
class RecipeSource:
    """Where an NVFP4 recipe comes from (one row of docs/quantization.md's generated recipe table).

    Attributes:
        library: the source and the release(s) reproduced (``"torchao 0.18.0"``).
        file: the file in the source's repository.
        function: the function or class reproduced.
        global_scale, block_scale, element: the fp32 formulas of the stored global decode scale, the block-scale
            byte and the element code (notation of :class:`NVFP4Recipe`).
        negative_zero: the code -0.0 gets.
        zero_block: the scale byte of an all-zero block in a non-zero tensor.
    """

    library: str
    file: str
    function: str
    global_scale: str
    block_scale: str
    element: str
    negative_zero: str
    zero_block: str


# (renamed reference_nvfp4.py in 2.19, its quantizer unchanged through 2.20.2)
_TE_FILE = "transformer_engine/pytorch/custom_recipes/quantization_ref_nvfp4.py"
_TAO_FILE = "torchao/prototype/mx_formats/nvfp4_tensor.py"
_TE_GLOBAL = "`S_enc = min(2688/A, FLT_MAX)` (A = 0: FLT_MAX; 1 where that gives 0, A = inf); `S_dec = 1/S_enc`"
_TE_ELEM = "`e2m1(clamp(x * min(1/(s * S_dec), FLT_MAX), ±6))`"
_4OVER6 = ("`b = (a/6) * S_enc`; `s6 = e4m3(clamp(b, ±448))`, `s4 = e4m3(clamp(b * 1.5, ±448))`; the candidate "
           "with the smaller block {err} (tie: map-to-6)")
_4OVER6_GLOBAL = "`S_enc = min({n}/A, FLT_MAX)` (A = 0: FLT_MAX; 1 where that gives 0, A = inf); `S_dec = 1/S_enc`"

#: The recipe registry: every :class:`NVFP4Recipe` and its :class:`RecipeSource`. Drives docs/quantization.md's
#: recipe table (``python -m fp4ref.tables quantization``), the CLI's ``--recipe`` choices and the tests.
NVFP4_RECIPES: dict = {
    NVFP4Recipe.TE: RecipeSource(
        "TransformerEngine >= 2.14 (modelled on 2.18; the same source in 2.20.2, whose file is reference_nvfp4.py)",
        _TE_FILE,
        "NVFP4QuantizerRef._quantize_blockwise_reference",
        _TE_GLOBAL, "`e4m3(clamp(min(a * (S_enc * fp32(1/6)), FLT_MAX), ±448))`", _TE_ELEM, "0x0", "0x00"),
    NVFP4Recipe.SOL: RecipeSource(
        "TransformerEngine <= 2.13; the NVFP4-linear workload",
        "transformer_engine/pytorch/custom_recipes/quantization_nvfp4.py", "NVFP4QuantizerRef (older order)",
        _TE_GLOBAL, "`e4m3(clamp(min((a/6) * S_enc, FLT_MAX), ±448))`", _TE_ELEM, "0x0", "0x00"),
    NVFP4Recipe.TORCHAO: RecipeSource(
        "torchao 0.18.0 (two-level)", _TAO_FILE, "nvfp4_quantize (PyTorch path)", "`pts = A/2688`",
        "`e4m3(clamp((a/6)/pts, 2^-6, 448))`", "`e2m1(clamp(x * ((1/pts)/s), ±6))`", "0x8", "0x08"),
    NVFP4Recipe.TORCHAO_SINGLE_LEVEL: RecipeSource(
        "torchao 0.18.0 (single-level)", _TAO_FILE, "nvfp4_quantize, per_tensor_scale=None", "1.0",
        "`e4m3(clamp(a/6, 2^-6, 448))`", "`e2m1(clamp(x * (1/s), ±6))`", "0x8", "0x08"),
    NVFP4Recipe.TORCHAO_0_16: RecipeSource(
        "torchao <= 0.16 (checked: 0.16.0; two-level)", _TAO_FILE, "nvfp4_quantize (PyTorch path)",
        "`pts = A/2688`", "`e4m3(clamp((a/6)/pts, 2^-6, 448))`", "`e2m1(clamp(x / (pts * s), ±6))`", "0x8", "0x08"),
    NVFP4Recipe.TORCHAO_0_16_SINGLE_LEVEL: RecipeSource(
        "torchao <= 0.17 (checked: 0.16.0; single-level)", _TAO_FILE, "nvfp4_quantize, per_tensor_scale=None", "1.0",
        "`e4m3(clamp(a/6, 2^-6, 448))`", "`e2m1(clamp(x / s, ±6))`", "0x8", "0x08"),
    NVFP4Recipe.MODELOPT: RecipeSource(
        "ModelOpt 0.47.0", "modelopt/torch/quantization/qtensor/nvfp4_tensor.py", "NVFP4QTensor.quantize",
        "`sf2 = A/2688`", "`p = a/(6*sf2)`, `p = 1 if p == 0`, `e4m3(clamp(p, 2^-9, 448))`",
        "`e2m1(x / (s * sf2))` (saturating)", "0x0", "0x38"),
    NVFP4Recipe.EXACT: RecipeSource(
        "fp4ref", "fp4ref/blockscale.py", "NVFP4Recipe.EXACT", "`d = fp32(A/2688)`",
        "`e4m3_sat(a / (6d))`, exact quotient", "`e2m1_sat(x / (s d))`, exact quotient", "0x8", "0x00"),
    NVFP4Recipe.TE_4OVER6: RecipeSource(
        "TransformerEngine 2.18-2.20.2, 4over6, MAE, e4m3_max 448", _TE_FILE,
        "NVFP4QuantizerRef._quantize_blockwise_4over6_reference", _4OVER6_GLOBAL.format(n=2688),
        _4OVER6.format(err="sum of abs errors"), _TE_ELEM + " per candidate", "0x0", "0x00"),
    NVFP4Recipe.TE_4OVER6_MSE: RecipeSource(
        "TransformerEngine 2.18-2.20.2, 4over6, MSE, e4m3_max 448", _TE_FILE,
        "NVFP4QuantizerRef._quantize_blockwise_4over6_reference", _4OVER6_GLOBAL.format(n=2688),
        _4OVER6.format(err="sum of squared errors"), _TE_ELEM + " per candidate", "0x0", "0x00"),
    NVFP4Recipe.TE_4OVER6_256: RecipeSource(
        "TransformerEngine 2.18-2.20.2, 4over6, MAE, e4m3_max 256", _TE_FILE,
        "NVFP4QuantizerRef._quantize_blockwise_4over6_reference", _4OVER6_GLOBAL.format(n=1536),
        _4OVER6.format(err="sum of abs errors"), _TE_ELEM + " per candidate", "0x0", "0x00"),
    NVFP4Recipe.TE_4OVER6_MSE_256: RecipeSource(
        "TransformerEngine 2.18-2.20.2, 4over6, MSE, e4m3_max 256", _TE_FILE,
        "NVFP4QuantizerRef._quantize_blockwise_4over6_reference", _4OVER6_GLOBAL.format(n=1536),
        _4OVER6.format(err="sum of squared errors"), _TE_ELEM + " per candidate", "0x0", "0x00"),
}
assert set(NVFP4_RECIPES) == set(NVFP4Recipe)

# 4over6 recipes: (nvfp4_e4m3_max, err mode)
_FOUR_OVER_SIX = {
    NVFP4Recipe.TE_4OVER6: (448, "MAE"),
    NVFP4Recipe.TE_4OVER6_MSE: (448, "MSE"),
    NVFP4Recipe.TE_4OVER6_256: (256, "MAE"),
    NVFP4Recipe.TE_4OVER6_MSE_256: (256, "MSE"),
}
_TORCHAO_TWO_LEVEL = (NVFP4Recipe.TORCHAO, NVFP4Recipe.TORCHAO_0_16)
_TORCHAO_SINGLE = (NVFP4Recipe.TORCHAO_SINGLE_LEVEL, NVFP4Recipe.TORCHAO_0_16_SINGLE_LEVEL)
#: recipes with a global ENCODE scale S_enc = 6 * E4M3max / amax whose fp32 reciprocal is their decode scale
_S_ENC_RECIPES = (NVFP4Recipe.TE, NVFP4Recipe.SOL, *_FOUR_OVER_SIX)


@dataclass(frozen=True)
class NVFP4Tensor:
    """An NVFP4-quantized array.

    Attributes:
        codes: uint8, packed E2M1 codes (element 2i in bits 3:0), the input shape with K (the length along ``axis``)
            halved.
        scales: uint8, E4M3FN block-scale bytes (UE4M3: the sign bit is ignored on decode), the input shape with K
            replaced by K/16. For ``block=(16, 16)`` each 16x16 tile's scale is repeated on its 16 rows.
        global_decode_scale: float32 scalar; value = e2m1(code) * e4m3(scale) * global_decode_scale. One given by
            hand may be any real scalar, a 0-d array or tensor, or a one-element array or tensor (compressed-tensors
            stores it with shape [1]); decoding rounds it to float32 (RNE) once and needs that value finite and
            > 0 (a bool is refused).
        shape: the input shape.
        recipe: the :class:`NVFP4Recipe` value used. A label only: decoding neither reads nor checks it, and a
            hand-built tensor may give another one (:func:`fp4ref.strategies.nvfp4_operands` gives ``"raw"``,
            operands that no recipe quantized).
        block: (1, 16) or (16, 16) (a hand-built tensor may also give the int 16, = (1, 16)).
        axis: the axis that was quantized in blocks (non-negative in a tensor :func:`nvfp4_quantize` returns; a
            hand-built tensor may give a negative one, counted from the end as in numpy).

    Decoding checks a hand-built tensor's fields: ``shape`` a tuple (or list) of non-negative ints, ``axis`` an int
    in range for it (TypeError / ValueError naming ``t.shape`` / ``t.axis``), ``block`` one of the above
    (``t.block``), the length along ``axis`` a multiple of 16, and codes / scales integer byte arrays of the shapes
    these imply (int8 is read as unsigned bytes, bits unchanged, as :func:`fp4ref.decode` reads it, e.g. torch int8
    storage; a float or float8 array is a TypeError).
    """

    codes: np.ndarray
    scales: np.ndarray
    global_decode_scale: np.float32
    shape: tuple
    recipe: str
    block: tuple
    axis: int


def _parse_enum(value, enum_cls, arg: str, flag: str = ""):
    """``value`` (a member of the str enum ``enum_cls`` or its name, any case) -> the member. TypeError for a value
    that is not a str, ValueError for an unknown name; both name the argument ``arg`` (and ``flag``, the CLI option,
    if given) and list the names."""
    if isinstance(value, enum_cls):
        return value
    names = [m.value for m in enum_cls]
    what = f"{arg}={value!r}" + (f" ({flag})" if flag else "")
    if not isinstance(value, str):
        raise TypeError(f"{what}: expected an {enum_cls.__name__} or one of its names {names}, got "
                        f"{type(value).__name__}")
    try:
        return enum_cls(value.lower())
    except ValueError:
        raise ValueError(f"{what} is not one of {names}") from None


def _parse_recipe(recipe, flag: str = "") -> NVFP4Recipe:
    """``recipe`` -> :class:`NVFP4Recipe` (:func:`_parse_enum`)."""
    return _parse_enum(recipe, NVFP4Recipe, "recipe", flag)


def _parse_nvfp4_block(block, name: str = "block") -> tuple:
    """``block`` -> (1, 16) or (16, 16). TypeError: not an int or a tuple of two ints (16.0, "16", True, None,
    a list); ValueError: an int or int tuple of another value. Both name ``name``."""
    if not (is_int(block) or (isinstance(block, tuple) and all(is_int(b) for b in block))):
        raise TypeError(f"{name}={block!r}: expected the int 16 or a tuple of ints (16, 16), got "
                        f"{type(block).__name__}")
    if is_int(block) and block == 16:
        return (1, 16)
    if isinstance(block, tuple) and block in ((1, 16), (16, 16)):
        return tuple(int(b) for b in block)
    raise ValueError(
        f"{name}={block!r} is not an NVFP4 block; expected 16 (= (1, 16), 16 elements along axis) or (16, 16) "
        "(TransformerEngine's 2-D weight tiles)"
    )


def _shape_and_axis(t, name: str) -> tuple[tuple, int]:
    """(shape as a tuple of ints, axis as a non-negative int) of a hand-built NVFP4Tensor / MXTensor ``name``.
    TypeError: ``shape`` not a tuple or list of ints, ``axis`` not an int; ValueError: a negative dimension, an
    axis out of range (-ndim <= axis < ndim is accepted; a negative one counts from the end). Both name the
    field (``t.shape``, ``t.axis``)."""
    shape = t.shape
    if not isinstance(shape, (tuple, list)) or not all(is_int(d) for d in shape):
        raise TypeError(f"{name}.shape={shape!r}: expected a tuple of ints, got {type(shape).__name__}")
    if any(d < 0 for d in shape):
        raise ValueError(f"{name}.shape={tuple(shape)!r} has a negative dimension")
    shape = tuple(int(d) for d in shape)
    return shape, normalize_axis(t.axis, len(shape), f"{name}.axis")


def _as_f32_input(x, name: str) -> np.ndarray:
    """float16 / bfloat16 / float32 as float32 (exact widening); float64 only if every value is a float32."""
    arr = as_float_array(x, name)
    if arr.dtype == np.float64:
        with np.errstate(over="ignore"):  # values beyond float32 are reported below, as not float32 values
            f = arr.astype(np.float32)
        same = (f.astype(np.float64) == arr) | (np.isnan(arr) & np.isnan(f))
        if not np.all(same):
            bad = np.flatnonzero(~same)
            first = np.unravel_index(bad[0], arr.shape)
            raise ValueError(
                f"{name} is float64 and {bad.size} value(s) are not float32 values (first {arr[first].item()!r} at "
                f"index {tuple(int(i) for i in first)}); the recipes work on float32 inputs: round explicitly with "
                f"{name}.astype(np.float32) if that is what you mean"
            )
        return f
    return arr.astype(np.float32, copy=False)


def _max_abs(x: np.ndarray) -> np.float32:
    """max|x| as float32 without a temporary |x| array (max and min reductions; NaN propagates)."""
    if x.size == 0:
        return _F32(0.0)
    hi = np.max(x)
    if np.isnan(hi):
        return _F32(np.nan)
    return _F32(abs(max(hi, -np.min(x))))  # abs: an all-(-0.0) array gives +0.0


def _check_nonfinite(xf: np.ndarray, policy: str, name: str = "x") -> np.ndarray:
    if xf.size == 0 or np.isfinite(np.max(xf)) and np.isfinite(np.min(xf)):  # two reductions, no temporary
        return xf
    bad = ~np.isfinite(xf)
    if not bad.any():
        return xf
    if policy == "raise":
        first = np.unravel_index(int(np.flatnonzero(bad)[0]), xf.shape)
        raise ValueError(
            f"{name} holds {int(bad.sum())} NaN/inf value(s) (first {xf[first].item()!r} at index "
            f"{tuple(int(i) for i in first)}); pass nonfinite='zero' to quantize them as 0"
        )
    xf = xf.copy()
    xf[bad] = 0.0
    return xf


def _global_scales(recipe: NVFP4Recipe, amax: np.float32) -> dict:
    """The recipe's global fp32 quantities (see NVFP4Recipe)."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if recipe in _S_ENC_RECIPES:
            e4m3_max = _FOUR_OVER_SIX[recipe][0] if recipe in _FOUR_OVER_SIX else 448
            s_enc = np.minimum(_F32(6.0) * _F32(e4m3_max) / amax, _FLT_MAX)  # k / 0 = inf -> FLT_MAX
            if s_enc == 0:
                s_enc = _F32(1.0)
            s_dec = _F32(1.0) / s_enc
            return {"s_enc": _F32(s_enc), "s_dec": _F32(s_dec), "mult": _F32(s_enc * (_F32(1.0) / _F32(6.0))),
                    "stored": _F32(s_dec), "amax": _F32(amax), "e4m3_max": e4m3_max}
        if recipe in _TORCHAO_SINGLE:
            return {"stored": _F32(1.0)}
        g = _F32(amax / _F32(2688.0))
        if recipe is NVFP4Recipe.EXACT:
            if g == 0:
                g = _F32(1.0) if amax == 0 else _F32(np.ldexp(1.0, -149))
        elif g == 0:  # torchao / modelopt: fp4ref policy for A == 0 (the sources give NaN)
            g = _F32(1.0)
        return {"g": g, "stored": g, "rcp": _F32(_F32(1.0) / g)}  # rcp: inf where g <= 2^-128 (torchao 0.18)


def _encode_e2m1(y: np.ndarray) -> np.ndarray:
    """E2M1 codes of finite float32/float64 values (RNE, saturating): formats.encode."""
    return encode(y, E2M1, rounding="rne", saturate=True)


@functools.lru_cache(maxsize=None)
def _e2m1_table(negative_zero: bool) -> np.ndarray:
    """formats.encode(., E2M1) (RNE, saturating) tabulated over float32 bit patterns: index (bits >> 16) * 2 +
    (bits & 0xFFFF != 0).

    RNE to E2M1 keeps the sign, exponent and one mantissa bit; its round bit is float32 mantissa bit 21 or higher and
    everything below is only "sticky". So two float32 values with the same top 16 bits and the same "low 16 bits
    zero?" answer round to the same code, and each of the 2^17 classes is represented exactly by its member with low
    bits 0 or 1. (tests/test_blockscale.py compares the table path with encode on every class and on random values;
    a slow test on all 2^32 patterns.) NaN classes hold 0 (inputs are checked finite before). With
    ``negative_zero=False`` the entry of exactly -0.0 is 0x0 (TE / ModelOpt sign-of-zero rule).
    """
    hi = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    table = np.empty((1 << 16, 2), dtype=np.uint8)
    table[:, 0] = encode(hi.view(np.float32), E2M1, rounding="rne", saturate=True, nan="zero")
    table[:, 1] = encode((hi | np.uint32(1)).view(np.float32), E2M1, rounding="rne", saturate=True, nan="zero")
    table = table.reshape(-1)
    if not negative_zero:
        table[0x8000 * 2] = 0
    table.flags.writeable = False
    return table


def _e2m1_f32(y: np.ndarray, negative_zero: bool = True) -> np.ndarray:
    """E2M1 codes (RNE, saturating) of a float32 array: the same codes as formats.encode, through _e2m1_table."""
    b = np.ascontiguousarray(y, dtype=np.float32).view(np.uint32)
    idx = b >> np.uint32(15)  # (bits >> 16) * 2 + bit 15
    idx |= (b & np.uint32(0x7FFF)) != 0  # ... | any of bits 14..0
    return _e2m1_table(negative_zero)[idx]


def _pack(codes: np.ndarray) -> np.ndarray:
    """Two valid 4-bit codes per byte along the last axis, element 2i low (fp4ref.packing.pack_fp4's order)."""
    return codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))


# ------------------------------------------------------------------ fast path: recipes te, sol, modelopt, 1x16 blocks
#
# _nvfp4_rows works on blocks xb [r, nb, 16]: numpy reduces the 16-element axis and broadcasts the per-block factor
# one short row at a time, and it encodes, packs and (in fp4ref quantize) dequantizes again in separate full-size
# passes over chunks larger than the cache. _nvfp4_rows_fast gives the same bytes with the same fp32 operations on
# each element, in a cheaper order: the blocks are transposed to [16, m] (one element position of every block per
# contiguous row), so the block amax is four contiguous maximum() calls and the factor broadcasts along rows;
# each sub-chunk of _FAST_SUB blocks goes from the transpose to the statistics while its buffers are in the cache;
# one table gather gives each element's E2M1 code (in its nibble) and value, so the statistics of fp4ref quantize
# need no second dequantize; the E4M3 scale bytes come from a table over the same float32 classes as the codes.
# tests/test_blockscale.py proves it byte-identical to _nvfp4_rows (every tie class, every scale byte, special
# values, Hypothesis on random blocks).

#: Recipes with one fp32 element step x (op) f, f per block (te, sol: x * enc; modelopt: x / (s * sf2)), and the
#: E2M1 cast that maps -0.0 to 0x0.
_FAST_RECIPES = (NVFP4Recipe.TE, NVFP4Recipe.SOL, NVFP4Recipe.MODELOPT)
_FAST_SUB = 8192  # blocks per sub-chunk (128K elements, ~3.5 MiB of scratch): the fastest of 2048..32768 measured
_LOW_BYTE = 0 if sys.byteorder == "little" else 3  # offset of a uint32's least significant byte


_DOT_PIECE = 8192  # OpenBLAS runs ddot single-threaded up to 10000 elements


def _sum_sq(v: np.ndarray) -> float:
    """sum(v * v) of a 1-D float64 array (BLAS ddot, in pieces of _DOT_PIECE): a longer ddot starts OpenBLAS
    threads, which stall for milliseconds when the other cores are busy (fp4ref quantize --jobs N, a shared
    machine) and made the statistics the slowest step."""
    return sum(float(np.dot(v[j:j + _DOT_PIECE], v[j:j + _DOT_PIECE])) for j in range(0, v.size, _DOT_PIECE))


class _ChunkStats(NamedTuple):
    """Error statistics of one quantized chunk, against x_hat = the float32 value nvfp4_dequantize gives."""

    sum_sq: float  # sum of x^2, float64
    sum_err_sq: float  # sum of (x - x_hat)^2, float64 (x - x_hat is exact in float64)
    max_abs_err: float  # max |x - x_hat|
    zero_blocks: int  # blocks whose amax is 0
    overflows: int = 0  # x_hat past the range of x's own dtype (fp4ref quantize counts them for MX; NVFP4 has none)


@functools.lru_cache(maxsize=None)
def _e2m1_value_table(high: bool) -> np.ndarray:
    """_e2m1_table(negative_zero=False) widened to uint32 entries: the float32 bits of the code's E2M1 value, with
    the code itself in bits 3:0 (``high=False``: an even element's nibble) or 7:4 (``high=True``: an odd
    element's). Every E2M1 value has at most 2 significant bits, so its float32 bits 7:0 are zero (asserted):
    ``entry & 0xFFFFFF00`` is the value, and the low bytes of an even and an odd element OR to their packed byte."""
    codes = _e2m1_table(False)
    vals = decode(np.arange(16, dtype=np.uint8), E2M1).view(np.uint32)  # code 8 -> -0.0 (sign bit only)
    assert not np.any(vals & np.uint32(0xFF))
    table = vals[codes] | codes.astype(np.uint32) << np.uint32(4 if high else 0)
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=None)
def _e4m3_table() -> tuple:
    """(codes, values): formats.encode(., E4M3FN) (RNE, saturating) over the float32 classes of _e2m1_table, and
    the float32 value of every byte. RNE to E4M3FN keeps 3 mantissa bits: its round bit is float32 mantissa bit 19
    or higher, so the class argument of _e2m1_table holds (tests/test_blockscale.py compares with encode on every
    class). NaN classes hold 0 (inputs are finite)."""
    hi = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    table = np.empty((1 << 16, 2), dtype=np.uint8)
    table[:, 0] = encode(hi.view(np.float32), E4M3FN, rounding="rne", saturate=True, nan="zero")
    table[:, 1] = encode((hi | np.uint32(1)).view(np.float32), E4M3FN, rounding="rne", saturate=True, nan="zero")
    values = decode(np.arange(256, dtype=np.uint8), E4M3FN)
    table.flags.writeable = values.flags.writeable = False
    return table.reshape(-1), values


def _class_index(y: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The _e2m1_table / _e4m3_table index (bits >> 16) * 2 + (bits & 0xFFFF != 0) of float32 ``y`` (1-D) into
    ``idx`` (intp, same length: take() would convert any other index dtype first), returned. Four in-place integer
    passes: ((bits & 0x7FFF) + 0x7FFF) | bits) >> 15; the sum is below 2^16 and has bit 15 set exactly when bits
    14..0 are not all zero, so after the OR bit 15 says "bits 15..0 not all zero" and bits 31..16 are the input's."""
    yb = y.view(np.uint32)
    np.bitwise_and(yb, 0x7FFF, out=idx)
    idx += 0x7FFF
    idx |= yb
    idx >>= 15
    return idx


def _e4m3_f32(y: np.ndarray) -> np.ndarray:
    """E4M3FN bytes (RNE, saturating) of a finite float32 array: formats.encode's, through _e4m3_table."""
    flat = np.ascontiguousarray(y, dtype=np.float32).reshape(-1)
    idx = _class_index(flat, np.empty(flat.size, np.intp))
    return _e4m3_table()[0].take(idx).reshape(np.shape(y))


def _e2m1_entries(y: np.ndarray, idx: np.ndarray, out: np.ndarray, high: bool = False) -> np.ndarray:
    """The _e2m1_value_table(high) entries of float32 ``y`` (1-D) into ``out`` (uint32, same length), returned;
    ``idx`` (intp, same length) is scratch. Codes are those of _e2m1_f32(y, negative_zero=False)."""
    _class_index(y, idx)
    _e2m1_value_table(high).take(idx, out=out, mode="wrap")  # all indices are in range; "wrap" is not buffered
    return out


def _fast_block_scales(recipe: NVFP4Recipe, ab: np.ndarray, gs: dict) -> tuple:
    """(scale bytes, per-block element factor f, decoded scale s) of blocks with amax ``ab``: the arithmetic of
    _nvfp4_rows for te, sol (y = x * f) and modelopt (y = x / f), step for step. Every byte is < 0x80 (the
    pre-cast scale is >= +0), so s is also the scale nvfp4_dequantize decodes."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if recipe is NVFP4Recipe.MODELOPT:
            sf2 = gs["g"]
            p = ab / (_F32(6.0) * sf2)
            p[p == 0] = _F32(1.0)
            p = np.clip(p, _F32(2.0**-9), _E4M3_MAX)
            sbytes = _e4m3_f32(p)  # = encode(p, E4M3FN, rounding="rne", saturate=True)
            s = _e4m3_table()[1].take(sbytes)  # = decode(sbytes, E4M3FN)
            return sbytes, s * sf2, s
        if recipe is NVFP4Recipe.TE:
            pre = ab * gs["mult"]
        else:
            pre = (ab / _F32(6.0)) * gs["s_enc"]
        pre = np.clip(np.minimum(pre, _FLT_MAX), -_E4M3_MAX, _E4M3_MAX)
        sbytes = _e4m3_f32(pre)
        s = _e4m3_table()[1].take(sbytes)
        return sbytes, np.minimum(_F32(1.0) / (s * gs["s_dec"]), _FLT_MAX), s


def _zero_for_nan_quotients(y: np.ndarray, xb: np.ndarray) -> None:
    """fp4ref's policy where a recipe's element step divides 0 by 0 (a block factor that underflowed to 0) or
    multiplies 0 by inf (torchao's 1/pts overflowed): the source's NaN becomes a code derived from the NaN's bits
    (+6 in ModelOpt, torchao's own); fp4ref gives the element the zero code of its sign under the recipe's rule,
    by putting x (a zero) back in place of the NaN. In place."""
    nan = np.isnan(y)
    if nan.any():
        y[nan] = xb[nan]


def _nvfp4_rows_fast(recipe: NVFP4Recipe, x2: np.ndarray, gs: dict, stats: bool = False) -> tuple:
    """Packed codes [r, K/2], scale bytes [r, K/16] and, with ``stats``, the :class:`_ChunkStats` of finite
    ``x2`` [r, K] (float16, bfloat16 or float32; K a multiple of 16) for recipe te, sol or modelopt with 1x16
    blocks: the bytes of _nvfp4_rows + _pack (see the comment above _FAST_RECIPES).

    Memory: the outputs plus ~3.5 MiB of scratch. Raises ValueError on NaN/inf.
    """
    rows, k = x2.shape
    nblk = rows * (k // _NVFP4_BLOCK)
    xb = x2.reshape(nblk, _NVFP4_BLOCK)
    sub = min(_FAST_SUB, max(nblk, 1))
    n_max = _NVFP4_BLOCK * sub
    xt, work = np.empty(n_max, np.float32), np.empty(n_max, np.float32)
    idx = np.empty(n_max, np.intp)
    ents = np.empty(n_max, np.uint32)
    err = np.empty(n_max, np.float64) if stats else None
    packed = np.empty((nblk, _NVFP4_BLOCK // 2), np.uint8)
    sbytes = np.empty(nblk, np.uint8)
    divide = recipe is NVFP4Recipe.MODELOPT
    g = _F32(gs["stored"])
    num = den = maxerr = 0.0
    zero_blocks = 0
    for b0 in range(0, nblk, sub):  # each sub-chunk stays in the cache from the transpose to the statistics
        b1 = min(nblk, b0 + sub)
        m = b1 - b0
        n = _NVFP4_BLOCK * m
        # element 2j + p of block b0 + i at t[8p + j, i]: even elements in rows 0..7, odd ones in rows 8..15
        t = xt[:n].reshape(_NVFP4_BLOCK, m)
        np.copyto(t.reshape(2, 8, m), xb[b0:b1].reshape(m, 8, 2).transpose(2, 1, 0))  # exact widening to float32
        a = work[:n].reshape(_NVFP4_BLOCK, m)
        np.abs(t, out=a)  # |-0.0| = +0.0, as np.max(np.abs(.)) in _nvfp4_rows
        for half in (8, 4, 2):
            np.maximum(a[:half], a[half:2 * half], out=a[:half])
        ab = np.maximum(a[0], a[1])  # max is exact: the amax of any reduction order; NaN propagates
        if not np.isfinite(ab).all():
            raise ValueError("x holds NaN/inf values; the fast NVFP4 path needs finite input")
        sbytes[b0:b1], f, s = _fast_block_scales(recipe, ab, gs)
        y = a  # the amax scratch is free again
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # te/sol: x * FLT_MAX may be inf: 6
            (np.divide if divide else np.multiply)(t, f, out=y)
        if divide and not f.all():  # modelopt's 0 / 0 where s * sf2 underflowed: code 0 (_zero_for_nan_quotients)
            _zero_for_nan_quotients(y, t)
        h = n // 2  # per element: its code (in its nibble of the packed byte) and its value bits
        _e2m1_entries(y.reshape(-1)[:h], idx[:h], ents[:h])
        _e2m1_entries(y.reshape(-1)[h:n], idx[h:n], ents[h:n], high=True)
        ent = ents[:n].reshape(_NVFP4_BLOCK, m)
        low = ent.view(np.uint8).reshape(_NVFP4_BLOCK, m, 4)[:, :, _LOW_BYTE]
        packed[b0:b1] = (low[:8] | low[8:]).T  # element 2j in bits 3:0, element 2j + 1 in bits 7:4
        if stats:
            ent &= np.uint32(0xFFFFFF00)
            xhat = ent.view(np.float32)
            np.multiply(xhat, s, out=xhat)  # (e2m1 * e4m3) * g in float32, as nvfp4_dequantize
            np.multiply(xhat, g, out=xhat)
            e = err[:n]
            np.copyto(e, t.reshape(-1))
            num += _sum_sq(e)
            np.subtract(e, xhat.reshape(-1), out=e)  # float64: exact
            den += _sum_sq(e)
            maxerr = max(maxerr, float(e.max()), -float(e.min()))
            zero_blocks += int(np.count_nonzero(ab == 0))
    codes = packed.reshape(rows, k // 2)
    scales = sbytes.reshape(rows, k // _NVFP4_BLOCK)
    if not stats:
        return codes, scales, None
    return codes, scales, _ChunkStats(num, den, maxerr, zero_blocks)


def _four_over_six(recipe: NVFP4Recipe, xb: np.ndarray, ab: np.ndarray, gs: dict) -> tuple:
    """Both 4over6 candidates of blocks xb [r, nb, 16]: ((bytes, codes, err) map-to-4, (bytes, codes, err) map-to-6);
    err [r, nb] is the block's fp32 error, summed in element order (NVFP4Recipe.TE_4OVER6)."""
    e4m3_max, mode = _FOUR_OVER_SIX[recipe][0], _FOUR_OVER_SIX[recipe][1]
    denom = _F32(6.0) * _F32(e4m3_max)
    base = (ab / _F32(6.0)) * gs["s_enc"]
    out = []
    for pre in (base * _F32(1.5), base):
        sbytes = encode(np.clip(pre, -_E4M3_MAX, _E4M3_MAX), E4M3FN, rounding="rne", saturate=True)
        s = decode(sbytes, E4M3FN)
        enc = np.minimum(_F32(1.0) / (s * gs["s_dec"]), _FLT_MAX)
        codes = _e2m1_f32(xb * enc[..., None], negative_zero=False)
        vals = decode(codes, E2M1)  # 0x8 -> -0.0, as the source's cast_from_fp4x2
        err = np.zeros(ab.shape, dtype=np.float32)
        for i in range(_NVFP4_BLOCK):
            d = ((vals[..., i] * s) * gs["amax"]) / denom - xb[..., i]
            err += d * d if mode == "MSE" else np.abs(d)
        out.append((sbytes, codes, err))
    return tuple(out)


def _tile_errors(err_rows: np.ndarray, batches: int, m: int) -> np.ndarray:
    """Per-row block errors [batches * m, nb] -> per-tile sums [batches, ceil(m/16), nb], the 16 rows of a tile
    added in the CUDA warp's tree order (TE's ``_sum_4over6_2d_error``); a ragged tile's missing rows count 0."""
    nb = err_rows.shape[-1]
    mp = -(-m // 16) * 16
    e = np.zeros((batches, mp, nb), dtype=np.float32)
    e[:, :m] = err_rows.reshape(batches, m, nb)
    e = e.reshape(batches, mp // 16, 16, nb)
    for half in (8, 4, 2, 1):
        e = e[:, :, :half] + e[:, :, half:2 * half]
    return e[:, :, 0]


def _nvfp4_rows(recipe: NVFP4Recipe, xb: np.ndarray, ab: np.ndarray, gs: dict,
                pick4=None) -> tuple[np.ndarray, np.ndarray]:
    """Scale bytes [r, nb] and unpacked codes [r, nb, 16] for blocks xb [r, nb, 16] with block amax ab [r, nb].
    ``pick4`` [r, nb] (4over6 with 16x16 tiles) overrides the per-block choice."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if recipe in _FOUR_OVER_SIX:
            (s4, c4, e4), (s6, c6, e6) = _four_over_six(recipe, xb, ab, gs)
            p4 = e4 < e6 if pick4 is None else pick4
            return np.where(p4, s4, s6), np.where(p4[..., None], c4, c6)
        if recipe in (NVFP4Recipe.TE, NVFP4Recipe.SOL):
            if recipe is NVFP4Recipe.TE:
                pre = ab * gs["mult"]
            else:
                pre = (ab / _F32(6.0)) * gs["s_enc"]
            pre = np.clip(np.minimum(pre, _FLT_MAX), -_E4M3_MAX, _E4M3_MAX)
            sbytes = encode(pre, E4M3FN, rounding="rne", saturate=True)
            s = decode(sbytes, E4M3FN)
            enc = np.minimum(_F32(1.0) / (s * gs["s_dec"]), _FLT_MAX)
            # clamp(., -6, 6) then E2M1 == saturating E2M1 (x * enc is never NaN: x finite, enc in (0, FLT_MAX]);
            # -0.0 -> 0x0 (comparison cast), [-0.25, -0) keeps 0x8
            return sbytes, _e2m1_f32(xb * enc[..., None], negative_zero=False)
        if recipe in _TORCHAO_TWO_LEVEL or recipe in _TORCHAO_SINGLE:
            two_level = recipe in _TORCHAO_TWO_LEVEL
            sbs = (ab / _F32(6.0)) / gs["g"] if two_level else ab / _F32(6.0)
            sbytes = encode(np.clip(sbs, _F32(2.0**-6), _E4M3_MAX), E4M3FN, rounding="rne", saturate=True)
            s = decode(sbytes, E4M3FN)
            if recipe is NVFP4Recipe.TORCHAO:
                y = xb * (gs["rcp"] / s)[..., None]  # (1/pts)/s; inf where 1/pts overflowed
                _zero_for_nan_quotients(y, xb)
            elif recipe is NVFP4Recipe.TORCHAO_SINGLE_LEVEL:
                y = xb * (_F32(1.0) / s)[..., None]
            elif recipe is NVFP4Recipe.TORCHAO_0_16:
                y = xb / (gs["g"] * s)[..., None]  # 0 where pts * s underflowed
                _zero_for_nan_quotients(y, xb)
            else:
                y = xb / s[..., None]
            return sbytes, _e2m1_f32(y)  # clamp to +-6 == saturating E2M1; -0.0 -> 0x8
        if recipe is NVFP4Recipe.MODELOPT:
            sf2 = gs["g"]
            p = ab / (_F32(6.0) * sf2)
            p[p == 0] = _F32(1.0)
            p = np.clip(p, _F32(2.0**-9), _E4M3_MAX)
            sbytes = encode(p, E4M3FN, rounding="rne", saturate=True)
            y = xb / (decode(sbytes, E4M3FN) * sf2)[..., None]  # 0 where s * sf2 underflowed
            _zero_for_nan_quotients(y, xb)
            return sbytes, _e2m1_f32(y, negative_zero=False)  # sign = (x < 0): -0.0 -> 0x0
        # EXACT, in float64 (see NVFP4Recipe.EXACT for why each quotient rounds like the real one)
        d = np.float64(gs["g"])
        q = ab.astype(np.float64) / (6.0 * d)
        sbytes = encode(q, E4M3FN, rounding="rne", saturate=True)
        denom = decode(sbytes, E4M3FN, dtype=np.float64) * d
        zero = denom == 0
        y = xb.astype(np.float64) / np.where(zero, 1.0, denom)[..., None]
        codes = _encode_e2m1(y)
        codes[np.broadcast_to(zero[..., None], codes.shape)] = 0
        return sbytes, codes


def _error_stats(x: np.ndarray, xhat: np.ndarray, block: int) -> _ChunkStats:
    """:class:`_ChunkStats` of float32 ``x`` [r, K] against its dequantized float32 ``xhat`` (blocks of ``block``
    along K for the zero-block count)."""
    xd = x.astype(np.float64).reshape(-1)
    err = xd - xhat.astype(np.float64).reshape(-1)
    maxerr = float(np.max(np.abs(err))) if err.size else 0.0
    zero = int(np.count_nonzero(np.max(np.abs(x.reshape(x.shape[0], -1, block)), axis=-1) == 0)) if x.size else 0
    return _ChunkStats(_sum_sq(xd), _sum_sq(err), maxerr, zero)


def _nvfp4_quantize_stats(x2: np.ndarray, recipe, global_amax) -> tuple:
    """fp4ref quantize's step for one row chunk: (packed codes, scale bytes, global decode scale, _ChunkStats) of
    ``x2`` [r, K] (float16, bfloat16 or float32, finite) with 1x16 blocks and the tensor's (or fused group's)
    ``global_amax`` (unused by the single-level recipes): the bytes of :func:`nvfp4_quantize`, and statistics
    against :func:`nvfp4_dequantize`'s float32 values. Recipes te, sol and modelopt take the fast path, which needs
    no second dequantizing pass."""
    rec = _parse_recipe(recipe)
    amax = _F32(global_amax)
    if rec in _FAST_RECIPES and np.isfinite(amax) and amax > 0:  # else nvfp4_quantize checks (and may raise)
        gs = _global_scales(rec, amax)
        codes, scales, st = _nvfp4_rows_fast(rec, x2, gs, stats=True)
        return codes, scales, _F32(gs["stored"]), st
    # the single-level recipes have block scales only: no global amax is theirs to take
    q = nvfp4_quantize(x2, recipe=rec, global_amax=None if rec in _TORCHAO_SINGLE else global_amax)
    xf = x2.astype(np.float32, copy=False)
    return q.codes, q.scales, q.global_decode_scale, _error_stats(xf, nvfp4_dequantize(q), _NVFP4_BLOCK)


def _block_amax_2d(x3: np.ndarray) -> np.ndarray:
    """x3 [B, M, K] -> per-row block amax [B, M, K/16] from 16x16 tiles (ragged last tile = zero padding)."""
    b, m, k = x3.shape
    mp = -(-m // 16) * 16
    a = np.zeros((b, mp, k), dtype=np.float32)
    np.abs(x3, out=a[:, :m])
    tiles = a.reshape(b, mp // 16, 16, k // 16, 16).max(axis=(2, 4))  # [B, Mp/16, K/16]
    return np.repeat(tiles, 16, axis=1)[:, :m]


def nvfp4_quantize(x, *, recipe="te", block=16, global_amax=None, axis: int = -1,
                   nonfinite: str = "raise") -> NVFP4Tensor:
    """Quantize ``x`` to NVFP4 with a named recipe (bit-exact with its source; see :class:`NVFP4Recipe`).

    Args:
        x: float16, bfloat16 (ml_dtypes), or float32 array, at least 1-D (2-D for ``block=(16, 16)``); float64 is
            accepted only when every value is a float32. The length K along ``axis`` must be a multiple of 16.
        recipe: an :class:`NVFP4Recipe` or its name: ``"te"`` (default), ``"sol"``, ``"torchao"``,
            ``"torchao-single-level"``, ``"torchao-0.16"``, ``"torchao-0.16-single-level"``, ``"modelopt"``,
            ``"exact"``, ``"te-4over6"``, ``"te-4over6-mse"``, ``"te-4over6-256"``, ``"te-4over6-mse-256"``
            (:data:`NVFP4_RECIPES` gives each one's source and release).
        block: 16 (1x16 blocks along ``axis``) or (16, 16): TransformerEngine's 2-D weight tiles, 16 rows (the axis
            before ``axis``, after moving ``axis`` last) x 16 elements; a ragged last tile is treated as
            zero-padded (TE pads with zeros). The scales stay per row: each tile's byte repeated on its rows.
        global_amax: the tensor amax A used for the global scale (a calibrated value: a Python or numpy real
            scalar, float or int alike, or a 0-d numpy array or torch tensor of a real dtype such as
            ``w.abs().max()``, read as its element; a bool is refused, and so is an array with one element but
            ndim > 0 (unlike a global decode scale, which compressed-tensors stores with shape [1]);
            finite, rounded to float32 RNE first as the sources keep it in an fp32 tensor). Default: max|x|.
            It may be below max|x| (a calibrated amax that clips outliers): then a block whose amax a exceeds it
            gets the largest block scale (448; torchao/modelopt clamp, te/sol saturate) and its elements beyond
            6 * 448 * (global decode scale) = about A saturate to +-6 (4over6 with e4m3_max 256: 6 * 448 / 1536 * A).
            0 (-0.0 is the same magnitude) is accepted only for an all-zero ``x`` (otherwise every value would
            dequantize to ~0). Not accepted
            by the single-level recipes, which have no global scale.
        axis: the axis holding K (default last).
        nonfinite: ``"raise"`` (default): NaN or +-inf in ``x`` raise ValueError; ``"zero"``: they are quantized as
            0.0 (and left out of the amax).

    Returns:
        :class:`NVFP4Tensor`.

    Raises:
        TypeError: ``x`` is not a floating array; ``axis`` not an int; ``block`` neither an int nor a tuple of
            ints (16.0, "16"); ``recipe`` neither a str nor an :class:`NVFP4Recipe`; ``nonfinite`` not a str;
            ``global_amax`` neither None nor a real scalar (a str, a bool, a complex, an array or tensor with
            ndim > 0).
        ValueError: K not a multiple of 16, unknown ``recipe`` name, an int ``block`` other than 16 (or a tuple
            other than (1, 16), (16, 16)), unknown ``nonfinite``, ``global_amax`` negative, NaN, inf, beyond
            float32, 0 with non-zero ``x`` or given to a single-level recipe, 0-d ``x``, a float64 value that is
            not a float32, or a non-finite value with ``nonfinite="raise"``.

    All-zero tensors and all-zero blocks give zero codes and no NaN in every recipe (scale byte 0x00, or the
    recipe's floor: torchao 0x08 = 2^-6, modelopt 0x38 = 1.0). Source orders: see :class:`NVFP4Recipe`.
    """
    rec = _parse_recipe(recipe)
    blk = _parse_nvfp4_block(block)
    if not isinstance(nonfinite, str):
        raise TypeError(f"nonfinite={nonfinite!r}: expected one of ['raise', 'zero'], got {type(nonfinite).__name__}")
    if nonfinite not in ("raise", "zero"):
        raise ValueError(f"nonfinite={nonfinite!r} is not one of ['raise', 'zero']")
    xf = _as_f32_input(x, "x")
    ax = normalize_axis(axis, xf.ndim, "axis", array="x")
    if blk == (16, 16) and xf.ndim < 2:
        raise ValueError(f"block=(16, 16) needs x with at least 2 dimensions, got shape {xf.shape}")
    k = xf.shape[ax]
    if k % _NVFP4_BLOCK:
        raise ValueError(
            f"x has length {k} along axis={axis}; NVFP4 needs a multiple of 16 (pad explicitly with zeros)"
        )
    xf = _check_nonfinite(xf, nonfinite)
    xm = np.moveaxis(xf, ax, -1)
    if global_amax is None:
        amax = _max_abs(xm)
    else:
        global_amax = real_scalar(global_amax, "global_amax")  # a 0-d array or tensor: its element
        if rec in _TORCHAO_SINGLE:
            raise ValueError(f"global_amax={global_amax!r} does not apply to recipe={rec.value!r}, which has no "
                             "global scale; use recipe='torchao' for two-level scaling")
        amax = float32_of(global_amax)  # a value beyond float32 (10**400 too) is inf there, refused just below
        if not np.isfinite(amax) or amax < 0:
            raise ValueError(f"global_amax={global_amax!r} must be finite and >= 0 (as float32: {amax!r})")
        amax = abs(amax)  # a magnitude: -0.0 is 0 (its global decode scale would be -0.0, refused on decode)
        if amax == 0 and _max_abs(xm) != 0:
            raise ValueError(
                f"global_amax={global_amax!r} but x holds non-zero values (max|x| = {_max_abs(xm)!r}): a zero global "
                "amax would give a global decode scale that dequantizes every value to ~0; pass the calibrated "
                "amax (> 0) or None for max|x|"
            )
    gs = _global_scales(rec, amax)

    lead = xm.shape[:-1]
    nb = k // _NVFP4_BLOCK
    rows = int(np.prod(lead, dtype=np.int64))
    x2 = np.ascontiguousarray(xm).reshape(rows, nb, _NVFP4_BLOCK)
    if blk == (16, 16):
        amax_b = _block_amax_2d(x2.reshape(int(np.prod(lead[:-1], dtype=np.int64)), lead[-1], k)).reshape(rows, nb)
    else:
        amax_b = None
    codes = np.empty((rows, k // 2), dtype=np.uint8)
    scales = np.empty((rows, nb), dtype=np.uint8)
    step = max(1, _CHUNK_ELEMS // max(k, 1))
    pick4 = None
    if blk == (16, 16) and rec in _FOUR_OVER_SIX and rows > 0:  # first pass: per-row errors, then one choice per tile
        err4, err6 = np.empty((rows, nb), np.float32), np.empty((rows, nb), np.float32)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                (_, _, err4[r0:r1]), (_, _, err6[r0:r1]) = _four_over_six(rec, x2[r0:r1], amax_b[r0:r1], gs)
        batches, m = rows // lead[-1], lead[-1]
        tile4, tile6 = _tile_errors(err4, batches, m), _tile_errors(err6, batches, m)
        pick4 = np.repeat(tile4 < tile6, 16, axis=1)[:, :m].reshape(rows, nb)
    fast = blk == (1, 16) and rec in _FAST_RECIPES
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        xb = x2[r0:r1]
        if fast:  # the same bytes as _nvfp4_rows + _pack (tests/test_blockscale.py), several times faster
            codes[r0:r1], scales[r0:r1], _ = _nvfp4_rows_fast(rec, xb.reshape(r1 - r0, k), gs)
            continue
        ab = np.max(np.abs(xb), axis=-1) if amax_b is None else amax_b[r0:r1]
        sb, cb = _nvfp4_rows(rec, xb, ab, gs, None if pick4 is None else pick4[r0:r1])
        scales[r0:r1] = sb
        codes[r0:r1] = _pack(cb.reshape(r1 - r0, k))
    codes = np.moveaxis(codes.reshape(lead + (k // 2,)), -1, ax)
    scales = np.moveaxis(scales.reshape(lead + (nb,)), -1, ax)
    return NVFP4Tensor(
        codes=np.ascontiguousarray(codes),
        scales=np.ascontiguousarray(scales),
        global_decode_scale=_F32(gs["stored"]),
        shape=tuple(xf.shape),
        recipe=rec.value,
        block=blk,
        axis=ax,
    )


def _nvfp4_parts(t, name: str) -> tuple[np.ndarray, np.ndarray, float]:
    """(codes uint8, scale bytes uint8, global decode scale) of an NVFP4Tensor, checked: codes and scales must be
    integer byte arrays (int8 is read as unsigned bytes, bits unchanged, as :func:`fp4ref.decode` reads it; an
    ml_dtypes float8 or float array is refused, never converted by value) of the shapes
    ``shape`` implies, and the global decode scale (a real scalar, or an array or tensor of one element) rounded to
    float32 (RNE) once, finite and positive there (the recipes give amax / (448 * 6), or 1), as a Python float.

    Raises:
        TypeError: codes / scales not integer byte arrays; a global decode scale that is not a real number (a bool,
        a complex, a str, an array of more than one element); ``shape``, ``axis`` or ``block`` of the wrong type.
        ValueError: inconsistent shapes; an axis out of range; a block other than (1, 16) / (16, 16); a length along
        the axis that is not a multiple of 16; a global decode scale that is inf, NaN or <= 0 as float32 (1e39,
        3.5e38 and 1e-46 too). Each names the field (``name.axis``, ...).
    """
    shape, ax = _shape_and_axis(t, name)
    blk = _parse_nvfp4_block(t.block, f"{name}.block")
    if blk == (16, 16) and len(shape) < 2:
        raise ValueError(f"{name}.block=(16, 16) needs a shape with at least 2 dimensions, got {name}.shape={shape}")
    k = shape[ax]
    if k % _NVFP4_BLOCK:
        raise ValueError(f"{name}.shape={shape} has length {k} along {name}.axis={t.axis}; NVFP4 needs a multiple "
                         f"of {_NVFP4_BLOCK}")
    codes = as_code_array(t.codes, f"{name}.codes", nbits=8, allow_int8=True)  # int8: bytes, as decode reads them
    scales = as_code_array(t.scales, f"{name}.scales", nbits=8, allow_int8=True)
    want_c = shape[:ax] + (k // 2,) + shape[ax + 1:]
    want_s = shape[:ax] + (k // _NVFP4_BLOCK,) + shape[ax + 1:]
    if codes.shape != want_c or scales.shape != want_s:
        raise ValueError(
            f"{name} is inconsistent: shape {shape} along axis {ax} needs codes {want_c} and scales {want_s}, "
            f"got {codes.shape} and {scales.shape}"
        )
    return codes, scales, global_scale_float32(t.global_decode_scale, f"{name}.global_decode_scale")


def _dequantize_dtype(dtype) -> np.dtype:
    """The output dtype of a dequantize: float32 or float64, as :func:`fp4ref.decode` takes it. None is refused
    (np.dtype(None) would silently be float64), and so is anything else; TypeError naming ``dtype``."""
    try:
        dt = None if dtype is None else np.dtype(dtype)
    except TypeError:  # a str numpy does not know, an arbitrary object
        dt = None
    # "is None" first: np.dtype(np.float64) == None is True, so membership alone would let None through
    if dt is None or dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r}")
    return dt


def nvfp4_dequantize(t: NVFP4Tensor, dtype=np.float32) -> np.ndarray:
    """Decode an :class:`NVFP4Tensor`: value = e2m1(code) * ue4m3(scale) * global_decode_scale.

    e2m1 * ue4m3 has at most 6 significant bits, so the first product is exact; the multiplication by the global
    scale is then the only rounding (float32: one RNE rounding of the exact product; float64: exact).
    The scale byte's sign bit is ignored (UE4M3); scale bytes 0x7F/0xFF decode to NaN.

    Args:
        t: the tensor.
        dtype: ``np.float32`` (default) or ``np.float64`` (None is refused, as :func:`fp4ref.decode` refuses it).

    Returns:
        array of ``dtype`` with shape ``t.shape``.

    Raises:
        TypeError: ``t`` is not an NVFP4Tensor or ``dtype`` is not float32/float64 (None too);
            ``t.global_decode_scale`` not a real number (a bool too) or an array / tensor of one; codes / scales
            not integer byte arrays (uint8, or int8, read as unsigned bytes with the bits unchanged, as
            :func:`fp4ref.decode` reads it).
        ValueError: inconsistent shapes in ``t``; ``t.axis`` out of range, ``t.block`` not (1, 16) / (16, 16);
            ``t.global_decode_scale`` inf, NaN or <= 0 as float32. Errors about a field name it (``t.axis``, ...).
    """
    if not isinstance(t, NVFP4Tensor):
        raise TypeError(f"t must be an NVFP4Tensor, got {type(t).__name__}")
    dt = _dequantize_dtype(dtype)
    codes, scales, g = _nvfp4_parts(t, "t")
    shape, ax = _shape_and_axis(t, "t")
    k = shape[ax]
    v = decode(unpack_fp4(np.moveaxis(codes, ax, -1)), E2M1, dtype=dt)
    s = decode(np.moveaxis(scales, ax, -1) & 0x7F, E4M3FN, dtype=dt)
    lead = v.shape[:-1]
    out = (v.reshape(lead + (k // _NVFP4_BLOCK, _NVFP4_BLOCK)) * s[..., None]) * dt.type(g)
    return np.ascontiguousarray(np.moveaxis(out.reshape(lead + (k,)), -1, ax))


# ------------------------------------------------------------------------------------------------------------ MX

#: MX element names -> formats (OCP MX v1.0 §5.3). The names are the :mod:`fp4ref.formats` registry names
#: (``MX_ELEMENTS[n].name == n``), so ``fp4ref.decode(t.codes, t.elem)`` decodes an :class:`MXTensor`'s elements:
#: the 8-bit element the OCP MX spec calls "E4M3" is ``"e4m3fn"`` (finite-only, one NaN pattern; docs/formats.md).
MX_ELEMENTS: dict = {f.name: f for f in (E2M1, E2M3, E3M2, E4M3FN, E5M2)}

#: Other spellings of MX element names accepted on input (any case): the OCP MX spec's "E4M3".
_MX_ELEMENT_ALIASES: dict = {"e4m3": "e4m3fn"}
_MX_NAMES_TEXT = f"{list(MX_ELEMENTS)} (any case; 'e4m3', the OCP MX name, is 'e4m3fn')"


def _mx_element(elem, name: str = "elem") -> str:
    """``elem`` (an MX element name of :data:`MX_ELEMENTS` or an alias, any case) -> its canonical name.
    TypeError: not a str; ValueError: unknown name; both name ``name``."""
    if not isinstance(elem, str):
        raise TypeError(f"{name}={elem!r}: expected one of {_MX_NAMES_TEXT}, got {type(elem).__name__}")
    key = elem.lower()
    key = _MX_ELEMENT_ALIASES.get(key, key)
    if key not in MX_ELEMENTS:
        raise ValueError(f"{name}={elem!r} is not one of {_MX_NAMES_TEXT}")
    return key


class MXMode(str, enum.Enum):
    """How the UE8M0 block scale X = 2^e is chosen from the block amax a (torchao ``ScaleCalculationMode``).
    emax is the exponent of the element format's largest normal (E2M1 2, E2M3 2, E3M2 4, E4M3 8, E5M2 15);
    floor(log2 a) is read from the float32 bits (exact, subnormals included), never from float log2, which is off by
    one near powers of two. e is clamped to [-127, 127] (byte e + 127).

    Scale byte 0 (e = -127): FLOOR gives it for a < 2^(emax - 126) (2^-124 E2M1/E2M3, 2^-122 E3M2, 2^-118 E4M3,
    2^-111 E5M2), CEIL for a <= 2^(emax - 127), EVEN for a' < 2^(emax - 126), RCEIL for fp32(a / max_elem) <= 2^-127
    (RCEIL_TORCHAO: up to a few fp32 ulps above, where its log2 rounds down to -127).
    fp4ref then divides the elements by 2^-127, the value the byte encodes. torchao 0.18 (``to_mx``) divides by
    max(2^e, 2^-126) in FLOOR / CEIL / EVEN (its fp32-normal floor) and multiplies by 1.0 in RCEIL, so its element
    codes differ from fp4ref's in exactly those blocks (``"rceil-torchao"`` reproduces the RCEIL one).
    """

    FLOOR = "floor"
    """OCP MX v1.0 §6.3 (the default): e = floor(log2 a) - emax. Elements above the format's max saturate."""
    CEIL = "ceil"
    """e = ceil(log2 a) - emax (= floor(log2 a) + 1 - emax unless a is a power of two)."""
    EVEN = "even"
    """torchao EVEN: a's float32 bits plus 2^(22 - mbits) (half an element ulp), mantissa cleared, i.e.
    e = floor(log2 a') - emax with a' = a rounded to mbits mantissa bits, ties away from zero (on the bits);
    an a' that stays subnormal gives the minimum e."""
    RCEIL = "rceil"
    """cuBLAS RCEIL, exact: e = ceil(log2(d)), d = fp32(a / max_elem), by the UE8M0 round-up of d
    (``cvt.rp.satfinite.ue8m0x2.f32``; cuBLAS "Computing scaling and conversion factors for FP8 with UE8M0
    scales"; torchao's compiled sm_100 path). Never saturates elements."""
    RCEIL_TORCHAO = "rceil-torchao"
    """torchao 0.18.0's eager RCEIL (``_to_mx_rceil`` fallback in torchao/prototype/mx_formats/mx_tensor.py, the
    path it takes on CPU and in eager mode): e = clamp(ceil(fp32 log2(d)), -127, 127), d = fp32(a / max_elem). The
    fp32 log2 rounds d just above a power of two 2^k down to k, so e is one below "rceil" there: for d = 2^k * m,
    m > 1, e = k when log2(m) is below half the fp32 spacing at k (m < 1 + about 22 * 2^-23 for |k| >= 64; never for
    k = 0). fp4ref evaluates the correctly rounded fp32 log2 exactly (torch's CPU log2 agrees on every d tested).
    Elements: x / 2^e as "rceil", except that a block with scale byte 0 is multiplied by 1.0 (the source's
    ``exponent == 0`` branch), not divided by 2^-127. Example: a = fp32 bits 0x0DC00001, E2M1: this mode byte 25,
    "rceil" byte 26."""


@functools.lru_cache(maxsize=None)
def _log2_round_down_limit() -> np.ndarray:
    """limit[k + 160] = the largest j such that RN_fp32(log2((1 + j 2^-23) 2^k)) == k (k != 0): log2(m) must be
    below half the fp32 spacing next to k toward k + 1, i.e. j < (2^h - 1) 2^23. Evaluated in float64 with
    expm1; every threshold is at least 1e-6 away from an integer (asserted), so the float64 error cannot move it."""
    lim = np.zeros(160 + 128, dtype=np.int64)
    for k in range(-160, 128):
        if k == 0:
            continue
        spacing = 2.0 ** (math.floor(math.log2(k)) - 23) if k > 0 else 2.0 ** ((-k - 1).bit_length() - 1 - 23)
        thr = math.expm1(spacing / 2 * math.log(2.0)) * 2.0**23
        assert abs(thr - round(thr)) > 1e-6
        lim[k + 160] = math.ceil(thr) - 1
    lim.flags.writeable = False
    return lim


def _ceil_rn_log2_f32(d: np.ndarray) -> np.ndarray:
    """ceil(RN_fp32(log2 d)) for positive finite float32 d, exactly (no float log2): see MXMode.RCEIL_TORCHAO."""
    m, e = np.frexp(d.astype(np.float64))
    k = e.astype(np.int64) - 1
    j = np.rint((m * 2.0 - 1.0) * 2.0**23).astype(np.int64)  # exact: d has at most 24 significant bits
    down = (j == 0) | ((k != 0) & (j <= _log2_round_down_limit()[np.clip(k, -160, 127) + 160]))
    return np.where(down, k, k + 1)


@dataclass(frozen=True)
class MXTensor:
    """An MX-quantized array.

    Attributes:
        codes: uint8 element codes, one per element (unpacked), the input shape. For MXFP4 storage use
            :func:`fp4ref.packing.pack_fp4`. (A hand-built tensor's int8 codes / scales are read as unsigned
            bytes, bits unchanged, as :func:`fp4ref.decode` reads them.)
        scales: uint8 UE8M0 bytes (2^(b-127); 255 = NaN), the input shape with K replaced by K/block.
        elem: element format name, a key of :data:`MX_ELEMENTS` and of :data:`fp4ref.formats.FORMATS`
            (``"e2m1"``, ``"e2m3"``, ``"e3m2"``, ``"e4m3fn"``, ``"e5m2"``), so ``fp4ref.decode(t.codes, t.elem)``
            gives the unscaled elements. A hand-built tensor may spell it in any case, or ``"e4m3"`` (OCP MX).
        mode: the :class:`MXMode` value used (a hand-built tensor may give an :class:`MXMode` or its name in any
            case, as :func:`mx_quantize` takes it; another value is refused on decode, naming ``t.mode``).
        block: block length along ``axis`` (a positive int dividing ``shape[axis]``).
        shape: the input shape.
        axis: the quantized axis (non-negative in a tensor :func:`mx_quantize` returns; a hand-built tensor may
            give a negative one, counted from the end as in numpy).

    :func:`mx_dequantize` checks a hand-built tensor's fields and names the bad one (``t.elem``, ``t.mode``,
    ``t.axis``, ...).
    """

    codes: np.ndarray
    scales: np.ndarray
    elem: str
    mode: str
    block: int
    shape: tuple
    axis: int


def _parse_mode(mode, flag: str = "") -> MXMode:
    """``mode`` -> :class:`MXMode` (:func:`_parse_enum`)."""
    return _parse_enum(mode, MXMode, "mode", flag)


def _floor_log2_f32(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """floor(log2 a) and "a is a power of two" for positive finite float32 a, from the bits (subnormals exact)."""
    mant, exp = np.frexp(a.astype(np.float32))  # a = mant * 2^exp, mant in [0.5, 1): exact, no log
    return exp.astype(np.int64) - 1, mant == 0.5


def _mx_scale_bytes(amax: np.ndarray, fmt: FloatFormat, mode: MXMode) -> np.ndarray:
    emax = fmt.emax
    pos = amax > 0
    safe = np.where(pos, amax, _F32(1.0)).astype(np.float32)
    if mode is MXMode.RCEIL:
        with np.errstate(over="ignore"):
            q = amax / _F32(fmt.max)  # fp32 division, one rounding
        return encode(q, UE8M0, rounding="ru", saturate=True)
    if mode is MXMode.RCEIL_TORCHAO:
        with np.errstate(over="ignore"):
            q = (safe / _F32(fmt.max)).astype(np.float32)
        qpos = pos & (q > 0)  # log2(0) = -inf -> clamped to -127
        e = np.where(qpos, _ceil_rn_log2_f32(np.where(qpos, q, _F32(1.0))), -127)
        return (np.clip(e, -127, 127) + 127).astype(np.uint8)
    if mode is MXMode.EVEN:
        bits = safe.view(np.uint32) + np.uint32(1 << (23 - fmt.mbits - 1))
        bits &= np.uint32(0xFF800000)
        expf = (bits >> np.uint32(23)).astype(np.int64)
        e_amax = np.where(expf > 0, expf - 127, -(1 << 20))  # a' = 0 (stays subnormal): minimum
    else:
        e_amax, pow2 = _floor_log2_f32(safe)
        if mode is MXMode.CEIL:
            e_amax = e_amax + (~pow2)
    e = np.where(pos, e_amax - emax, -127)  # zero block: minimum scale (torchao: log2(0 + 2^-126) - emax)
    return (np.clip(e, -127, 127) + 127).astype(np.uint8)


def mx_quantize(x, elem="e2m1", *, mode="floor", block: int = 32, axis: int = -1, nonfinite: str = "raise") -> MXTensor:
    """Quantize ``x`` to an MX format: one UE8M0 scale per ``block`` elements along ``axis``.

    Element codes are RNE of x / 2^e (exact power-of-two division, done in float64), saturating at the element
    format's max (OCP MX v1.0 §6.3 "clamped"); -0.0 gives the negative-zero code.

    Args:
        x: float16, bfloat16 (ml_dtypes) or float32 array (float64 only when every value is a float32), >= 1-D;
            its length along ``axis`` must be a multiple of ``block``.
        elem: ``"e2m1"`` (MXFP4), ``"e2m3"``/``"e3m2"`` (MXFP6), ``"e4m3fn"``/``"e5m2"`` (MXFP8); any case, and
            ``"e4m3"`` (the OCP MX spec's name) for ``"e4m3fn"``. The result's ``elem`` is the canonical name.
        mode: :class:`MXMode` or its name: ``"floor"`` (OCP, default), ``"ceil"``, ``"even"``, ``"rceil"``
            (cuBLAS, exact), ``"rceil-torchao"`` (torchao 0.18's eager float log2).
        block: block length (32 in the OCP spec; any positive int accepted).
        axis: the blocked axis (default last).
        nonfinite: ``"raise"`` (default) or ``"nan_scale"``: a block holding NaN or +-inf gets scale byte 0xFF (NaN,
            OCP MX §6.3: the whole block decodes to NaN) and element codes 0.

    Returns:
        :class:`MXTensor`.

    Raises:
        TypeError: bad dtype; ``elem``, ``mode`` or ``nonfinite`` not a str (``mode`` may be an :class:`MXMode`);
            ``block`` or ``axis`` not an int (32.0, "32", True; a numpy integer is one).
        ValueError: unknown ``elem``, ``mode`` or ``nonfinite``, ``block`` <= 0, length not a multiple of
            ``block``, or a non-finite value with ``nonfinite="raise"``.

    Zero blocks get scale byte 0 (2^-127) and zero codes. Source: OCP Microscaling Formats (MX) v1.0 §6.3;
    torchao 0.18 mx_formats ``to_mx`` / ``ScaleCalculationMode``. Deviation from torchao, only in blocks whose
    scale byte is 0 (thresholds per element format and mode: :class:`MXMode`): torchao divides by
    max(2^e, 2^-126) (an fp32-normal floor), or multiplies by 1.0 in RCEIL; fp4ref divides by the 2^-127 the byte
    encodes (``"rceil-torchao"`` multiplies by 1.0 as torchao does).
    """
    fmt = MX_ELEMENTS[_mx_element(elem)]
    md = _parse_mode(mode)
    if not is_int(block):
        raise TypeError(f"block={block!r}: expected a positive int, got {type(block).__name__}")
    if block <= 0:
        raise ValueError(f"block={block!r} must be a positive int")
    if not isinstance(nonfinite, str):
        raise TypeError(f"nonfinite={nonfinite!r}: expected one of ['raise', 'nan_scale'], got "
                        f"{type(nonfinite).__name__}")
    if nonfinite not in ("raise", "nan_scale"):
        raise ValueError(f"nonfinite={nonfinite!r} is not one of ['raise', 'nan_scale']")
    xf = _as_f32_input(x, "x")
    ax = normalize_axis(axis, xf.ndim, "axis", array="x")
    k = xf.shape[ax]
    if k % block:
        raise ValueError(f"x has length {k} along axis={axis}; it must be a multiple of block={block}")
    xm = np.moveaxis(xf, ax, -1)
    lead = xm.shape[:-1]
    xb = np.ascontiguousarray(xm).reshape(lead + (k // block, block))
    bad = ~np.isfinite(xb)
    badblock = bad.any(axis=-1)
    if badblock.any():
        if nonfinite == "raise":
            first = np.unravel_index(int(np.flatnonzero(bad)[0]), xm.shape)
            raise ValueError(
                f"x holds {int(bad.sum())} NaN/inf value(s) (first at index {tuple(int(i) for i in first)}, "
                f"moved axis last); pass nonfinite='nan_scale' to give their blocks a NaN scale"
            )
        xb = np.where(badblock[..., None], _F32(0.0), xb)
    amax = np.max(np.abs(xb), axis=-1) if xb.size else np.zeros(lead + (k // block,), np.float32)
    sbytes = _mx_scale_bytes(amax, fmt, md)
    e = sbytes.astype(np.int64) - 127
    if md is MXMode.RCEIL_TORCHAO:
        e = np.where(sbytes == 0, 0, e)  # torchao: a scale byte 0 multiplies by 1.0
    q = np.ldexp(xb.astype(np.float64), -e[..., None])  # exact
    codes = encode(q, fmt, rounding="rne", saturate=True)
    if badblock.any():
        sbytes = np.where(badblock, np.uint8(255), sbytes)
        codes[np.broadcast_to(badblock[..., None], codes.shape)] = 0
    codes = np.moveaxis(codes.reshape(lead + (k,)), -1, ax)
    sbytes = np.moveaxis(sbytes.reshape(lead + (k // block,)), -1, ax)
    return MXTensor(
        codes=np.ascontiguousarray(codes.astype(np.uint8)),
        scales=np.ascontiguousarray(sbytes.astype(np.uint8)),
        elem=fmt.name,
        mode=md.value,
        block=int(block),
        shape=tuple(xf.shape),
        axis=ax,
    )


def mx_dequantize(t: MXTensor, dtype=np.float32) -> np.ndarray:
    """Decode an :class:`MXTensor`: value = elem(code) * 2^(scale - 127); scale byte 255 gives NaN.

    The product is exact in float64; in float32 it is exact unless it overflows (E5M2 57344 * 2^127, or the
    2^128 that a mode other than floor stores for a block amax near the float32 maximum -> inf) or underflows below
    2^-149.

    Args:
        t: the tensor. dtype: ``np.float32`` (default) or ``np.float64`` (None is refused, as
            :func:`fp4ref.decode` refuses it).

    Returns:
        array of ``dtype`` with shape ``t.shape``.

    Raises:
        TypeError: ``t`` not an MXTensor, or ``dtype`` not float32/float64 (None too); ``t.elem`` / ``t.mode``
            not a str (nor an MXMode for ``t.mode``: None too), ``t.block`` / ``t.axis`` not an int, ``t.shape``
            not a tuple of ints; codes / scales not integer arrays (uint8, or int8 for an 8-bit element and for
            the scales, read as unsigned bytes with the bits unchanged, as :func:`fp4ref.decode` reads it).
        ValueError: unknown ``t.elem`` or ``t.mode`` (the names :func:`mx_quantize` takes are accepted, any case;
            the message lists them), ``t.block`` <= 0 or not dividing the length along ``t.axis``, ``t.axis`` out
            of range, codes / scales of other shapes than ``t.shape`` implies, or a code outside the element's
            range (0..15 for E2M1, 0..63 for E2M3 / E3M2). Each names the field (``t.codes``, ...).
    """
    if not isinstance(t, MXTensor):
        raise TypeError(f"t must be an MXTensor, got {type(t).__name__}")
    dt = _dequantize_dtype(dtype)
    fmt = MX_ELEMENTS[_mx_element(t.elem, "t.elem")]
    _parse_enum(t.mode, MXMode, "t.mode")  # not used to decode, but a tensor claiming an unknown mode is bad
    shape, ax = _shape_and_axis(t, "t")
    block = t.block
    if not is_int(block):
        raise TypeError(f"t.block={block!r}: expected a positive int, got {type(block).__name__}")
    if block <= 0:
        raise ValueError(f"t.block={block!r} must be a positive int")
    block, k = int(block), shape[ax]
    if k % block:
        raise ValueError(f"t.shape={shape} has length {k} along t.axis={t.axis}; it must be a multiple of "
                         f"t.block={block}")
    want_s = shape[:ax] + (k // block,) + shape[ax + 1:]
    # the element's own code range (4 / 6 / 8 bits), checked here so that the error names t.codes; int8 codes of
    # an 8-bit element are bytes, as decode reads them
    codes = as_code_array(t.codes, "t.codes", nbits=fmt.nbits, allow_int8=fmt.nbits == 8)
    scales = as_code_array(t.scales, "t.scales", nbits=8, allow_int8=True)
    if codes.shape != shape or scales.shape != want_s:
        raise ValueError(f"t is inconsistent: shape {shape} along axis {ax} with block {block} needs codes {shape} "
                         f"and scales {want_s}, got {codes.shape} and {scales.shape}")
    v = decode(np.moveaxis(codes, ax, -1), fmt, dtype=np.float64)
    s = decode(np.moveaxis(scales, ax, -1), UE8M0, dtype=np.float64)
    lead = v.shape[:-1]
    out = (v.reshape(lead + (k // block, block)) * s[..., None]).reshape(lead + (k,))
    with np.errstate(over="ignore"):
        out = out.astype(dt)
    return np.ascontiguousarray(np.moveaxis(out, -1, ax))
