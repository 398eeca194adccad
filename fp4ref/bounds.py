"""Accumulation models, the K-aware per-element error bound, and ``check(out, ref, model) -> Report``.

The bound (docs/bounds.md, "The bound"), for an output element with exact value C,
|A||B| = P (``Reference.absprod``), K products, and an accumulation model with relative error eps_acc(K)::

    e_acc  = eps_acc(K) * P                                         accumulation
    e_epi  = gamma_m(2^-24) * (|C| + e_acc) + m * 2^-149            m fp32 epilogue multiplies (global scales)
             [+ (|C| + e_acc) * 2^-150 / G                          G = Reference.epilogue_scale below 2^-126]
    bound  = u_out * |C| + (1 + u_out) * (e_acc + e_epi) + eta_out  one rounding to the output format

with u_out = 2^-p (RNE; 2^(1-p) for ``faithful``: either neighbour) and eta_out half the smallest subnormal
(2^(1-p) times it for faithful). gamma_n(u) = n u / (1 - n u) (Higham 2002, §3.1).

Models are data (frozen dataclasses) with a name registry, so a kernel file declares
``NUMERIC_MODEL = "hopper_fp16_wgmma"`` and the checker looks it up with :func:`get_model`:

===============================  ==============================================================================
name                             eps_acc(K)
===============================  ==============================================================================
``exact``                        0 (an exact accumulation; the output is then the correctly rounded value)
``fp32_rn``                      gamma_K(2^-24): recursive fp32 summation, round to nearest, any order
``ampere_fp16``                  block FMA k=8,  F=24, fp32 accumulator, RZ  (also bf16; Ampere / Ada mma.sync)
``hopper_fp16_wgmma``            block FMA k=16, F=25, fp32 accumulator, RZ  (also bf16; Hopper wgmma)
``hopper_fp8_wgmma``             block FMA k=32, F=13, e8m13 accumulator (14 bits), RZ, never promoted
``hopper_fp8_wgmma_promote(N)``  the above for N elements, then added into fp32 (RN) every N elements
``blackwell_fp8``                block FMA k=32, F=25, fp32 accumulator, RZ (ASSUMED; see below)
``tc_fp32_universal``            K * 2^-22: any fp32-accumulating tensor core (docs/bounds.md)
``splitk(<model>, C)``           chunks of C along K accumulated by <model>, then summed in fp32 (RN, fixed order)
===============================  ==============================================================================

Block-FMA model (MMA-Sim, arXiv 2511.10909; Khattak & Mikaitis, arXiv 2512.07004; Fasi et al., PeerJ CS 2021):
per instruction, k exact products and the accumulator are aligned to the largest exponent E, each truncated to a
multiple of 2^(E-F), summed exactly, and the sum is rounded toward zero to the accumulator (precision p_acc,
u_R = 2^(1-p_acc)). The largest term loses nothing (every term has at most F + 1 significant bits: products of
fp16/bf16/fp8 have <= 22, the accumulator p_acc <= F + 1), so a step with j products errs by less than
j 2^(E-F) <= j 2^-F * (that step's max |term|) in the alignment, and by at most u_R |sum| in the RZ. Summing over
the n = ceil(K/k) steps (max |term| <= |A||B| of the products so far, plus the errors carried in the acc)::

    t = K 2^-F + n u_R,     eps_acc(K) = t / (1 - t)

The Blackwell fp8 preset is an assumption (fp32-wide accumulation like the 16-bit wgmma path, MMA-Sim reports
Blackwell fixed Hopper's narrow fp8 accumulator); no kernel in this project runs on Blackwell, and
``tc_fp32_universal`` covers it either way.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from ._interop import to_numpy
from ._validate import exact_float_dtype, is_int, is_real
from .gemm import OutputFormat, Reference, round_exact

__all__ = [
    "AccumulationModel",
    "MODELS",
    "get_model",
    "register_model",
    "splitk",
    "hopper_fp8_wgmma_promote",
    "gamma",
    "bound",
    "no_bound_message",
    "check",
    "Report",
    "OUTPUT_ROUNDINGS",
    "parse_output_rounding",
    "DEFAULT_MODEL",
    "simulate",
    "NumericContract",
]

U32 = 2.0**-24  # fp32 unit roundoff (RN)
_F32_MIN_NORMAL = 2.0**-126
_F32_OVERFLOW = 2.0**128 - 2.0**103  # the smallest value that fp32 RNE rounds to inf (max + half an ulp)
OUTPUT_ROUNDINGS = ("rne", "faithful")


def parse_output_rounding(value, name: str = "output_rounding") -> str:
    """``value`` as one of OUTPUT_ROUNDINGS, read in any case ("RNE" is "rne"), as model names are.

    Raises:
        TypeError: not a str (naming ``name``). ValueError: not one of OUTPUT_ROUNDINGS."""
    if not isinstance(value, str):
        raise TypeError(f"{name}={value!r}: expected one of {OUTPUT_ROUNDINGS}, got {type(value).__name__}")
    if value.lower() not in OUTPUT_ROUNDINGS:
        raise ValueError(f"{name}={value!r}: expected one of {OUTPUT_ROUNDINGS}")
    return value.lower()
# Most fp32 multiplies after the accumulation a bound may assume (each adds ~u to the relative term; a real GEMM
# epilogue has a few: global scales, alpha). A larger override would make the bound meaningless, so it is refused.
MAX_EPILOGUE_MULTIPLIES = 16
#: The model used when a kernel declares none: any fp32-accumulating tensor core (K * 2^-22).
DEFAULT_MODEL = "tc_fp32_universal"


def gamma(n, u) -> float:
    """gamma_n(u) = n u / (1 - n u) (Higham 2002, Lemma 3.1); +inf once n u >= 1.

    ``n``: the number of rounding errors, an int >= 0 (a numpy integer is one; a bool is not); ``u``: the unit
    roundoff, a finite real >= 0. TypeError / ValueError naming the argument otherwise (a negative n or u would give
    a negative, meaningless bound)."""
    if not is_int(n):
        raise TypeError(f"n={n!r}: expected an int >= 0 (a count of roundings), got {type(n).__name__}")
    if not is_real(u):
        raise TypeError(f"u={u!r}: expected a real number (the unit roundoff), got {type(u).__name__}")
    if n < 0 or not (math.isfinite(u) and u >= 0):
        raise ValueError(f"n={n!r}, u={u!r}: expected n >= 0 and a finite unit roundoff u >= 0")
    if u == 0:
        return 0.0
    try:
        nu = int(n) * float(u)
    except OverflowError:  # n beyond float64 (and u > 0): n u >= 1
        return math.inf
    return math.inf if nu >= 1 else nu / (1 - nu)


def _check_K(K) -> int:
    """``K`` as an int: a reduction length is a positive int (a numpy integer is one; a bool is not)."""
    if not is_int(K):
        raise TypeError(f"K={K!r}: the reduction length must be an int, got {type(K).__name__}")
    if K < 1:
        raise ValueError(f"K={K!r}: the reduction length must be >= 1")
    if K > 2**62:  # the bounds are floats: a K beyond 2^62 is no GEMM, and overflows them
        raise ValueError(f"K={K!r}: the reduction length must be at most 2**62")
    return int(K)


def _check_epilogue_multiplies(e, what: str = "epilogue_multiplies") -> int:
    """``e`` as an int in [0, MAX_EPILOGUE_MULTIPLIES] (a numpy integer is one; a bool is not).

    Raises:
        TypeError: not an int (a float such as 2.0, a str, a bool, None). ValueError: out of range.
    """
    if not is_int(e):
        raise TypeError(f"{what}={e!r}: expected an int in [0, {MAX_EPILOGUE_MULTIPLIES}], got {type(e).__name__}")
    if not 0 <= e <= MAX_EPILOGUE_MULTIPLIES:
        raise ValueError(f"{what}={e!r}: expected an int in [0, {MAX_EPILOGUE_MULTIPLIES}]")
    return int(e)


@dataclass(frozen=True)
class AccumulationModel:
    """How a kernel accumulates a length-K dot product, as data.

    Attributes:
        name: registry name (what a kernel file writes in ``NUMERIC_MODEL``).
        kind: "exact", "recursive" (scalar RN summation with unit roundoff ``u``), "block_fma" (tensor core:
            ``k`` products per step, ``F`` kept fraction bits, accumulator precision ``acc_p`` with rounding
            ``acc_rounding``), or "linear" (eps_acc = ``slope`` * K).
        k, F, acc_p, acc_rounding: block-FMA parameters (see the module docstring).
        u: unit roundoff of the recursive summation ("recursive" only).
        slope: eps_acc per product ("linear" only).
        promote_every: if set, the block-FMA chain restarts every ``promote_every`` products and each chunk is
            added into an fp32 accumulator with RN (Hopper fp8 promotion, DeepSeek-V3 §3.3.2).
        chunk: if set (split-K), chunks of ``chunk`` products are accumulated by ``inner`` and the ceil(K/chunk)
            partial results are summed in fp32 with RN in a fixed order.
        inner: the per-chunk model for split-K.
        epilogue_multiplies: fp32 multiplies applied after accumulation, on top of the Reference's own.
        source: where the model comes from.
    """

    name: str
    kind: str
    k: int = 1
    F: int = 0
    acc_p: int = 24
    acc_rounding: str = "rz"
    u: float = 0.0
    slope: float = 0.0
    promote_every: int | None = None
    chunk: int | None = None
    inner: "AccumulationModel | None" = None
    epilogue_multiplies: int = 0
    source: str = ""

    def __post_init__(self):
        # every field is checked here: a bound built from a negative, NaN or non-integer parameter is meaningless,
        # and check() would report OK under it
        for name in ("name", "source"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name}={getattr(self, name)!r}: expected a str")
        if not self.name:
            raise ValueError("name='': a model needs a name (the registry's key)")
        if self.kind not in ("exact", "recursive", "block_fma", "linear", "splitk"):
            raise ValueError(f"kind={self.kind!r}: expected exact, recursive, block_fma, linear or splitk")
        for name in ("k", "F", "acc_p"):
            v = getattr(self, name)
            if not is_int(v):
                raise TypeError(f"{name}={v!r}: expected an int, got {type(v).__name__}")
            object.__setattr__(self, name, int(v))
        if self.k < 1 or (self.kind == "block_fma" and (self.F < 1 or self.acc_p < 2)):
            raise ValueError(f"model {self.name!r}: needs k >= 1, and for block_fma F >= 1, acc_p >= 2 (got k="
                             f"{self.k}, F={self.F}, acc_p={self.acc_p})")
        if self.acc_rounding not in ("rz", "rn"):
            raise ValueError(f"acc_rounding={self.acc_rounding!r}: expected 'rz' or 'rn'")
        for name in ("u", "slope"):
            v = getattr(self, name)
            if not is_real(v):
                raise TypeError(f"{name}={v!r}: expected a real number, got {type(v).__name__}")
            if not (math.isfinite(v) and 0 <= v < (1 if name == "u" else math.inf)):
                raise ValueError(f"{name}={v!r}: expected a finite real >= 0" + (" and < 1" if name == "u" else ""))
            object.__setattr__(self, name, float(v))
        if self.kind == "recursive" and not self.u > 0:
            raise ValueError(f"model {self.name!r}: a recursive model needs its unit roundoff u > 0 (kind 'exact' "
                             "is the error-free one)")
        for name in ("promote_every", "chunk"):
            v = getattr(self, name)
            if v is None:
                continue
            if not is_int(v):
                raise TypeError(f"{name}={v!r}: expected None or an int >= 1, got {type(v).__name__}")
            if v < 1:
                raise ValueError(f"{name}={v!r}: expected None or an int >= 1")
            object.__setattr__(self, name, int(v))
        if self.inner is not None and not isinstance(self.inner, AccumulationModel):
            raise TypeError(f"inner={self.inner!r}: expected None or an AccumulationModel, got "
                            f"{type(self.inner).__name__}")
        if self.kind == "splitk" and (self.inner is None or self.chunk is None):
            raise ValueError("a splitk model needs inner (a model) and chunk >= 1")
        object.__setattr__(self, "epilogue_multiplies", _check_epilogue_multiplies(self.epilogue_multiplies))

    def eps(self, K: int) -> float:
        """eps_acc(K): |computed - exact| <= eps_acc(K) * (|A||B|) for a length-K dot product (rigorous).

        Raises:
            TypeError: K is not an int (a numpy integer is one; a bool is not). ValueError: K < 1.
        """
        K = _check_K(K)
        if self.kind == "exact":
            return 0.0
        if self.kind == "recursive":
            return gamma(K, self.u)
        if self.kind == "linear":
            return self.slope * K
        if self.kind == "splitk":
            n = -(-K // self.chunk)
            e_in = self.inner.eps(min(K, self.chunk))
            if math.isinf(e_in):  # (one chunk: gamma_0 = 0, and 0 * inf would be NaN)
                return math.inf
            # a partial meets at most n - 1 fp32 additions, and with an exact inner model its own rounding to fp32
            # first (an inner model's accumulator is fp32 or narrower: converting it is exact)
            rounds = n - 1 + (1 if self.inner.kind == "exact" else 0)
            return e_in + gamma(rounds, U32) * (1 + e_in)
        # block_fma
        if self.promote_every is not None and K > self.promote_every:
            e_in = self._block_eps(self.promote_every)
            n = -(-K // self.promote_every)
            # each chunk added into the fp32 accumulator with RN: n additions (the first into +0 is exact, kept
            # for simplicity)
            return e_in + gamma(n, U32) * (1 + e_in)
        return self._block_eps(K)

    def _block_eps(self, K: int) -> float:
        n = -(-K // self.k)
        u_r = 2.0 ** (1 - self.acc_p) if self.acc_rounding == "rz" else 2.0 ** (-self.acc_p)
        t = K * 2.0 ** (-self.F) + n * u_r
        return math.inf if t >= 1 else t / (1 - t)

    def vacuous_from(self) -> int | None:
        """The smallest K at which :meth:`eps` is >= 1 (or infinite): from there on the bound allows a 100% error
        (|exact| <= |A||B|, so an all-zero output would pass) and the model bounds nothing; None when eps_acc(K) < 1
        for every K below 2^62 (``exact``).

        ``hopper_fp8_wgmma``: 3971 (t = (K + ceil(K/32)) 2^-13 reaches 1/2, where t / (1 - t) = 1); ``fp32_rn``:
        2^23 (gamma_K(2^-24) = 1 at K 2^-24 = 1/2); ``tc_fp32_universal``: 2^22 (K 2^-22); a split-K or promoting
        model: where its chunk's model or its fp32 sum of the chunks gives out. eps_acc(K) never decreases with K,
        so this is a bisection.
        """
        hi = 2**62
        if self.eps(hi) < 1:
            return None
        lo = 0  # eps(lo) < 1 (lo = 0: no K yet), eps(hi) >= 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.eps(mid) >= 1:
                hi = mid
            else:
                lo = mid
        return hi

    def describe(self, K: int | None = None) -> str:
        """One line: name, parameters, and eps_acc(K) if K is given (a positive int, as for :meth:`eps`)."""
        if K is not None:
            K = _check_K(K)
        if self.kind == "block_fma":
            p = f"block FMA k={self.k} F={self.F} acc p={self.acc_p} {self.acc_rounding.upper()}"
            if self.promote_every:
                p += f", promoted to fp32 every {self.promote_every}"
        elif self.kind == "recursive":
            p = f"recursive RN u=2^{math.log2(self.u):.0f}"
        elif self.kind == "linear":
            p = f"eps = {self.slope:.3g} * K"
        elif self.kind == "splitk":
            p = f"split-K chunks of {self.chunk} by {self.inner.name}, fp32 RN sum"
        else:
            p = "exact"
        s = f"{self.name}: {p}"
        if K is not None:
            s += f"; eps_acc(K={K}) = {self.eps(K):.3g}"
        return s


_FP8_SRC = "MMA-Sim arXiv 2511.10909; DeepSeek-V3 report §3.3.2: ~14 bits, promote every N_C"

MODELS: dict[str, AccumulationModel] = {}


def register_model(model: AccumulationModel) -> AccumulationModel:
    """Add ``model`` to the registry under ``model.name`` (ValueError if the name is taken by another model;
    TypeError if ``model`` is not an :class:`AccumulationModel`)."""
    if not isinstance(model, AccumulationModel):
        raise TypeError(f"model: expected an AccumulationModel, got {type(model).__name__}")
    if model.name in MODELS and MODELS[model.name] != model:
        raise ValueError(f"model name {model.name!r} is already registered with different parameters")
    MODELS[model.name] = model
    return model


for _m in (
    AccumulationModel("exact", "exact", source="exact accumulation (integer / exactly representable sums)"),
    AccumulationModel("fp32_rn", "recursive", u=U32, source="Higham 2002 §3.1: gamma_K, any order, RN fp32"),
    AccumulationModel("ampere_fp16", "block_fma", k=8, F=24, acc_p=24, acc_rounding="rz",
                      source="Ampere/Ada fp16, bf16 mma.sync (Fasi et al. 2021; MMA-Sim arXiv 2511.10909)"),
    AccumulationModel("hopper_fp16_wgmma", "block_fma", k=16, F=25, acc_p=24, acc_rounding="rz",
                      source="Hopper fp16/bf16 wgmma (MMA-Sim arXiv 2511.10909; Khattak & Mikaitis arXiv 2512.07004)"),
    AccumulationModel("hopper_fp8_wgmma", "block_fma", k=32, F=13, acc_p=14, acc_rounding="rz", source=_FP8_SRC),
    AccumulationModel("blackwell_fp8", "block_fma", k=32, F=25, acc_p=24, acc_rounding="rz",
                      source="ASSUMPTION: fp32-wide accumulation on Blackwell fp8 (MMA-Sim); not validated here"),
    AccumulationModel("tc_fp32_universal", "linear", slope=2.0**-22,
                      source="universal fp32-accumulating tensor-core bound K*2^-22 (docs/bounds.md)"),
):
    register_model(_m)

# eps_acc(K) = gamma_K(2^-28) = gamma_{K/16}(2^-24): an fp32 RN sum (any order) of K/16 exact terms whose absolute
# values sum to at most |A||B|: each term a 16-product block dot product that is exact in fp32 (NVFP4 GEMV, where
# an E2M1 x E2M1 block sum times the two E4M3 scales has few enough significant bits; docs/kernels.md).
register_model(AccumulationModel(
    "fp32_rn_block16", "recursive", u=2.0**-28,
    source="fp32 RN sum of K/16 exact 16-element block dot products (Higham 2002 §3.1: gamma_{K/16}(2^-24))"))

# aliases: bf16 inputs accumulate the same way as fp16 on these tensor cores; a long name for the universal bound
MODELS["ampere_bf16"] = MODELS["ampere_fp16"]
MODELS["hopper_bf16_wgmma"] = MODELS["hopper_fp16_wgmma"]
MODELS["tensor_core_fp32_universal"] = MODELS["tc_fp32_universal"]


def hopper_fp8_wgmma_promote(n: int) -> AccumulationModel:
    """Hopper fp8 wgmma with the 14-bit accumulator added into fp32 every ``n`` products (Triton's
    ``max_num_imprecise_acc=n``; DeepSeek-V3 promotes every 128)."""
    if not is_int(n):
        raise TypeError(f"n={n!r}: the promotion interval must be a positive int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"n={n!r}: the promotion interval must be a positive int")
    base = MODELS["hopper_fp8_wgmma"]
    return AccumulationModel(f"hopper_fp8_wgmma_promote({int(n)})", "block_fma", k=base.k, F=base.F,
                             acc_p=base.acc_p, acc_rounding=base.acc_rounding, promote_every=int(n), source=_FP8_SRC)


def splitk(model, chunk: int) -> AccumulationModel:
    """Split-K: chunks of ``chunk`` products accumulated by ``model``, partials summed in fp32 (RN, fixed order)."""
    inner = get_model(model)
    if not is_int(chunk):
        raise TypeError(f"chunk={chunk!r}: the split-K chunk length must be a positive int, got "
                        f"{type(chunk).__name__}")
    if chunk < 1:
        raise ValueError(f"chunk={chunk!r}: the split-K chunk length must be a positive int")
    return AccumulationModel(f"splitk({inner.name}, {int(chunk)})", "splitk", chunk=int(chunk), inner=inner,
                             source=f"{inner.name} per chunk + fp32 RN sum of the partials (Higham §3.1)")


# the argument of a parameterised name is read whatever it is, so that a bad one ("promote(-1)", "splitk(x, 1.5)")
# gets a message about its value rather than "unknown model"; spaces inside the parentheses are free
_PROMOTE_RE = re.compile(r"^hopper_fp8_wgmma_promote\(\s*([^()]*?)\s*\)$", re.IGNORECASE)
_SPLITK_RE = re.compile(r"^splitk\(\s*(.+?)\s*,\s*([^(),]*?)\s*\)$", re.IGNORECASE)


def _parameter(text: str, name: str) -> int:
    """The positive int written in a parameterised model name, or a ValueError naming the name."""
    # (at most 18 digits: Python refuses to parse very long digit strings, and no interval is that long)
    if not (text.isascii() and text.isdigit()) or len(text) > 18 or int(text) < 1:
        raise ValueError(f"model={name!r}: the parameter {text!r} must be a positive int (e.g. "
                         "'hopper_fp8_wgmma_promote(128)', 'splitk(fp32_rn, 512)')")
    return int(text)


def get_model(model) -> AccumulationModel:
    """Look a model up by name (or pass an :class:`AccumulationModel` through).

    Names: the registry (``MODELS``), ``hopper_fp8_wgmma_promote(N)`` and ``splitk(<name>, C)``, in any case
    (``"FP32_RN"`` is ``fp32_rn``; ``"SPLITK(Hopper_FP16_WGMMA, 512)"`` is ``splitk(hopper_fp16_wgmma, 512)``).

    Raises:
        TypeError: ``model`` is neither a str nor an AccumulationModel.
        ValueError: unknown name (the message lists the known ones); a parameterised name whose N or C is not a
            positive int (spaces inside the parentheses are allowed).
    """
    if isinstance(model, AccumulationModel):
        return model
    if not isinstance(model, str):
        raise TypeError(f"model must be a model name (str) or an AccumulationModel, got {type(model).__name__}")
    name = model.strip()
    if name in MODELS:
        return MODELS[name]
    folded = {key.lower(): m for key, m in MODELS.items()}.get(name.lower())
    if folded is not None:
        return folded
    m = _PROMOTE_RE.match(name)
    if m:
        return hopper_fp8_wgmma_promote(_parameter(m.group(1), model))
    m = _SPLITK_RE.match(name)
    if m:
        if name.lower().count("splitk(") > 8:  # nesting is recursion here: refuse what no kernel would declare
            raise ValueError(f"model={model[:80]!r}...: split-K models nested more than 8 deep")
        return splitk(m.group(1), _parameter(m.group(2), model))
    raise ValueError(
        f"model={model!r} is not a known accumulation model; expected one of {sorted(MODELS)}, "
        "'hopper_fp8_wgmma_promote(N)' or 'splitk(<model>, C)'"
    )


# --------------------------------------------------------------------------------------------------------------
# Numeric contracts
# --------------------------------------------------------------------------------------------------------------


def _model_name(value, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what}={value!r}: expected a model name (str)")
    get_model(value)  # ValueError names the unknown model
    return value


# The keys of NumericContract's dict form (from_dict), each with the field it sets.
_DICT_KEYS = {"accumulation_model": "model", "accumulation_model_interpreter": "model_interpreter",
              "output_rounding": "output_rounding", "output_rounding_interpreter": "output_rounding_interpreter",
              "epilogue_multiplies": "epilogue_multiplies", "inputs": "inputs", "output": "output", "notes": "notes"}


@dataclass(frozen=True)
class NumericContract:
    """What a kernel promises about its arithmetic, as data the checker reads.

    A kernel package exports one as ``NUMERIC_CONTRACT``; ``fp4ref verify`` and the tests ask it for the model of
    the path and config that serves a call (:meth:`model_for`), so a GEMV, a split-K and a persistent tile path of
    one kernel are each checked against their own bound.

    Attributes:
        inputs, output: what the kernel reads and writes (``output`` is "float16" or "bfloat16").
        model: an accumulation model (a name for :func:`get_model`) that bounds EVERY config at every K on the
            GPU: the contract's promise when the config is unknown.
        model_interpreter: the same for the Triton CPU interpreter (its ``tl.dot`` is a numpy fp32 product).
        output_rounding / output_rounding_interpreter: "rne" or "faithful" (either neighbour: the interpreter
            truncates fp32 -> bf16 stores).
        epilogue_multiplies: fp32 multiplies after the accumulation (global scales), added to the bound.
        deterministic: outputs are bitwise equal run to run.
        config_model: ``(config, K, interpreter, **launch) -> model name``: the tight model of one config at
            reduction length K (``launch`` may carry M and N for schedules that depend on them). None: ``model``.
        pick_config: ``(M, N, K, interpreter) -> config``: the config a call of that shape runs with. None: the
            kernel has one config.
        notes: other promises, as text (split-K order, NaN policy, quantizer recipe, ...).

    Raises:
        TypeError / ValueError: a model name that :func:`get_model` does not know, a rounding outside
            ``OUTPUT_ROUNDINGS``, a non-callable hook; an ``epilogue_multiplies`` that is not an int (TypeError) or
            is negative or oversized (ValueError).
    """

    inputs: str
    output: str
    model: str
    model_interpreter: str = "fp32_rn"
    output_rounding: str = "rne"
    output_rounding_interpreter: str = "rne"
    epilogue_multiplies: int = 0
    deterministic: bool = True
    config_model: Callable[..., str] | None = None
    pick_config: Callable[[int, int, int, bool], Any] | None = None
    notes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        _model_name(self.model, "model")
        _model_name(self.model_interpreter, "model_interpreter")
        for name in ("output_rounding", "output_rounding_interpreter"):
            object.__setattr__(self, name, parse_output_rounding(getattr(self, name), name))
        if self.output not in ("float16", "bfloat16"):
            raise ValueError(f"output={self.output!r}: expected 'float16' or 'bfloat16'")
        # a numpy integer is kept as the int it is
        object.__setattr__(self, "epilogue_multiplies", _check_epilogue_multiplies(self.epilogue_multiplies))
        for name in ("config_model", "pick_config"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise TypeError(f"{name}: expected a callable or None, got {type(getattr(self, name)).__name__}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, output: str | None = None) -> "NumericContract":
        """A contract from the plain-dict form a kernel module may declare instead.

        Keys: ``accumulation_model`` (default :data:`DEFAULT_MODEL`),
        ``accumulation_model_interpreter`` (default: ``accumulation_model``), ``output_rounding`` (default ``rne``)
        and ``output_rounding_interpreter`` (default: ``output_rounding``), ``epilogue_multiplies`` (default 0),
        ``inputs`` (text),
        ``output`` ("float16" or "bfloat16") and ``notes`` (a mapping of other promises, as text). Any other key is
        an error: a misspelled ``accumulation_model`` must not leave the kernel checked under the default bound.

        Args:
            d: the dict.
            output: the output dtype name (``fp4ref verify`` passes the workload's); None: the dict's ``output``.

        Raises:
            TypeError: ``d`` or its ``notes`` not a mapping; no output given (neither ``output`` nor the key).
            ValueError: an unknown key (the message lists the known ones); the dict's ``output`` differs from
                ``output``; and what the constructor refuses (an unknown model, a bad rounding, ...).
        """
        if not isinstance(d, Mapping):
            raise TypeError(f"contract: expected a mapping, got {type(d).__name__}")
        unknown = [k for k in d if k not in _DICT_KEYS]
        if unknown:
            raise ValueError(f"contract: unknown key(s) {', '.join(map(repr, unknown))}; the known keys are "
                             f"{list(_DICT_KEYS)} (other promises go under 'notes', as a dict of text)")
        kw = {_DICT_KEYS[k]: v for k, v in d.items()}
        if output is not None:
            if "output" in kw and kw["output"] != output:
                raise ValueError(f"contract: the dict's output={kw['output']!r} differs from output={output!r}")
            kw["output"] = output
        if "output" not in kw:
            raise TypeError("contract: no output dtype: pass output='float16' or 'bfloat16', or give an 'output' key")
        notes = kw.pop("notes", {})
        if not isinstance(notes, Mapping):
            raise TypeError(f"contract: notes={notes!r}: expected a mapping of other promises (text), got "
                            f"{type(notes).__name__}")
        kw.setdefault("model", DEFAULT_MODEL)
        # a dict that names only the GPU's model or rounding: the interpreter's run is held to the same promise
        kw.setdefault("model_interpreter", kw["model"])
        if "output_rounding" in kw:
            kw.setdefault("output_rounding_interpreter", kw["output_rounding"])
        kw["inputs"] = str(kw.get("inputs", ""))
        return cls(notes={str(k): str(v) for k, v in notes.items()}, **kw)

    def config_for(self, M: int, N: int, K: int, interpreter: bool = False):
        """The config a call with these sizes runs with (``pick_config``), or None for a one-config kernel
        (``interpreter`` a bool: TypeError otherwise, as for :meth:`model_for`)."""
        _check_interpreter_flag(interpreter)
        return None if self.pick_config is None else self.pick_config(M, N, K, interpreter)

    def model_for(self, config, K: int, interpreter: bool = False, **launch) -> AccumulationModel:
        """The accumulation model that bounds ``config`` at reduction length ``K``.

        ``config`` None (or no ``config_model``): the contract-wide ``model`` (``model_interpreter`` when
        ``interpreter``). ``launch``: keyword facts of the launch a schedule depends on (e.g. ``M=..., N=...``).

        Raises:
            TypeError: K is not an int (as for :meth:`AccumulationModel.eps`); ``interpreter`` not a bool (a string
                such as os.environ's "0" would otherwise select the interpreter's model). ValueError: K < 1, or the
                config's model is unknown to :func:`get_model`.
        """
        K = _check_K(K)
        _check_interpreter_flag(interpreter)
        if config is None or self.config_model is None:
            return get_model(self.model_interpreter if interpreter else self.model)
        return get_model(_model_name(self.config_model(config, int(K), interpreter, **launch), "config_model()"))

    def rounding_for(self, interpreter: bool = False) -> str:
        """The declared output rounding on the GPU, or in the CPU interpreter (``interpreter`` a bool: TypeError
        otherwise, as for :meth:`model_for`)."""
        _check_interpreter_flag(interpreter)
        return self.output_rounding_interpreter if interpreter else self.output_rounding


def _check_interpreter_flag(interpreter) -> None:
    if not isinstance(interpreter, (bool, np.bool_)):
        raise TypeError(f"interpreter={interpreter!r}: expected a bool (True in Triton's CPU interpreter), got "
                        f"{type(interpreter).__name__}")


# --------------------------------------------------------------------------------------------------------------
# The bound
# --------------------------------------------------------------------------------------------------------------


def no_bound_message(model, K: int) -> str:
    """Why ``model`` cannot check a length-K GEMM (its eps_acc(K) is >= 1 or infinite), and what to declare
    instead."""
    m = get_model(model)
    first = m.vacuous_from()
    return (f"model {m.name!r} gives no useful bound at K={K}: its eps_acc(K) is >= 1 for every K >= {first}, so the "
            "bound allows a 100% error (|exact| <= |A||B|: an all-zero output would pass, and so would nearly any "
            "other). Check against the model of what the kernel does at this K: one that adds the accumulator into "
            "fp32 at intervals ('hopper_fp8_wgmma_promote(N)') or a split-K one ('splitk(<model>, C)': chunks of C "
            "products, each within what <model> bounds)")


@dataclass(frozen=True)
class BoundTerms:
    """The terms of the per-element bound (float64 arrays, shape of the output)."""

    total: np.ndarray
    rounding: np.ndarray  # u_out * |C|
    accumulation: np.ndarray  # (1 + u_out) * eps_acc * P
    epilogue: np.ndarray  # (1 + u_out) * e_epi
    floor: float  # eta_out
    reference: Any  # |exact - ref.exact| bound (0 when the reference is exact)
    eps_acc: float


def bound(ref: Reference, model, *, output_rounding: str = "rne", epilogue_multiplies: int | None = None) -> BoundTerms:
    """Per-element bound on |out - exact| for a kernel following ``model`` (see the module docstring).

    Args:
        ref: the :class:`fp4ref.gemm.Reference`.
        model: a model name or :class:`AccumulationModel`.
        output_rounding: "rne" (one RNE to the output) or "faithful" (either neighbour, e.g. the CPU
            interpreter's truncating bf16 store).
        epilogue_multiplies: fp32 multiplies after accumulation; default ``ref.epilogue_multiplies +
            model.epilogue_multiplies``; an override must be an int in [0, MAX_EPILOGUE_MULTIPLIES].

    Raises:
        TypeError: ``epilogue_multiplies`` not None or an int (a float such as 2.0, a str, a bool).
        ValueError: unknown model or rounding, ``epilogue_multiplies`` out of range; a model whose eps_acc(K) is
            >= 1 (or infinite) at the reference's K (:meth:`AccumulationModel.vacuous_from`: such a bound allows a
            100% error, so an all-zero output passes; it is refused, and the message names the model, K and the
            first K the model gives out at); a ``ref.epilogue_scale`` that overflows fp32 (with epilogue
            multiplies: the declared epilogue then gives +-inf or NaN everywhere).

    Returns:
        :class:`BoundTerms`; ``total`` already includes ``ref.exact_err`` (so a bound computed around a float64
        approximation of the exact value is still sound).
    """
    if not isinstance(ref, Reference):
        raise TypeError(f"ref must be an fp4ref.gemm.Reference, got {type(ref).__name__}")
    m = get_model(model)
    output_rounding = parse_output_rounding(output_rounding)
    fmt: OutputFormat = ref.output_format
    u_out = fmt.u if output_rounding == "rne" else 2 * fmt.u
    eta = fmt.eta if output_rounding == "rne" else 2 * fmt.eta
    if epilogue_multiplies is not None:
        epilogue_multiplies = _check_epilogue_multiplies(epilogue_multiplies)
    n_epi = (ref.epilogue_multiplies + m.epilogue_multiplies) if epilogue_multiplies is None else epilogue_multiplies
    if n_epi and ref.epilogue_scale is not None and abs(ref.epilogue_scale) >= _F32_OVERFLOW:
        raise ValueError(f"the global scales' product {ref.epilogue_scale!r} overflows fp32: the epilogue acc * "
                         "fp32(G) is then +-inf or NaN for every element, and no bound exists for a finite exact "
                         "value (docs/bounds.md)")
    C = np.abs(ref.exact) + ref.exact_err
    eps = m.eps(ref.K) if ref.K else 0.0  # K = 0: an empty sum, nothing accumulated
    if not eps < 1:  # the bound would allow a 100% error (|exact| <= |A||B|): an all-zero output would pass
        raise ValueError(no_bound_message(m, ref.K))
    with np.errstate(invalid="ignore", over="ignore"):
        # |A||B| is a float64 matmul of exact magnitudes: within gamma_K(2^-53) of the true value; inflate for it.
        e_acc = eps * (ref.absprod * (1 + (ref.K + 2) * 2.0**-52)) if eps else np.zeros_like(C)
        e_epi = gamma(n_epi, U32) * (C + e_acc) + n_epi * 2.0**-149 if n_epi else np.zeros_like(C)
        G = abs(ref.epilogue_scale) if n_epi and ref.epilogue_scale is not None else None
        if G is not None and G < _F32_MIN_NORMAL:
            # fp32(G) subnormal or 0: its absolute error (<= 2^-150) is multiplied by |acc| <= (|C| + e_acc) / G
            e_epi = e_epi + (C + e_acc) * (2.0**-150 / G)
        rnd = u_out * C
        acc = (1 + u_out) * e_acc
        epi = (1 + u_out) * e_epi
        total = rnd + acc + epi + eta + ref.exact_err
    return BoundTerms(total=total, rounding=rnd, accumulation=acc, epilogue=epi, floor=eta,
                      reference=ref.exact_err, eps_acc=eps)


# --------------------------------------------------------------------------------------------------------------
# check -> Report
# --------------------------------------------------------------------------------------------------------------


def _ordered_bits(x64: np.ndarray, fmt: OutputFormat) -> np.ndarray:
    """Monotone integer key of each value's bit pattern in ``fmt`` (ulp distance = key difference)."""
    itemsize = np.dtype(fmt.dtype).itemsize
    uint = {2: np.uint16, 4: np.uint32}[itemsize]
    sint = {2: np.int64, 4: np.int64}[itemsize]
    with np.errstate(invalid="ignore", over="ignore"):
        bits = x64.astype(fmt.dtype).view(uint).astype(sint)
    sign = np.int64(1) << (8 * itemsize - 1)
    mag = bits & (sign - 1)
    return np.where(bits & sign, -mag, mag)


@dataclass
class Report:
    """What :func:`check` found. ``ok`` is the verdict; ``assert_ok()`` raises with a readable message.

    Attributes:
        ok: True when no element breaks the bound, NaN/Inf patterns match, nothing is unwritten, and (with
            ``exact_accumulation``) every element equals the correctly rounded output.
        model, output_rounding, K, shape, size: what was checked.
        n_violations: elements with |out - exact| > bound (finite ones).
        max_err_over_bound: max |out - exact| / bound over finite elements (<= 1 passes); ``worst`` its index.
        worst_terms: dict of the bound terms and values at ``worst``.
        max_ulps: max distance in ulps of the output format between out and the correctly rounded output, over
            the ``finite_pairs`` elements finite in both (0 when there are none).
        finite_pairs: elements where out and the reference are both finite (what max_ulps is measured over).
        bitwise_equal_fraction: fraction of elements equal to the correctly rounded output (NaN matching NaN;
            +0 == -0); 0.0 for an empty output, whose summary and message say n/a for it, the ratio and the SQNR.
        sqnr_db: 10 log10(sum C^2 / sum (out - C)^2) over finite elements (inf when equal).
        nan_mismatch: elements NaN in exactly one of out and the reference.
        inf_mismatch: infinities the bound cannot explain (wrong sign, or inf where the exact value is
            further than the bound from the overflow threshold, or finite where it must overflow).
        unwritten: elements still holding the poison value where the reference does not.
        not_equal_exact: elements differing from the correctly rounded output when ``exact_accumulation``.
        violations: up to 10 (index, out, correctly rounded, exact, bound) tuples.
        first_nonfinite: index of the first NaN/Inf mismatch or unwritten element (these make
            ``max_err_over_bound`` inf), None when there is none.
        worst_passes: the element at ``worst`` breaks no rule, so it is not among the offenders (e.g. a
            correctly rounded element whose rounding error is the largest fraction of its bound, while the
            exact-accumulation rule fails elsewhere); :meth:`message` says so next to it.
    """

    ok: bool
    model: str
    output_rounding: str
    K: int
    shape: tuple
    size: int
    n_violations: int
    max_err_over_bound: float
    worst: tuple | None
    worst_terms: dict
    max_ulps: int
    bitwise_equal_fraction: float
    sqnr_db: float
    nan_mismatch: int
    inf_mismatch: int
    unwritten: int
    exact_accumulation: bool
    not_equal_exact: int
    violations: list = field(default_factory=list)
    description: dict = field(default_factory=dict)
    first_nonfinite: tuple | None = None
    finite_pairs: int = 0
    worst_passes: bool = False

    def failures(self) -> list:
        """What failed, each with its count, the rule that decides first: e.g. ``["37 / 6144 elements not equal to
        the correctly rounded output (exact-accumulation input)", "2 NaN mismatches"]``. Empty when ``ok``."""
        out = []
        if self.not_equal_exact:
            out.append(f"{self._pct(self.not_equal_exact)} elements not equal to the correctly rounded output "
                       "(exact-accumulation input)")
        if self.n_violations:
            out.append(f"{self._pct(self.n_violations)} elements over the K-aware bound")
        if self.unwritten:
            out.append(f"{self._pct(self.unwritten)} elements unwritten (still poisoned)")
        if self.nan_mismatch:
            out.append(f"{self._pct(self.nan_mismatch)} NaN mismatches")
        if self.inf_mismatch:
            out.append(f"{self._pct(self.inf_mismatch)} Inf mismatches")
        return out

    def _pct(self, n: int) -> str:
        return f"{n} / {self.size} ({100.0 * n / max(self.size, 1):.3g}%)"

    def summary(self) -> str:
        """One line: what failed and how many first (``FAILED: ...``), then the headline numbers."""
        head = "OK" if self.ok else "FAILED: " + "; ".join(self.failures() or ["check failed"])
        if self.size == 0:  # no share, ratio or SQNR of zero elements to state
            return (f"{head} -- {self.model} ({self.output_rounding}), K={self.K}, 0 elements: nothing to compare "
                    "(max err/bound, ulps, equal share and SQNR n/a)")
        return (
            f"{head} -- {self.model} ({self.output_rounding}), K={self.K}, {self.size} elements: "
            f"max err/bound {self.max_err_over_bound:.3g}, {self._ulps_text()}, "
            f"{100 * self.bitwise_equal_fraction:.2f}% equal to the correctly rounded output, "
            f"SQNR {self.sqnr_db:.1f} dB"
        )

    def _ulps_text(self) -> str:
        return f"max {self.max_ulps} ulp" if self.finite_pairs else "no element finite in both to count ulps on"

    def message(self) -> str:
        """A multi-line failure message in numpy.testing's layout (rule, counts, first offenders, worst terms)."""
        lines = [f"Not within the K-aware bound of model {self.model!r} ({self.output_rounding} output, K={self.K})"]
        if self.exact_accumulation:
            lines[0] = f"Not equal to the correctly rounded output (exact-accumulation input), model {self.model!r}"
        lines.append(f"Elements over the bound: {self._pct(self.n_violations)}")
        if self.exact_accumulation:
            lines.append(f"Elements not equal to the correctly rounded output: {self._pct(self.not_equal_exact)}")
        if self.nan_mismatch:
            lines.append(f"NaN mismatches: {self._pct(self.nan_mismatch)}")
        if self.inf_mismatch:
            lines.append(f"Inf mismatches: {self._pct(self.inf_mismatch)}")
        if self.unwritten:
            lines.append(f"Unwritten (still poisoned) elements: {self._pct(self.unwritten)}")
        if self.first_nonfinite is not None:  # inf from a NaN/Inf mismatch or an unwritten element, not a ratio
            where = (f"inf (a NaN/Inf mismatch or unwritten element, the first at {self.first_nonfinite}); "
                     + (f"the worst finite element is at {self.worst}" if self.worst is not None
                        else "no element is finite in both out and the reference"))
        elif self.worst is None:
            where = f"{self.max_err_over_bound:.6g} (no element is finite in both out and the reference)"
        else:
            where = f"{self.max_err_over_bound:.6g} at {self.worst}"
            if self.worst_passes:  # the largest ratio is not an offender: say so, the offenders follow
                where += ", an element that passes (the offenders are listed below)"
        if self.size == 0:
            lines.append("Max err/bound, ulps, equal share and SQNR: n/a (0 elements)")
        else:
            lines.append(f"Max err/bound: {where}; vs correctly rounded: {self._ulps_text()}; "
                         f"equal: {100 * self.bitwise_equal_fraction:.3f}%; SQNR: {self.sqnr_db:.2f} dB")
        if self.violations:
            lines.append("First offenders (index: ACTUAL, DESIRED correctly rounded, exact, bound):")
            for idx, o, r, c, b in self.violations:
                lines.append(f"  {idx}: {o!r}, {r!r}, {c!r}, {b:.6g}")
        if self.worst_terms:
            at = "worst finite element" if self.first_nonfinite is not None else "worst element"
            if self.worst_passes:
                at += " (it passes)"
            lines.append(f"Bound terms at the {at}: " +
                         ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in self.worst_terms.items()))
        return "\n".join(lines)

    def assert_ok(self) -> "Report":
        """Raise AssertionError with :meth:`message` unless ``ok``; return self."""
        __tracebackhide__ = True
        if not self.ok:
            raise AssertionError(self.message())
        return self

    def __str__(self) -> str:
        return self.summary()


def _as_out_array(out, fmt: OutputFormat) -> np.ndarray:
    out = to_numpy(out, "out")
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array or torch tensor, got {type(out).__name__}")
    if out.dtype.name != fmt.name:
        raise TypeError(f"out must have the reference's output dtype {fmt.name}, got {out.dtype}")
    return out


def _is_own_dtype_poison(poison, fmt) -> bool:
    """``poison`` is a scalar of the output format's dtype (compared bit for bit, payload included)."""
    return isinstance(poison, np.generic) and poison.dtype == fmt.dtype


def _check_poison(poison, fmt) -> None:
    """``poison`` as :func:`check` takes it: None, a real number (not a bool) or a scalar of the output dtype."""
    if poison is not None and not _is_own_dtype_poison(poison, fmt) and (
            isinstance(poison, (bool, np.bool_)) or not isinstance(poison, (int, float, np.integer, np.floating))):
        raise TypeError(f"poison={poison!r}: expected None, a real number or a scalar of the output dtype (the value "
                        "the output was filled with)")


def _unwritten_mask(o: np.ndarray, fmt, poison, ref_nan: np.ndarray, r64: np.ndarray) -> np.ndarray:
    """Elements of the output ``o`` (the format's dtype) still holding ``poison`` where the reference does not (see
    :func:`check`): a float NaN matches any NaN; otherwise the bits the buffer holds are compared."""
    if _is_own_dtype_poison(poison, fmt):  # its bits as they are, a NaN payload included
        stored = np.asarray(poison).reshape(1)
    else:
        try:
            p = float(poison)
        except OverflowError:  # a Python int beyond float64: its value as the buffer holds it, +-inf
            p = math.inf if poison > 0 else -math.inf
        if math.isnan(p):
            return np.isnan(o.astype(np.float64)) & ~ref_nan
        with np.errstate(over="ignore"):
            stored = np.array([p]).astype(fmt.dtype)  # the poison as the buffer holds it (RNE to the format)
    itemsize = np.dtype(fmt.dtype).itemsize
    ob = np.ascontiguousarray(o).view(np.uint8).reshape(o.shape + (itemsize,))
    held = np.all(ob == stored.view(np.uint8), axis=-1)
    return held & (~ref_nan if np.isnan(stored[0]) else r64 != float(stored[0]))


def check(out, ref: Reference, model=DEFAULT_MODEL, *, output_rounding: str = "rne", poison=None,
          exact_accumulation: bool = False, epilogue_multiplies: int | None = None) -> Report:
    """Check a kernel's output against a :class:`~fp4ref.gemm.Reference` under an accumulation model.

    Args:
        out: the kernel output, numpy array or torch tensor, same shape and dtype as ``ref.out``.
        ref: the reference (``fp4ref.gemm.*``).
        model: model name or :class:`AccumulationModel` (default ``tc_fp32_universal``).
        output_rounding: "rne" or "faithful" (either neighbour; for the CPU interpreter's bf16 stores).
        poison: the value the output buffer was filled with before the kernel ran; elements still holding it
            where the reference does not are counted as unwritten. A Python or numpy float is compared bit for
            bit after RNE to the output format, except a NaN, which matches any NaN; a scalar of the output's
            own dtype (``np.float16`` / ``ml_dtypes.bfloat16``) is compared bit for bit, so a NaN with its own
            payload (``fp4ref.verify.POISON_BITS``) tells an unwritten element from a NaN the kernel computed.
            None: no unwritten-element check.
        exact_accumulation: the inputs come from an exact-accumulation family (every fp32 partial sum exact in
            any order): then every element must EQUAL the correctly rounded output (rne) or be one of the two
            neighbours of the exact value (faithful), whatever the model.
        epilogue_multiplies: override the number of fp32 epilogue multiplies (see :func:`bound`).

    Returns:
        :class:`Report`.

    Raises:
        TypeError: wrong dtype of ``out`` or ``ref``, a non-numeric ``poison``, a non-bool
        ``exact_accumulation``, an ``epilogue_multiplies`` that is not None or an int; ValueError: shape mismatch,
        unknown model or rounding, ``epilogue_multiplies`` outside [0, MAX_EPILOGUE_MULTIPLIES], a model whose
        eps_acc(ref.K) is >= 1 or a ``ref.epilogue_scale`` that overflows fp32 (as for :func:`bound`; before any
        element is compared).
    """
    if not isinstance(ref, Reference):
        raise TypeError(f"ref must be an fp4ref.gemm.Reference, got {type(ref).__name__}")
    _check_poison(poison, ref.output_format)
    if not isinstance(exact_accumulation, (bool, np.bool_)):
        raise TypeError(f"exact_accumulation={exact_accumulation!r}: expected a bool")
    m = get_model(model)
    output_rounding = parse_output_rounding(output_rounding)
    fmt = ref.output_format
    o = _as_out_array(out, fmt)
    if o.shape != ref.out.shape:
        raise ValueError(f"out has shape {o.shape}, the reference {ref.out.shape}")
    terms = bound(ref, m, output_rounding=output_rounding, epilogue_multiplies=epilogue_multiplies)
    o64 = o.astype(np.float64)
    r64 = ref.out.astype(np.float64)
    C = ref.exact
    size = o.size

    ref_nan = np.isnan(C)
    out_nan = np.isnan(o64)
    unwritten_mask = np.zeros(o.shape, bool)
    if poison is not None:
        unwritten_mask = _unwritten_mask(o, fmt, poison, ref_nan, r64)
    nan_mm = (ref_nan != out_nan) & ~unwritten_mask

    both = ~ref_nan & ~out_nan & ~unwritten_mask
    finite_C = np.isfinite(C)
    # infinities
    thr = fmt.max + fmt.ulp(fmt.max) / 2  # RNE overflow threshold
    with np.errstate(invalid="ignore"):
        e_pre = np.where(both, terms.accumulation + terms.epilogue + terms.reference, 0.0)
        out_inf = both & np.isinf(o64)
        inf_ok = out_inf & (
            (np.isinf(C) & (np.sign(C) == np.sign(o64)))
            | (finite_C & (np.abs(C) + e_pre >= thr if output_rounding == "rne" else np.abs(C) + e_pre >= fmt.max)
               & (np.sign(C) == np.sign(o64)))
        )
        # the exact value is an infinity (IEEE inputs) but out is finite; or |C| certainly overflows
        # (faithful rounding may truncate a huge value to the largest finite one, so only RNE must overflow)
        must_inf = both & ~np.isinf(o64) & (np.isinf(C) | ((np.abs(C) - e_pre >= thr) & (output_rounding == "rne")))
    inf_mm = (out_inf & ~inf_ok) | must_inf

    fin = both & ~np.isinf(o64) & finite_C
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = np.where(fin, np.abs(o64 - C), 0.0)
        b = terms.total
        ratio = np.where(fin, np.where(b > 0, err / np.where(b > 0, b, 1.0), np.where(err > 0, np.inf, 0.0)), 0.0)
    if output_rounding == "faithful":
        # a faithful (e.g. truncating) store of a value beyond the largest finite one gives that largest value
        with np.errstate(invalid="ignore"):
            sat = fin & (np.abs(o64) == fmt.max) & (np.sign(o64) == np.sign(C)) & (np.abs(C) + e_pre >= fmt.max)
        ratio = np.where(sat, np.minimum(ratio, 1.0), ratio)
    viol = fin & (ratio > 1)

    equal = (o64 == r64) | (out_nan & np.isnan(r64))
    not_exact = np.zeros(o.shape, bool)
    if exact_accumulation:
        if output_rounding == "rne":
            not_exact = ~equal
        else:
            # faithful: out must be RD(C) or RU(C); ref.out is one of them, the other is its neighbour toward C
            key_o = _ordered_bits(o64, fmt)
            key_r = _ordered_bits(r64, fmt)
            with np.errstate(invalid="ignore"):
                toward = np.sign(np.where(finite_C, C, r64) - r64).astype(np.int64)
            # C is a float64 within exact_err of the exact value: where that leaves the side of ref.out open, the
            # exact value (integer arithmetic, for those few elements) decides it
            c_err = np.broadcast_to(np.asarray(ref.exact_err, dtype=np.float64), C.shape)
            with np.errstate(invalid="ignore"):
                open_side = ~equal & both & finite_C & np.isfinite(r64) & (c_err > 0) & (np.abs(C - r64) <= c_err)
            for idx in zip(*np.nonzero(open_side)):
                d = ref.exact_fraction(idx) - Fraction(float(r64[idx]))
                toward[idx] = (d > 0) - (d < 0)
            not_exact = ~equal & ~((key_o == key_r + toward) & (toward != 0))
            not_exact &= ~(out_nan & ref_nan)

    finite_pair = both & np.isfinite(r64) & np.isfinite(o64)
    if np.any(finite_pair):
        ulps = int(np.max(np.abs(_ordered_bits(np.where(finite_pair, o64, 0.0), fmt)
                                 - _ordered_bits(np.where(finite_pair, r64, 0.0), fmt))))
    else:
        ulps = 0
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        sig = float(np.sum(np.where(fin, C, 0.0) ** 2))
        noise = float(np.sum(np.where(fin, o64 - C, 0.0) ** 2))
    sqnr = math.inf if noise == 0 else (10 * math.log10(sig / noise) if sig > 0 else -math.inf)

    if np.any(fin):
        flat = int(np.argmax(np.where(fin, ratio, -1.0)))
        worst = tuple(int(i) for i in np.unravel_index(flat, o.shape))
        max_err_over_bound = float(ratio[worst])
        wt = {
            "out": float(o64[worst]), "correctly_rounded": float(r64[worst]), "exact": float(C[worst]),
            "|A||B|": float(ref.absprod[worst]) if terms.eps_acc else float("nan"),
            "bound": float(b[worst]), "rounding": float(terms.rounding[worst]),
            "accumulation": float(terms.accumulation[worst]), "epilogue": float(terms.epilogue[worst]),
            "floor": float(terms.floor), "eps_acc": float(terms.eps_acc),
        }
    else:
        worst, max_err_over_bound, wt = None, 0.0, {}

    first_nonfinite = None
    if np.any(nan_mm | inf_mm | unwritten_mask):
        # A NaN/inf where the exact value is finite (or an unwritten element) is an unbounded error: the summary
        # numbers must not read as perfect when only the finite elements were measured.
        max_err_over_bound, sqnr = math.inf, -math.inf
        first_nonfinite = tuple(int(i) for i in np.argwhere(nan_mm | inf_mm | unwritten_mask)[0])
    bad = viol | nan_mm | inf_mm | unwritten_mask | not_exact
    examples = []
    for idx in np.argwhere(bad)[:10]:
        idx = tuple(int(i) for i in idx)
        examples.append((idx, float(o64[idx]), float(r64[idx]), float(C[idx]), float(b[idx])))

    n_v = int(viol.sum())
    return Report(
        ok=not bool(bad.any()),
        model=m.name,
        output_rounding=output_rounding,
        K=ref.K,
        shape=tuple(o.shape),
        size=int(size),
        n_violations=n_v,
        max_err_over_bound=max_err_over_bound,
        worst=worst,
        worst_terms=wt,
        max_ulps=ulps,
        bitwise_equal_fraction=float(equal.sum()) / max(size, 1),
        sqnr_db=sqnr,
        nan_mismatch=int(nan_mm.sum()),
        inf_mismatch=int(inf_mm.sum()),
        unwritten=int(unwritten_mask.sum()),
        exact_accumulation=exact_accumulation,
        not_equal_exact=int(not_exact.sum()),
        violations=examples,
        description=dict(ref.description),
        first_nonfinite=first_nonfinite,
        worst_passes=worst is not None and not bool(bad[worst]),
        finite_pairs=int(finite_pair.sum()),
    )


# --------------------------------------------------------------------------------------------------------------
# A numpy simulator of the models (for soundness tests and for "what would this accumulator give")
# --------------------------------------------------------------------------------------------------------------


def _round_to_precision(s: np.ndarray, p: int, mode: str) -> np.ndarray:
    """Round float64 values to p significant bits (unbounded exponent), RZ or RN (ties to even)."""
    _, e = np.frexp(s)
    q = e - p  # exponent of the last kept bit
    scaled = np.ldexp(s, -q)
    r = np.trunc(scaled) if mode == "rz" else np.rint(scaled)
    return np.ldexp(r, q)


def _block_fma_chain(P: np.ndarray, m: AccumulationModel) -> np.ndarray:
    """P: float64 exact products [pairs, K]. Returns the accumulator after the chain (float64 values)."""
    pairs, K = P.shape
    acc = np.zeros(pairs)
    for k0 in range(0, K, m.k):
        T = np.concatenate([acc[:, None], P[:, k0:k0 + m.k]], axis=1)
        big = np.max(np.abs(T), axis=1)
        _, e = np.frexp(big)  # big = f 2^e, 0.5 <= f < 1: leading bit 2^(e-1)
        q = (e - 1) - m.F
        Tt = np.ldexp(np.trunc(np.ldexp(T, -q[:, None])), q[:, None])  # aligned and truncated (toward zero)
        s = np.sum(Tt, axis=1)  # exact: <= k+1 integers below 2^(F+1), times 2^q
        acc = np.where(big > 0, _round_to_precision(s, m.acc_p, m.acc_rounding), 0.0)
    return acc


def _recursive_chain(P: np.ndarray, u: float) -> np.ndarray:
    if u != U32:
        raise ValueError("the simulator models recursive summation in fp32 only")
    acc = np.zeros(P.shape[0], dtype=np.float32)
    for k in range(P.shape[1]):
        acc = acc + P[:, k].astype(np.float32)  # the products are exact in fp32 (simulate checks it)
    return acc.astype(np.float64)


def _exact_sum_fp32(row) -> float:
    """The exact sum of float64 values, rounded once to fp32 (RNE). fsum's float64 s, cast to fp32, rounds twice
    only where s is the exact midpoint of two fp32 values and the sum is not s: then the sign of sum - s (a second
    fsum, exact in sign) picks the neighbour; a Fraction where s overflows float64's range."""
    s = math.fsum(row)
    if not math.isfinite(s):
        total = sum((Fraction(float(v)) for v in row), Fraction(0))
        return round_exact(total.numerator, -(total.denominator.bit_length() - 1), "float32")
    if s < 0:  # RNE is symmetric: round |sum|
        return -_exact_sum_fp32([-float(v) for v in row])
    with np.errstate(over="ignore"):
        f = np.float32(s)
        lo = f if float(f) <= s else np.nextafter(f, np.float32(-np.inf))
        hi = np.nextafter(lo, np.float32(np.inf))
    # (above fp32's max the next value is inf, at 2^128 for the midpoint: max + ulp/2 rounds to inf as a tie)
    if s != (float(lo) + (float(hi) if np.isfinite(hi) else 2.0**128)) / 2:
        return float(f)
    r = math.fsum([*row, -s])
    return float(hi if r > 0 else lo if r < 0 else f)


def _simulate_products(P: np.ndarray, m: AccumulationModel) -> np.ndarray:
    K = P.shape[1]
    if m.kind == "exact":
        # fsum: the exact sum of the (exact) products, rounded once to float64 (np.sum loses 1 in 1 + 2^60 - 2^60)
        return np.array([math.fsum(row) for row in P], dtype=np.float64)
    if m.kind == "recursive":
        return _recursive_chain(P, m.u)
    if m.kind == "splitk":
        if m.inner.kind == "exact":  # each exact partial rounded to fp32 ONCE (fsum's float64, then fp32, could twice)
            parts = [np.array([_exact_sum_fp32(row) for row in P[:, c:c + m.chunk]], dtype=np.float32)
                     for c in range(0, K, m.chunk)]
        else:
            parts = [_simulate_products(P[:, c:c + m.chunk], m.inner).astype(np.float32)
                     for c in range(0, K, m.chunk)]
        acc = np.zeros(P.shape[0], dtype=np.float32)
        for part in parts:
            acc = acc + part
        return acc.astype(np.float64)
    if m.kind == "block_fma":
        if m.promote_every:
            acc = np.zeros(P.shape[0], dtype=np.float32)
            for c in range(0, K, m.promote_every):
                chunk = _block_fma_chain(P[:, c:c + m.promote_every], m)
                acc = acc + chunk.astype(np.float32)
            return acc.astype(np.float64)
        return _block_fma_chain(P, m)
    raise ValueError(f"model {m.name!r} (kind {m.kind}) has no simulator")


def _sim_operand(x, name: str) -> np.ndarray:
    """``x`` as float64 values: a floating array (float16 / 32 / 64, ml_dtypes floats), finite, any byte order."""
    arr = np.asarray(to_numpy(x, name))
    if not exact_float_dtype(arr.dtype):
        raise TypeError(f"{name} must be a floating array (float16 / bfloat16 / float32 / float64 / float8 values), "
                        f"got dtype {arr.dtype}")
    x64 = arr.astype(np.float64)
    if not np.all(np.isfinite(x64)):
        raise ValueError(f"{name} holds NaN or inf: the simulator models finite arithmetic")
    return x64


def _bits(x: np.ndarray) -> tuple:
    """(significant bits, exponent of the leading bit, exponent of the lowest set bit) of finite float64 values;
    a zero has 0 bits (its exponents are never read)."""
    f, e = np.frexp(x)
    mant = (np.abs(f) * 2.0**53).astype(np.int64)  # exact: |f| < 1 has 53 significant bits at most
    low_bit = np.where(mant > 0, mant & -mant, 1)
    tz = np.round(np.log2(low_bit.astype(np.float64))).astype(np.int64)  # exact: a power of two
    nbits = np.where(mant > 0, 53 - tz, 0)
    return nbits, e.astype(np.int64) - 1, e.astype(np.int64) - 53 + tz


def _check_exact_products(a64: np.ndarray, b64: np.ndarray, p: int, emax: int, emin_low: int, what: str) -> None:
    """Raise ValueError unless every product a[i, k] * b[j, k] is provably exact in a format of ``p`` significant
    bits, leading-bit exponent <= ``emax`` and lowest-bit exponent >= ``emin_low``: the operands' significant bits
    sum to at most p (a sufficient condition) and the exponents stay in range."""
    na, ta, la = _bits(a64)
    nb, tb, lb = _bits(b64)
    nz = (na[:, None, :] > 0) & (nb[None, :, :] > 0)
    ok = ~nz | ((na[:, None, :] + nb[None, :, :] <= p) & (ta[:, None, :] + tb[None, :, :] + 1 <= emax)
                & (la[:, None, :] + lb[None, :, :] >= emin_low))
    if not np.all(ok):
        i, j, k = (int(v) for v in np.argwhere(~ok)[0])
        raise ValueError(f"a[{i}, {k}] * b[{j}, {k}] = {a64[i, k]!r} * {b64[j, k]!r} is not provably exact in {what} "
                         f"(operands of {int(na[i, k])} + {int(nb[j, k])} significant bits, at most {p}; or out of its "
                         "exponent range): the simulator adds exact products only")


def simulate(a, b, model) -> np.ndarray:
    """Accumulate a @ b.T the way ``model`` says (before any output rounding); float64 [M, N].

    Block FMA: per step of k products, the exact products and the accumulator are aligned to the largest exponent
    E, truncated toward zero to multiples of 2^(E - F), summed exactly and rounded (RZ) to ``acc_p`` significant
    bits; promotion adds each chunk into an fp32 accumulator (RN); split-K sums chunk results in fp32 (RN) in
    order; ``fp32_rn`` adds the products one by one in fp32; ``exact`` is the exact sum rounded once to float64
    (``math.fsum``). The exponent range of the accumulator is not modelled (keep results in the fp32 normal range).
    ``tc_fp32_universal`` and recursive models other than fp32's have no simulator (they are bounds, not machines).

    Args:
        a: floating array [M, K] (float16 / bfloat16 / float32 / float64 / float8 values, numpy, ml_dtypes or
            torch; any byte order), finite.
        b: floating array [N, K], the same.
        model: name or :class:`AccumulationModel`.

    Raises:
        TypeError: ``a`` / ``b`` not of a floating dtype (ints, bools, strings, complex are not converted); ``model``
            as :func:`get_model`.
        ValueError: not 2-D or K differs; NaN or inf in an operand; a product not provably exact in float64 (the
            operands' significant bits must sum to at most 53), or for a model that adds the products in fp32
            (recursive, and split-K over one) in fp32 (at most 24, within fp32's exponent range): e.g. fp16 x fp16,
            bf16 x bf16, e4m3 x e4m3 pass; fp32 x fp32 under ``fp32_rn`` does not; a model without a simulator.
    """
    m = get_model(model)
    a64, b64 = _sim_operand(a, "a"), _sim_operand(b, "b")
    if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[1]:
        raise ValueError(f"a [M, K] and b [N, K] must be 2-D and share K, got {a64.shape} and {b64.shape}")
    inner = m
    while inner.kind == "splitk":
        inner = inner.inner
    if inner.kind == "recursive":
        _check_exact_products(a64, b64, 24, 127, -149, "fp32")
    else:
        _check_exact_products(a64, b64, 53, 1023, -1074, "float64")
    M, K = a64.shape
    N = b64.shape[0]
    P = (a64[:, None, :] * b64[None, :, :]).reshape(M * N, K)
    return _simulate_products(P, m).reshape(M, N)
