"""Quantize and dequantize model checkpoints in the layouts serving stacks load (ModelOpt, compressed-tensors) or
fp4ref's own, shard by shard, in bounded memory, with worker processes. docs/checkpoints.md is the user's page.

Input: one ``*.safetensors`` file, a sharded checkpoint (``*.safetensors.index.json``) or a Hugging Face model
directory (``config.json`` + shards): :func:`fp4ref.checkpoint_io.open_checkpoint`. Output: the same sharding (same
shard file names, each tensor in the shard its source was in), a rewritten index, ``config.json`` carried over with
the quantization config the target format needs, the directory's other files copied.

Checkpoint formats (:data:`LAYOUTS`; tensor NAME = ``X.weight``, or a 3-D expert parameter P)::

    modelopt (nvidia-modelopt 0.47.0, unified HF export: export/unified_export_hf.py, export/quant_utils.py)
      nvfp4  X.weight U8 [N, K/2] (packed E2M1, element 2i in bits 3:0), X.weight_scale F8_E4M3 [N, K/16] (plain),
             X.weight_scale_2 F32 [] (global decode scale = amax / 2688); hf_quant_config.json quant_algo
             "W4A16_NVFP4" (weight only: no input_scale, see docs/checkpoints.md); 3-D P [E, N, K]: P, P_weight_scale,
             P_weight_scale_2 F32 [E].
      mxfp8  X.weight F8_E4M3 [N, K], X.weight_scale U8 [N, K/32] (E8M0 bytes); quant_algo "MXFP8"; 3-D P: P,
             P_weight_scale.
    compressed-tensors (compressed-tensors 0.20.1, presets NVFP4A16 / MXFP4A16 / MXFP8A16)
      nvfp4  X.weight_packed U8 [N, K/2], X.weight_scale F8_E4M3 [N, K/16], X.weight_global_scale F32 [1]
             (the ENCODE direction: 2688 / amax; decode scale = 1 / it); format "nvfp4-pack-quantized".
      mxfp4  X.weight_packed U8 [N, K/2], X.weight_scale U8 [N, K/32]; format "mxfp4-pack-quantized".
      mxfp8  X.weight F8_E4M3 [N, K], X.weight_scale U8 [N, K/32]; format "mxfp8-quantized".
    fp4ref: NAME, NAME_scale, NAME_scale_2 (nvfp4) as modelopt's nvfp4, or NAME, NAME_scale (MX); no config file.

A tensor whose K is not a multiple of the block is copied unquantized (ModelOpt's export asserts on it and the
serving loaders size the packed weight as K/2), except with ``pad=True`` in fp4ref's layout: K is zero-padded to
the next multiple of the block (as NVFP4QTensor.quantize pads) and the original K is kept in ``fp4ref.tensors``.

Every format's shards also carry ``__metadata__`` ``fp4ref.tensors`` (original shape and dtype of each quantized
tensor of that shard), ``fp4ref.format``, ``fp4ref.checkpoint_format``, ``fp4ref.block`` and the recipe or mode,
which ``--dequantize`` and ``fp4ref audit`` read.

Fused layers share one global scale (the max of the members' amax), as the serving stacks that fuse them require:
``*.{q,k,v}_proj.weight``, ``*.{gate,up}_proj.weight`` (also per expert) and Mixtral's ``*.{w1,w3}.weight``; a 3-D
expert tensor gets one global scale per expert.
"""
from __future__ import annotations

import ctypes
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._validate import is_int
from .blockscale import MXMode, NVFP4Recipe, mx_dequantize, mx_quantize
from .blockscale import _S_ENC_RECIPES, _error_stats, _global_scales, _nvfp4_quantize_stats, _parse_mode
from .blockscale import _parse_recipe
from .blockscale import MXTensor, NVFP4Tensor
from .checkpoint_io import (
    DTYPES,
    INDEX_NAME,
    Checkpoint,
    CheckpointError,
    OutputLocation,
    Shard,
    ShardWriter,
    ends_in_separator,
    open_checkpoint,
    path_arg,
    write_at,
)
from .packing import pack_fp4

__all__ = [
    "CHECKPOINT_FORMATS",
    "FORMATS",
    "LAYOUTS",
    "DEFAULT_IGNORE",
    "FUSED_GROUPS",
    "QuantizeFileError",
    "TensorReport",
    "Layer",
    "find_quantized_layers",
    "scale_byte_defects",
    "element_codes",
    "zero_scale_blocks",
    "plan_quantize",
    "quantize_checkpoint",
    "dequantize_checkpoint",
    "read_dequantized",
    "print_report",
    "output_names",
    "resolve_target",
    "detect_format",
    "quantized_chunks",
    "quantization_config",
    "round_to",
    "parse_dtype",
]

#: --format name -> (block, MX element or None)
FORMATS = {"nvfp4": (16, None), "mxfp4": (32, "e2m1"), "mxfp8": (32, "e4m3fn")}
#: format -> (codes dtype, scale dtype) as every layout stores them (safetensors names): written by the quantizer,
#: required by the reader (layout_problems)
_STORED_DTYPES = {"nvfp4": ("U8", "F8_E4M3"), "mxfp4": ("U8", "U8"), "mxfp8": ("F8_E4M3", "U8")}
CHECKPOINT_FORMATS = ("fp4ref", "modelopt", "compressed-tensors")
MODELOPT_VERSION = "0.47.0"
COMPRESSED_TENSORS_VERSION = "0.20.1"

#: (checkpoint format, format) -> default recipe (nvfp4) or mode (MX); a missing pair is not supported.
LAYOUTS = {
    ("fp4ref", "nvfp4"): "te", ("fp4ref", "mxfp4"): "floor", ("fp4ref", "mxfp8"): "floor",
    ("modelopt", "nvfp4"): "modelopt", ("modelopt", "mxfp8"): "rceil",
    ("compressed-tensors", "nvfp4"): "te", ("compressed-tensors", "mxfp4"): "floor",
    ("compressed-tensors", "mxfp8"): "floor",
}
_UNSUPPORTED = {
    ("modelopt", "mxfp4"): "ModelOpt 0.47.0 exports MXFP4 weights only as W4A8_MXFP4_FP8, which needs a calibrated "
                           "FP8 input_scale; use --checkpoint-format compressed-tensors (MXFP4A16) for MXFP4",
}
#: compressed-tensors keeps the global ENCODE scale (weight_global_scale) and decodes with its reciprocal: the NVFP4
#: recipes that have one whose fp32 reciprocal is their decode scale (te, sol, the te-4over6 family)
_CT_RECIPES = tuple(r.value for r in _S_ENC_RECIPES)

#: Default --ignore patterns (re.search on the tensor name) for the serving formats: layers the serving stacks keep
#: in high precision.
DEFAULT_IGNORE = (
    r"(^|\.)lm_head\.",                     # output projection
    r"embed|(^|\.)(wte|wpe)\.",             # token / position embeddings
    r"norm|(^|\.)ln_",                      # RMSNorm / LayerNorm weights
    r"(^|\.)(router|gate)\.",               # MoE router (mlp.gate.weight; not gate_proj)
    r"(^|\.)(vision_tower|vision_model|visual|vision|multi_modal_projector|mm_projector|audio_tower)\.",
)

#: Fused layers: (regex with a group 'p' (prefix) and 'm' (member), fused-group suffix). Members of one group
#: share one global scale (vLLM / TensorRT-LLM fuse them into one GEMM with a single weight global scale).
FUSED_GROUPS = (
    (re.compile(r"^(?P<p>.*\.)(?P<m>q_proj|k_proj|v_proj)\.weight$"), "qkv"),
    (re.compile(r"^(?P<p>.*\.)(?P<m>gate_proj|up_proj)\.weight$"), "gate_up"),
    (re.compile(r"^(?P<p>.*\.)(?P<m>w1|w3)\.weight$"), "w13"),
)

_QUANTIZABLE = ("F16", "BF16", "F32")
#: architectures (config.json "architectures") whose 3-D expert tensors are [experts, in, out] (ModelOpt's export
#: transposes them: maybe_transpose_expert_weight_dimensions); fp4ref copies them instead of blocking the wrong axis.
_IN_OUT_EXPERTS = ("Llama4", "GptOss")
# input elements per row chunk: bounds every worker's buffers (NVFP4 te/sol/modelopt: the input's bytes, ~0.6 of
# output and ~3.5 MiB of scratch; other recipes and MX about 40 bytes per element)
_CHUNK_ELEMS = 1 << 21
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


class QuantizeFileError(CheckpointError):
    """A bad input to quantize / dequantize (nothing was written). A ValueError."""


@dataclass
class TensorReport:
    """One line of the per-tensor table.

    Attributes: name; shape (of the original tensor); dtype (safetensors dtype string); action ("quantized",
    "dequantized" or "copied"); reason (why a tensor was copied); sqnr_db (10 log10(sum x^2 / sum (x - x_hat)^2),
    float64; inf when x_hat == x); max_abs_err; zero_blocks (blocks whose amax is 0); lost_blocks (NVFP4 blocks
    whose block scale rounded to 0 while their codes did not: their values decode to 0, which fp4ref audit reports
    as zero-scale-codes; te / sol / te-4over6 do this to a block far below the tensor amax); seconds; fmt; extra;
    padded_to (the stored K where ``pad=True`` zero-padded the original K to a multiple of the block, else 0).
    A dry run's "quantized" reports are a plan made from the headers (values not read): sqnr_db, max_abs_err and
    seconds are NaN (not measured).
    """

    name: str
    shape: tuple
    dtype: str
    action: str
    reason: str = ""
    sqnr_db: float = math.nan
    max_abs_err: float = math.nan
    zero_blocks: int = 0
    lost_blocks: int = 0
    seconds: float = 0.0
    fmt: str = ""
    extra: dict = field(default_factory=dict)
    padded_to: int = 0


# ------------------------------------------------------------------------------------------------------ naming


def output_names(checkpoint_format: str, fmt: str, name: str) -> dict:
    """Output tensor names for quantized tensor ``name``: {"codes", "scale"[, "global"]} (see the module doc)."""
    if checkpoint_format == "fp4ref":
        out = {"codes": name, "scale": name + "_scale"}
        if fmt == "nvfp4":
            out["global"] = name + "_scale_2"
        return out
    if not name.endswith(".weight"):
        if checkpoint_format != "modelopt":
            raise ValueError(f"compressed-tensors names only X.weight tensors, got {name!r}")
        # a parameter P not named weight: ModelOpt's export keeps the codes in P itself and registers the scales
        # with the prefix "P_" (quantizer_attr_names: P_weight_scale, P_weight_scale_2)
        out = {"codes": name, "scale": name + "_weight_scale"}
        if fmt == "nvfp4":
            out["global"] = name + "_weight_scale_2"
        return out
    base = name[: -len("weight")]
    if checkpoint_format == "modelopt":
        out = {"codes": base + "weight", "scale": base + "weight_scale"}
        if fmt == "nvfp4":
            out["global"] = base + "weight_scale_2"
        return out
    out = {"codes": base + ("weight" if fmt == "mxfp8" else "weight_packed"), "scale": base + "weight_scale"}
    if fmt == "nvfp4":
        out["global"] = base + "weight_global_scale"
    return out


def _fused_key(name: str):
    for rx, suffix in FUSED_GROUPS:
        m = rx.match(name)
        if m:
            return m.group("p") + suffix
    return None


# ------------------------------------------------------------------------------------------------------ plan


@dataclass
class Item:
    """One input tensor's fate: quantized (``reason`` empty; ``group`` its fused group or None, ``k_padded`` the
    stored K, ``outputs`` (role, name, dtype, shape, nbytes) of its codes / scale / global tensors) or copied
    (``reason`` says why)."""

    name: str
    shard: str
    dtype: str
    shape: tuple
    nbytes: int
    reason: str = ""
    group: str | None = None
    k_padded: int = 0
    outputs: list = field(default_factory=list)  # (role, name, dtype, shape, nbytes)

    @property
    def quantized(self) -> bool:
        return not self.reason


@dataclass
class Target:
    """A resolved output choice (:func:`resolve_target`): layout, format, block, MX element, recipe or mode."""

    checkpoint_format: str
    fmt: str
    block: int
    elem: str | None
    recipe: NVFP4Recipe | None
    mode: MXMode | None

    @property
    def option(self) -> str:
        return self.recipe.value if self.recipe is not None else self.mode.value


def _choice(value, names, arg: str, flag: str) -> str:
    """``value`` (a str, any case) as the one of ``names`` it spells. TypeError for a value that is not a str,
    QuantizeFileError for another name; both name the argument and its CLI option and list ``names``."""
    if not isinstance(value, str):
        raise TypeError(f"{arg}={value!r} ({flag}): expected one of {list(names)} (a str, any case), got "
                        f"{type(value).__name__}")
    if value.lower() not in names:
        raise QuantizeFileError(f"{arg}={value!r} ({flag}) is not one of {list(names)}")
    return value.lower()


def resolve_target(checkpoint_format: str = "fp4ref", fmt: str = "nvfp4", recipe=None, mode=None) -> Target:
    """Check the format choices and fill in the defaults (:data:`LAYOUTS`). ``checkpoint_format`` and ``fmt`` are
    names of :data:`CHECKPOINT_FORMATS` and :data:`FORMATS` in any case (``"NVFP4"``, ``"ModelOpt"``), as are
    ``recipe`` and ``mode``; the :class:`Target` holds them in lower case.

    Raises:
        TypeError: ``checkpoint_format`` / ``fmt`` not a str, ``recipe`` / ``mode`` neither a str nor an
        :class:`NVFP4Recipe` / :class:`MXMode` (the messages list the names). QuantizeFileError: unknown names
        (listed), a recipe with an MX format or a mode with nvfp4, an unsupported pair.
    """
    checkpoint_format = _choice(checkpoint_format, CHECKPOINT_FORMATS, "checkpoint_format", "--checkpoint-format")
    fmt = _choice(fmt, FORMATS, "fmt", "--format")
    if fmt == "nvfp4" and mode is not None:
        raise QuantizeFileError(f"mode={mode!r} (--mode) applies to mxfp4/mxfp8, not nvfp4 (nvfp4 takes a recipe)")
    if fmt != "nvfp4" and recipe is not None:
        raise QuantizeFileError(f"recipe={recipe!r} (--recipe) applies to nvfp4, not {fmt} ({fmt} takes a mode)")
    if (checkpoint_format, fmt) in _UNSUPPORTED:
        raise QuantizeFileError(_UNSUPPORTED[(checkpoint_format, fmt)])
    default = LAYOUTS[(checkpoint_format, fmt)]
    block, elem = FORMATS[fmt]
    try:
        rec = _parse_recipe(default if recipe is None else recipe, "--recipe") if fmt == "nvfp4" else None
        md = _parse_mode(default if mode is None else mode, "--mode") if fmt != "nvfp4" else None
    except ValueError as e:  # an unknown name; a value that is not a str stays a TypeError
        raise QuantizeFileError(str(e)) from None
    if checkpoint_format == "compressed-tensors" and rec is not None and rec.value not in _CT_RECIPES:
        raise QuantizeFileError(
            f"recipe={rec.value!r} (--recipe) cannot be stored in compressed-tensors, which keeps a global ENCODE "
            "scale (weight_global_scale) and decodes with its reciprocal; this recipe has no such scale (its decode "
            f"scale is amax / 2688, or none): use one of {list(_CT_RECIPES)} (encode scale 2688 or 1536 / amax)"
        )
    return Target(checkpoint_format, fmt, block, elem, rec, md)


def _check_patterns(include, ignore) -> None:
    """Type checks of plan_quantize's ``include`` (a str or None) and ``ignore`` (a list or tuple of str, or
    None): a bare str for ``ignore`` would otherwise be read one character per pattern."""
    if include is not None and not isinstance(include, str):
        raise TypeError(f"include={include!r}: expected a regular expression (str) or None, got "
                        f"{type(include).__name__}")
    if ignore is not None and (not isinstance(ignore, (list, tuple)) or not all(isinstance(p, str) for p in ignore)):
        hint = f" (one pattern: ignore=[{ignore!r}])" if isinstance(ignore, str) else ""
        raise TypeError(f"ignore={ignore!r}: expected a list or tuple of regular expressions (str) or None{hint}")


def _check_flags(**flags) -> None:
    """TypeError naming the first of ``flags`` that is not a bool (a str such as "no" would read as true; a numpy
    bool is refused too, by its full type name)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            kind = type(value)
            raise TypeError(f"{name}={value!r}: expected True or False (a Python bool), got "
                            f"{kind.__module__ + '.' if kind.__module__ != 'builtins' else ''}{kind.__name__}")


def _check_jobs(jobs) -> int:
    """``jobs`` (--jobs) as an int >= 1: TypeError for a non-integer (bool, float, str), QuantizeFileError (a
    ValueError) for an integer < 1; numpy integers are read as ints."""
    if not is_int(jobs):
        raise TypeError(f"jobs={jobs!r} (--jobs): expected an integer >= 1, got {type(jobs).__name__}")
    if jobs < 1:
        raise QuantizeFileError(f"jobs={jobs!r} (--jobs): expected an integer >= 1")
    return int(jobs)


def _compile(patterns, arg: str, flag: str):
    """The compiled ``patterns``; QuantizeFileError naming the argument (``arg``, the message's prefix: "include=")
    and its CLI option ``flag`` for one that is not a regular expression."""
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except re.error as e:
            raise QuantizeFileError(f"{arg}{p!r} ({flag}) is not a valid regular expression: {e}") from None
    return out


def _already_quantized(ckpt: Checkpoint) -> str:
    for s in ckpt.shards:
        if "fp4ref.format" in s.metadata:
            return f"fp4ref.format={s.metadata['fp4ref.format']!r} in {s.path.name}"
    if ckpt.config and "quantization_config" in ckpt.config:
        qc = ckpt.config["quantization_config"]
        return f"config.json has a quantization_config ({qc.get('quant_method', '?') if isinstance(qc, dict) else qc})"
    if "hf_quant_config.json" in ckpt.json_files:
        return "hf_quant_config.json is present"
    # without metadata or config files (a shard copied on its own): a block-scale tensor, E4M3 (NVFP4) or UE8M0
    # bytes (MX), marks its layer as quantized: named *weight_scale (the serving layouts), or X_scale beside codes X
    # (U8 or F8_E4M3, the same leading dimensions: fp4ref's layout, whose names need not hold "weight")
    infos = {name: t for s in ckpt.shards for name, t in s.tensors.items()}
    for name, t in infos.items():
        if t.dtype not in ("F8_E4M3", "U8") or len(t.shape) < 2:
            continue
        codes = infos.get(name[: -len("_scale")]) if name.endswith("_scale") else None
        if name.endswith("weight_scale") or (codes is not None and codes.dtype in ("U8", "F8_E4M3")
                                             and list(codes.shape[:-1]) == list(t.shape[:-1])):
            return f"{name} ({t.dtype} {list(t.shape)}) is the block-scale tensor of a quantized layer"
    return ""


def plan_quantize(ckpt: Checkpoint, target: Target, *, include=None, ignore=None, pad: bool = False) -> list:
    """Decide, for every tensor of ``ckpt``, whether it is quantized (and its output tensors) or copied (and why).

    Args:
        include: regular expression; only tensors whose name matches (re.search) are quantized.
        ignore: regular expressions; matching tensors are copied (default :data:`DEFAULT_IGNORE` for the serving
            formats, none for fp4ref's).
        pad: zero-pad K to a multiple of the block (fp4ref's layout only).

    Returns:
        list of :class:`Item`, sorted by name.

    Raises:
        TypeError: ``include`` not a str, ``ignore`` not a list or tuple of str, ``pad`` not a bool.
        QuantizeFileError: bad regex, ``include`` matching nothing, nothing eligible, an output name colliding with an
        input tensor, a fused group only partly quantized (serving formats), an already-quantized checkpoint.
    """
    _check_patterns(include, ignore)
    _check_flags(pad=pad)
    done = _already_quantized(ckpt)
    if done:
        raise QuantizeFileError(f"{str(ckpt.root if ckpt.kind != 'file' else ckpt.shards[0].path)!r} is already "
                                f"quantized ({done}); quantizing packed codes again would destroy them: "
                                "dequantize it first (dequantize_checkpoint; fp4ref quantize --dequantize)")
    serving = target.checkpoint_format != "fp4ref"
    inc = _compile([include], "include=", "--include")[0] if include is not None else None
    if ignore is None:
        ignore = DEFAULT_IGNORE if serving else ()
    ign = list(zip(ignore, _compile(ignore, "ignore pattern ", "--ignore")))
    names = sorted(ckpt.weight_map)
    arch = " ".join((ckpt.config or {}).get("architectures") or [])
    transposed = next((a for a in _IN_OUT_EXPERTS if a in arch), None)
    if inc is not None and not any(inc.search(n) for n in names):
        raise QuantizeFileError(f"include={include!r} (--include) matches none of the {len(names)} tensor names in "
                                f"{_where(ckpt)!r}")
    items = []
    for n in names:
        info = ckpt.shard_of(n).tensors[n]
        it = Item(n, ckpt.weight_map[n], info.dtype, info.shape, info.nbytes)
        it.reason = _eligibility(it, target, inc, ign, pad)
        if not it.reason and len(it.shape) == 3 and transposed:
            it.reason = (f"3-D expert tensor of {transposed}, stored [experts, in, out]: the blocks would run along "
                         "the output axis (ModelOpt transposes these first; fp4ref does not)")
        if not it.reason:
            k = info.shape[-1]
            it.k_padded = -(-k // target.block) * target.block
            it.group = _fused_key(n)
            it.outputs = _outputs(it, target)
        items.append(it)
    if not items:
        raise QuantizeFileError(f"{_where(ckpt)!r} holds no tensors")
    if all(it.reason for it in items):
        reasons = "; ".join(f"{it.name}: {it.reason}" for it in items[:5])
        hint = ""
        if not pad and target.checkpoint_format == "fp4ref":  # --pad exists for fp4ref's layout only
            padded = [it for it in items if not _eligibility(it, target, inc, ign, pad=True)
                      and not (len(it.shape) == 3 and transposed)]
            if padded:
                hint = (f"; pass --pad (in Python: pad=True) to zero-pad K to a multiple of {target.block}: "
                        f"{len(padded)} tensor(s) would be quantized then (e.g. {padded[0].name!r})")
        raise QuantizeFileError(f"no tensor of {_where(ckpt)!r} can be quantized to {target.fmt} ({reasons}"
                                f"{'; ...' if len(items) > 5 else ''}){hint}")
    by_name = {it.name: it for it in items}
    for it in items:
        for role, out, *_ in it.outputs:
            if out != it.name and out in by_name:
                raise QuantizeFileError(
                    f"output name {out!r} for quantized tensor {it.name!r} collides with an input tensor of that name "
                    f"(which would be copied to the output too); rename one of them, or keep {it.name!r} unquantized "
                    "with an include / ignore (--include / --ignore) that leaves it out"
                )
    experts = {}  # fused group -> {expert count: a member}: the members share one global scale per expert
    for it in items:
        if it.quantized and it.group is not None:
            experts.setdefault(it.group, {}).setdefault(it.shape[0] if len(it.shape) == 3 else 1, it.name)
    for key, counts in experts.items():
        if len(counts) > 1:
            held = ", ".join(f"{n} ({c} expert(s))" for c, n in sorted(counts.items()))
            raise QuantizeFileError(
                f"fused layer {key}: its members share one global scale per expert but hold different expert "
                f"counts ({held}); leave them out with ignore (--ignore), or store them with the same leading "
                "dimension")
    if serving:
        groups = {}
        for n in names:
            key = _fused_key(n)
            if key is not None:
                groups.setdefault(key, []).append(by_name[n])
        for key, members in groups.items():
            q = [m.name for m in members if m.quantized]
            if q and len(q) != len(members):
                left = [f"{m.name} ({m.reason})" for m in members if not m.quantized]
                raise QuantizeFileError(
                    f"fused layer {key}: {', '.join(q)} would be quantized but {', '.join(left)} would not; serving "
                    "stacks fuse these into one GEMM, so quantize all of them or none (adjust include / ignore: "
                    "--include / --ignore)"
                )
    if target.checkpoint_format == "modelopt":
        # ModelOpt's exclude_modules entries are patterns (its loaders match * and [...]): a module left unquantized
        # whose name holds one would exclude other layers too
        left = _unquantized_modules(items)
        odd = [m for m in left if any(c in m for c in "*?[]")]
        if odd:
            why = left[odd[0]]
            chosen = why.startswith(("ignored", "excluded"))  # left out by include / ignore, not by its shape
            raise QuantizeFileError(
                f"module {odd[0]!r} stays unquantized ({why}) but its name holds a pattern character (*, ?, [ or ]): "
                "ModelOpt's exclude_modules is read as patterns, so it would also exclude other layers; use the "
                "compressed-tensors layout (its ignore list names modules exactly)"
                + (", or quantize it too (--include / --ignore)" if chosen else ""))
    return items


def _group_amax(pairs) -> dict:
    """(fused group or None, per-expert amax list) pairs -> group -> the per-expert max over its members (one
    global scale per expert, shared by the group; plan_quantize has checked that the members' expert counts agree)."""
    out = {}
    for key, amax in pairs:
        if key is not None:
            prev = out.get(key)
            out[key] = list(amax) if prev is None else [max(p, a) for p, a in zip(prev, amax)]
    return out


def _where(ckpt: Checkpoint) -> str:
    return str(ckpt.shards[0].path) if ckpt.kind == "file" else str(ckpt.root)


def _eligibility(it: Item, target: Target, inc, ign, pad: bool = False) -> str:
    """'' if the tensor is quantized, else the reason it is copied."""
    if inc is not None and not inc.search(it.name):
        return "excluded by --include"
    for pat, rx in ign:
        if rx.search(it.name):
            return f"ignored ({pat})"
    if it.dtype not in _QUANTIZABLE:
        return f"dtype {it.dtype} (quantized: {', '.join(_QUANTIZABLE)})"
    nd = len(it.shape)
    if nd not in (2, 3):
        return f"{nd}-D (quantized: 2-D, and 3-D per leading index)"
    serving = target.checkpoint_format != "fp4ref"
    if nd == 3 and target.checkpoint_format == "compressed-tensors":
        return "3-D (compressed-tensors names per-expert Linear layers X.weight only)"
    if nd == 3 and serving and "expert" not in it.name:
        return "3-D but not an expert tensor (its name lacks 'expert')"
    if nd == 2 and serving and not it.name.endswith(".weight"):
        return "not a Linear weight (name does not end in .weight)"
    k = it.shape[-1]
    if k == 0 or (k % target.block and not pad):
        return f"K={k} is not a positive multiple of {target.block}"
    if int(np.prod(it.shape[:-1], dtype=np.int64)) == 0:
        return "empty (0 rows)"
    return ""


def _outputs(it: Item, target: Target) -> list:
    names = output_names(target.checkpoint_format, target.fmt, it.name)
    lead, kp = it.shape[:-1], it.k_padded
    rows = int(np.prod(lead, dtype=np.int64))
    codes_dt, scale_dt = _STORED_DTYPES[target.fmt]
    kc = kp if target.fmt == "mxfp8" else kp // 2  # codes bytes per row: one per element, or two E2M1 per byte
    nb = kp // target.block
    out = [("codes", names["codes"], codes_dt, lead + (kc,), rows * kc),
           ("scale", names["scale"], scale_dt, lead + (nb,), rows * nb)]
    if target.fmt == "nvfp4":
        if target.checkpoint_format == "compressed-tensors":
            gshape = (1,)
        else:
            gshape = (it.shape[0],) if len(it.shape) == 3 else ()
        out.append(("global", names["global"], "F32", gshape, 4 * int(np.prod(gshape, dtype=np.int64))))
    return out


# ------------------------------------------------------------------------------------------------------ workers

_SHARDS: dict = {}


def _shard(path: str) -> Shard:
    """The opened shard at ``path``, cached per process (keyed by path, size and mtime: a rewritten file is
    opened again)."""
    try:
        st = os.stat(path)
        key = (path, st.st_size, st.st_mtime_ns)
    except OSError:
        key = (path, None, None)
    s = _SHARDS.get(key)
    if s is None:
        if len(_SHARDS) > 64:
            _SHARDS.clear()
        s = _SHARDS[key] = Shard(path)
    return s


def _row_step(k: int) -> int:
    return max(1, _CHUNK_ELEMS // max(k, 1))


@dataclass
class _AmaxTask:
    path: str
    name: str
    shape: tuple
    nbytes: int


#: quantizable safetensors dtype -> (unsigned type of its width, |x| bit mask, bits of +inf): for IEEE bit patterns
#: with the sign cleared, integer order is value order and every NaN/inf pattern is >= the inf one.
_ABS_BITS = {"F32": (np.uint32, 0x7FFFFFFF, 0x7F800000), "F16": (np.uint16, 0x7FFF, 0x7C00),
             "BF16": (np.uint16, 0x7FFF, 0x7F80)}


def _amax_task(t: _AmaxTask):
    """Per-expert (3-D) or whole-tensor amax (float32) and the count of non-finite values. Works on the bit
    patterns (one mask and one integer max per chunk, no float32 copy); a chunk holding NaN/inf adds its count and
    nothing to the amax (the tensor is refused then)."""
    s = _shard(t.path)
    dtype = s.tensors[t.name].dtype
    if dtype not in _ABS_BITS:
        raise ValueError(f"tensor {t.name!r} has dtype {dtype}; quantizable: {sorted(_ABS_BITS)}")
    uint, mask, inf = _ABS_BITS[dtype]
    k = t.shape[-1]
    experts = t.shape[0] if len(t.shape) == 3 else 1
    n = int(np.prod(t.shape[:-1], dtype=np.int64)) // experts
    amax = []
    bad = 0
    for e in range(experts):
        a = uint(0)
        for r0 in range(0, n, _row_step(k)):
            r1 = min(n, r0 + _row_step(k))
            x = s.read_rows(t.name, e * n + r0, e * n + r1)
            if not x.size:
                continue
            bits = x.view(uint) & uint(mask)
            top = bits.max()
            if top >= inf:
                bad += int(np.count_nonzero(bits >= uint(inf)))
                continue
            a = max(a, top)
        # the largest |x| of the expert, widened exactly to float32 (its bits, read as the tensor's dtype)
        amax.append(np.float32(np.array([a], dtype=uint).view(x.dtype)[0]) if n else np.float32(0.0))
    return amax, bad


@dataclass
class _QuantTask:
    path: str
    name: str
    shape: tuple
    nbytes: int
    out_path: str
    offsets: dict  # role -> absolute offset
    checkpoint_format: str
    fmt: str
    block: int
    elem: str | None
    option: str
    k_padded: int
    amax: list  # per expert


def _ct_encode_scale(recipe: str, amax: np.float32) -> np.float32:
    """compressed-tensors' weight_global_scale for a recipe of :data:`_CT_RECIPES`: its S_enc = min(6 * E4M3 max
    / A, FLT_MAX) (2688 / A; 1536 / A for the -256 recipes), 1 when that is 0 (NVFP4Recipe.TE), whose fp32
    reciprocal is the recipe's stored decode scale."""
    return _global_scales(_parse_recipe(recipe), np.float32(amax))["s_enc"]


def quantized_chunks(t: _QuantTask):
    """Quantize tensor ``t.name`` in row chunks (the recipe or mode in ``t.option``, the global amax per expert in
    ``t.amax``). Yields ("rows", first row, codes, scales, stats) per chunk, stats the chunk's error statistics
    (sum x^2, sum (x - x_hat)^2, max |x - x_hat|, all-zero blocks; x_hat the float32 dequantized value), and
    ("global", expert, stored global scale float32) after each expert (nvfp4 only; the layout's direction)."""
    s = _shard(t.path)
    k, kp = t.shape[-1], t.k_padded
    experts = t.shape[0] if len(t.shape) == 3 else 1
    n = int(np.prod(t.shape[:-1], dtype=np.int64)) // experts
    step = _row_step(kp)
    for e in range(experts):
        g_expected = None
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            x = s.read_rows(t.name, e * n + r0, e * n + r1)  # float16 / bfloat16 / float32, widened exactly below
            src = x.dtype
            if kp != k:
                x = np.concatenate([x.astype(np.float32), np.zeros((r1 - r0, kp - k), np.float32)], axis=1)
            if t.fmt == "nvfp4":
                codes, scales, g, stats = _nvfp4_quantize_stats(x, t.option, t.amax[e])
                if g_expected is None:
                    g_expected = g
            else:
                x = x.astype(np.float32, copy=False)
                q = mx_quantize(x, t.elem, mode=t.option, block=t.block)
                codes = pack_fp4(q.codes) if t.elem == "e2m1" else q.codes
                scales = q.scales
                xh = mx_dequantize(q)
                stats = _error_stats(x, xh, t.block)
                # modes other than floor round the block scale up: near the top of x's dtype, code x scale can pass
                # its largest finite value (2^128 for float32 / bfloat16, 2^16 for float16): counted, then refused
                with np.errstate(over="ignore"):
                    stats = stats._replace(overflows=int(np.count_nonzero(np.isinf(xh.astype(src, copy=False)))))
            yield "rows", e * n + r0, codes, scales, stats
        if t.fmt == "nvfp4":
            if t.checkpoint_format == "compressed-tensors":
                enc = _ct_encode_scale(t.option, t.amax[e])
                if np.float32(np.float32(1.0) / enc) != g_expected:  # the recipe's decode scale is 1 / enc in fp32
                    raise AssertionError(f"{t.name}: decode scale {g_expected!r} is not 1/{enc!r}")
                yield "global", e, enc
            else:
                yield "global", e, g_expected


def _quant_task(t: _QuantTask):
    """Quantize one tensor in row chunks, writing codes / scales / global scale at their offsets; returns stats."""
    t0 = time.perf_counter()
    kp = t.k_padded
    ccols = kp if t.fmt == "mxfp8" else kp // 2
    scols = kp // t.block
    num = den = 0.0
    maxerr = 0.0
    zero_blocks = overflows = lost_blocks = 0
    globals_ = []
    for part in quantized_chunks(t):
        if part[0] == "global":
            globals_.append(part[2])
            continue
        _, row0, codes, scales, st = part
        write_at(t.out_path, t.offsets["codes"] + row0 * ccols, codes)
        write_at(t.out_path, t.offsets["scale"] + row0 * scols, scales)
        # padded columns (--pad) are zeros, quantized to zero: they add nothing to the sums or the max error
        num += st.sum_sq
        den += st.sum_err_sq
        maxerr = max(maxerr, st.max_abs_err)
        zero_blocks += st.zero_blocks
        overflows += st.overflows
        # a block scale rounded to 0 (E4M3 underflow) over non-zero codes: values that decode to 0
        lost_blocks += zero_scale_blocks(element_codes(codes.reshape(codes.shape[0], -1), t.fmt), scales, t.fmt)
    if overflows:
        dt = DTYPES[_shard(t.path).tensors[t.name].dtype].name  # float16, bfloat16 or float32
        top = "2^16" if dt == "float16" else "2^128"
        raise QuantizeFileError(
            f"tensor {t.name!r}: with mode={t.option!r} (--mode), {overflows} value(s) near the {dt} maximum "
            f"quantize to {t.fmt} code x scale >= {top}, past the {dt} range, which decodes to inf in {dt}; quantize "
            "it with mode='floor' (--mode floor; the OCP rule, whose decoded values stay in range) or leave it out "
            "with ignore (--ignore)")
    if t.fmt == "nvfp4":
        write_at(t.out_path, t.offsets["global"], np.asarray(globals_, dtype=np.float32))
    if den == 0:
        sqnr = math.inf
    elif num == 0:
        sqnr = -math.inf
    else:
        sqnr = 10.0 * math.log10(num / den)
    return {"sqnr_db": sqnr, "max_abs_err": maxerr, "zero_blocks": zero_blocks, "lost_blocks": lost_blocks,
            "seconds": time.perf_counter() - t0}


@dataclass
class _CopyTask:
    path: str
    name: str
    nbytes: int
    out_path: str
    offset: int


def _copy_task(t: _CopyTask):
    s = _shard(t.path)
    step = 16 << 20  # bytes per copy chunk
    for b0 in range(0, t.nbytes, step):
        b1 = min(t.nbytes, b0 + step)
        write_at(t.out_path, t.offset + b0, s.read_bytes(t.name, b0, b1))
    return {}


class Workers:
    """Up to ``jobs`` worker processes (concurrent.futures), or none for ``jobs == 1``: at most one per CPU and one
    per task (``tasks``), so a large ``jobs`` cannot start more processes than can work. On Linux they are forked
    when the pool is made (before any progress thread starts), so they start at once with the modules already
    imported; elsewhere they are spawned. Workers ignore SIGINT (Ctrl-C is the parent's to handle: cancel, clean
    up) and SIGTERM (GNU timeout signals the whole process group), and on Linux are killed when the parent dies, even
    by SIGKILL."""

    def __init__(self, jobs: int, tasks: int):
        jobs = max(1, min(jobs, os.cpu_count() or 1, tasks))
        self.jobs = jobs
        self.ex = None
        if jobs > 1:
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            self.ex = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context(method),
                                          initializer=_worker_init, initargs=(os.getpid(),))
            self.ex.submit(_noop).result()  # start the workers now

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.ex is not None:
            self.ex.shutdown(wait=True, cancel_futures=True)
        return False

    def run(self, fn_tasks, progress, phase: str) -> list:
        """Run (fn, task) pairs; results in task order. Largest tasks start first. On any exception
        (KeyboardInterrupt included) pending tasks are cancelled and running ones finish before it propagates."""
        order = sorted(range(len(fn_tasks)), key=lambda i: -fn_tasks[i][1].nbytes)
        results = [None] * len(fn_tasks)
        progress.phase(phase, sum(t.nbytes for _, t in fn_tasks))
        if self.ex is None or len(fn_tasks) <= 1:
            for i in order:
                fn, t = fn_tasks[i]
                results[i] = fn(t)
                progress.advance(t.nbytes, t.name)
            return results
        try:
            futs = {self.ex.submit(fn_tasks[i][0], fn_tasks[i][1]): i for i in order}
            for f in as_completed(futs):
                i = futs[f]
                results[i] = f.result()
                progress.advance(fn_tasks[i][1].nbytes, fn_tasks[i][1].name)
        except BaseException:
            self.ex.shutdown(wait=True, cancel_futures=True)
            raise
        return results


def _noop():
    return None


def _worker_init(parent: int):
    # stopping is the parent's: a signal to the whole process group (Ctrl-C, GNU timeout) must not end a worker
    # half-way through a task, which would break the pool while the parent cleans up
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform.startswith("linux"):  # die with the parent (PR_SET_PDEATHSIG = 1), however it ends
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)


# ------------------------------------------------------------------------------------------------------ progress


class Progress:
    """Progress over bytes: a rich bar on a terminal; otherwise (``plain``) one line on stderr per 10% and at the
    end of each phase. ``enabled=False`` shows nothing."""

    def __init__(self, enabled: bool, label: str = "quantize", stream=None):
        self.enabled = enabled
        self.label = label
        self.stream = stream or sys.stderr
        self._bar = None
        self._task = None
        self.total = self.done = 0
        self._next = 0.0
        self._phase = ""
        if enabled and getattr(self.stream, "isatty", lambda: False)():
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress as RichProgress, TextColumn, \
                TimeElapsedColumn

            # (markup off: the description holds a tensor name, text that may contain "[...]")
            self._bar = RichProgress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(),
                                     DownloadColumn(), TimeElapsedColumn(), console=Console(file=self.stream),
                                     transient=True)

    def __enter__(self):
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False

    def phase(self, name: str, total: int) -> None:
        self._phase, self.total, self.done, self._next = name, max(total, 1), 0, 0.1
        if self._bar is not None:
            if self._task is not None:
                self._bar.remove_task(self._task)
            self._task = self._bar.add_task(name, total=self.total)

    def advance(self, nbytes: int, name: str) -> None:
        if not self.enabled:
            return
        self.done += nbytes
        if self._bar is not None:
            self._bar.update(self._task, advance=nbytes, description=_shown_name(f"{self._phase} {name[-40:]}"))
            return
        frac = self.done / self.total
        if frac >= self._next or self.done >= self.total:
            unit, scale = ("MiB", 2**20) if self.total >= 2**20 else ("KiB", 2**10)  # no "0.0 / 0.0 MiB"
            print(f"fp4ref {self.label}: {self._phase} {100 * frac:5.1f}% ({self.done / scale:.1f} / "
                  f"{self.total / scale:.1f} {unit}) {_shown_name(name)}", file=self.stream, flush=True)
            while self._next <= frac:
                self._next += 0.1


# ------------------------------------------------------------------------------------------------------ quantize


def _out_is_dir(ckpt: Checkpoint, out_path) -> bool:
    """Whether the output is a directory: always for a sharded checkpoint or a model directory (an output name
    ending in ``.safetensors`` is refused there, as it would be a directory of that name, unless a trailing path
    separator asks for a directory); for one input file unless ``out_path`` ends in ``.safetensors`` (not in a
    path separator: ``out.safetensors/`` is a directory)."""
    if ends_in_separator(out_path):  # asks for a directory
        return True
    out = Path(out_path)
    if ckpt.kind != "file" and out.name.endswith(".safetensors"):
        what = "model directory" if ckpt.kind == "directory" else "sharded checkpoint"
        raise QuantizeFileError(f"the input is a {what}, so the output is a directory of shards: give the output a "
                                f"directory name, not {str(out)!r} (or end it in {os.sep!r} to keep that name)")
    return ckpt.kind != "file" or not out.name.endswith(".safetensors")


def quantize_checkpoint(in_path, out_path, *, fmt: str = "nvfp4", checkpoint_format: str = "fp4ref", recipe=None,
                        mode=None, include=None, ignore=None, jobs: int = 1, force: bool = False,
                        progress: bool = False, dry_run: bool = False, pad: bool = False) -> list:
    """Quantize a checkpoint (see the module docstring) into ``out_path``.

    Args:
        in_path: a ``.safetensors`` file, a ``*.safetensors.index.json`` or a model directory.
        out_path: the output; a directory unless the input is one file and ``out_path`` ends in ``.safetensors``
            (fp4ref format only: the serving formats need their config files beside the shards). A str ending in
            a path separator (``"out.safetensors/"``) is a directory whatever its name.
        fmt: ``"nvfp4"``, ``"mxfp4"`` or ``"mxfp8"``. checkpoint_format: one of :data:`CHECKPOINT_FORMATS`. Both
            in any case (``"NVFP4"``, ``"ModelOpt"``).
        recipe / mode: NVFP4 recipe / MX mode (default per :data:`LAYOUTS`), names in any case.
        include, ignore: see :func:`plan_quantize`.
        jobs: worker processes (>= 1); the output bytes do not depend on it.
        force: replace an existing output (only after the new one is complete).
        progress: show progress on stderr. dry_run: plan only, write nothing; with ``out_path`` the output is
            checked as the run would check it with ``force`` (an existing one is not an error here). The plan
            reads the headers only, not the tensor values: a weight holding NaN/inf is planned as quantized, and
            only the real run refuses it.
        pad: zero-pad K to a multiple of the block instead of copying such tensors (fp4ref's layout only).

    Returns:
        one :class:`TensorReport` per input tensor, sorted by name.

    Raises:
        TypeError: a path, ``fmt``, ``checkpoint_format``, ``include``, ``ignore``, ``recipe``, ``mode``, ``jobs``
        or flag of the wrong type. QuantizeFileError / CheckpointError (ValueErrors): bad arguments or input
        (nothing is written then), e.g. an unknown ``fmt`` or ``recipe`` name (the names are listed), ``jobs`` < 1;
        a non-finite weight, or one that an MX mode other than floor stores past its own dtype's range (inf there),
        named. KeyboardInterrupt propagates after the partial output was removed.
    """
    return _quantize_checkpoint(in_path, out_path, fmt=fmt, checkpoint_format=checkpoint_format, recipe=recipe,
                                mode=mode, include=include, ignore=ignore, jobs=jobs, force=force, progress=progress,
                                dry_run=dry_run, pad=pad)[0]


def _quantize_checkpoint(in_path, out_path, *, fmt, checkpoint_format, recipe, mode, include, ignore, jobs, force,
                         progress, dry_run, pad) -> tuple:
    """:func:`quantize_checkpoint`'s work: (its reports, the input :class:`Checkpoint` it opened, whose config and
    subdirectories the CLI's notes read without opening the input again)."""
    jobs = _check_jobs(jobs)
    _check_flags(force=force, progress=progress, dry_run=dry_run, pad=pad)  # pad is read below, before the plan
    path_arg(in_path, "input")  # the arguments in their order: a bytes input is named before the output
    if out_path is not None or not dry_run:  # None only for a dry run without an output to check
        path_arg(out_path, "output")
    target = resolve_target(checkpoint_format, fmt, recipe, mode)
    if pad and target.checkpoint_format != "fp4ref":
        raise QuantizeFileError(f"pad=True (--pad) applies to checkpoint_format='fp4ref' only: "
                                f"{target.checkpoint_format}'s export and loaders need K to be a multiple of the "
                                "block")
    ckpt = open_checkpoint(in_path)
    items = plan_quantize(ckpt, target, include=include, ignore=ignore, pad=pad)
    if dry_run and out_path is None:
        return [_report(it, target, planned=True) for it in items], ckpt
    out = Path(out_path)
    is_dir = _out_is_dir(ckpt, out_path)
    if not is_dir and target.checkpoint_format != "fp4ref":
        raise QuantizeFileError(f"checkpoint_format={target.checkpoint_format!r} (--checkpoint-format) writes "
                                f"config files beside the shards: give out_path (-o) a directory (not "
                                f"{str(out)!r})")
    # checked before any work (a dry run too, as if forced: the caller says whether the output exists)
    loc = OutputLocation(out_path, is_dir=is_dir, force=force or dry_run, source=ckpt,
                         names=_output_names(ckpt, target, quantized=True) if is_dir else None)
    if dry_run:
        return [_report(it, target, planned=True) for it in items], ckpt
    with Workers(jobs, len(items)) as pool, Progress(progress, "quantize") as bar:
        # pass 1: amax of every quantized tensor (and the non-finite check) before anything is written
        q_items = [it for it in items if it.quantized]
        amax_tasks = [(_amax_task, _AmaxTask(str(ckpt.shard_of(it.name).path), it.name, it.shape, it.nbytes))
                      for it in q_items]
        amaxes = dict(zip([it.name for it in q_items], pool.run(amax_tasks, bar, "amax")))
        for it in q_items:
            bad = amaxes[it.name][1]
            if bad:
                raise QuantizeFileError(
                    f"tensor {it.name!r} holds {bad} NaN/inf value(s); fp4ref quantize refuses non-finite weights "
                    "(leave the tensor out with include / ignore: --include / --ignore, or fix the checkpoint)"
                )
        group_amax = _group_amax((it.group, amaxes[it.name][0]) for it in q_items)
        with loc.building() as tmp:
            tasks = _write_shards(ckpt, items, target, tmp, amaxes, group_amax)
            results = pool.run(tasks, bar, "write")  # quantized and copied tensors
            _write_side_files(ckpt, items, target, tmp, quantized=True)
            loc.publish(None if is_dir else ckpt.shards[0].path.name)
    stats = {t.name: r for (fn, t), r in zip(tasks, results) if fn is _quant_task}
    reports = []
    for it in items:
        rep = _report(it, target)
        if it.quantized:
            st = stats[it.name]
            rep.sqnr_db, rep.max_abs_err = st["sqnr_db"], st["max_abs_err"]
            rep.zero_blocks, rep.lost_blocks, rep.seconds = st["zero_blocks"], st["lost_blocks"], st["seconds"]
        reports.append(rep)
    return reports, ckpt


def _report(it: Item, target: Target, planned: bool = False) -> TensorReport:
    if it.quantized:  # planned (a dry run): not timed, seconds NaN as the statistics
        return TensorReport(it.name, tuple(it.shape), it.dtype, "quantized", fmt=target.fmt,
                            seconds=math.nan if planned else 0.0, extra={"outputs": [o[1] for o in it.outputs]},
                            padded_to=it.k_padded if it.k_padded != it.shape[-1] else 0)
    return TensorReport(it.name, tuple(it.shape), it.dtype, "copied", reason=it.reason)


def _shard_metadata(shard: Shard, target: Target, qmeta: dict) -> dict:
    meta = {k: str(v) for k, v in shard.metadata.items() if not k.startswith("fp4ref.")}
    meta.update({
        "fp4ref.format": target.fmt,
        "fp4ref.checkpoint_format": target.checkpoint_format,
        "fp4ref.block": str(target.block),
        "fp4ref.tensors": json.dumps(qmeta, separators=(",", ":")),
    })
    meta["fp4ref.recipe" if target.fmt == "nvfp4" else "fp4ref.mode"] = target.option
    return meta


def _write_shards(ckpt: Checkpoint, items: list, target: Target, tmp: Path, amaxes: dict, group_amax: dict) -> list:
    """Lay out every output shard (header written, file sized) and return the tasks that fill them."""
    tasks = []
    for shard in ckpt.shards:
        mine = [it for it in items if it.shard == shard.path.name]
        entries, qmeta = [], {}
        for it in mine:
            if it.quantized:
                entries += [(o[1], o[2], o[3], o[4]) for o in it.outputs]
                qmeta[it.name] = {"shape": list(it.shape), "dtype": it.dtype}
            else:
                entries.append((it.name, it.dtype, it.shape, it.nbytes))
        entries.sort(key=lambda e: e[0])
        out_file = tmp / shard.path.name
        w = ShardWriter(out_file, entries, _shard_metadata(shard, target, qmeta))
        for it in mine:
            if it.quantized:
                amax = amaxes[it.name][0]
                if it.group is not None:
                    amax = group_amax[it.group]
                tasks.append((_quant_task, _QuantTask(
                    str(shard.path), it.name, it.shape, it.nbytes, str(out_file),
                    {o[0]: w.offsets[o[1]] for o in it.outputs}, target.checkpoint_format, target.fmt, target.block,
                    target.elem, target.option, it.k_padded, [float(a) for a in amax])))
            else:
                tasks.append((_copy_task, _CopyTask(str(shard.path), it.name, it.nbytes, str(out_file),
                                                    w.offsets[it.name])))
    return tasks


def _module_of(name: str) -> str:
    return name[: -len(".weight")] if name.endswith(".weight") else name


def _unquantized_modules(items: list) -> dict:
    """{module: why its weight is copied}, sorted by module, for the modules whose 2-D or 3-D ``.weight`` stays
    unquantized: the serving layouts' exclude_modules / ignore entries."""
    left = {_module_of(it.name): it.reason for it in items
            if not it.quantized and len(it.shape) >= 2 and it.name.endswith(".weight")}
    return dict(sorted(left.items()))


def quantization_config(target: Target, items: list) -> tuple:
    """(config.json ``quantization_config``, hf_quant_config.json or None) for the serving formats (see the
    module docstring for the releases followed). ``exclude_modules`` / ``ignore`` list every module with a 2-D or
    3-D weight left unquantized (the loaders treat any Linear not listed there as quantized)."""
    from . import __version__

    skipped = list(_unquantized_modules(items))
    if target.checkpoint_format == "modelopt":
        algo = "W4A16_NVFP4" if target.fmt == "nvfp4" else "MXFP8"
        producer = {"name": "fp4ref", "version": __version__}
        hf = {"producer": producer,
              "quantization": {"quant_algo": algo, "kv_cache_quant_algo": None, "group_size": target.block,
                               "exclude_modules": skipped}}
        qc = {"ignore": skipped, "quant_algo": algo, "producer": producer, "quant_method": "modelopt"}
        if algo == "W4A16_NVFP4":  # ModelOpt's convert_hf_quant_config_format for this algo
            qc["config_groups"] = {"group_0": {"weights": {"dynamic": False, "num_bits": 4, "type": "float",
                                                           "group_size": target.block}, "targets": ["Linear"]}}
        return qc, hf
    fmt_name = {"nvfp4": "nvfp4-pack-quantized", "mxfp4": "mxfp4-pack-quantized", "mxfp8": "mxfp8-quantized"}
    weights = {"num_bits": 8 if target.fmt == "mxfp8" else 4, "type": "float",
               "strategy": "tensor_group" if target.fmt == "nvfp4" else "group", "symmetric": True,
               "dynamic": False, "group_size": target.block,
               "scale_dtype": "torch.float8_e4m3fn" if target.fmt == "nvfp4" else "torch.uint8"}
    qc = {
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                      "output_activations": None, "format": fmt_name[target.fmt]}},
        "format": fmt_name[target.fmt],
        "global_compression_ratio": None,
        "ignore": skipped,
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "version": COMPRESSED_TENSORS_VERSION,
    }
    return qc, None


def _write_json(path: Path, data) -> None:
    with open(path, "x") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def _output_names(ckpt: Checkpoint, target: Target | None, *, quantized: bool) -> set:
    """The file names an output directory of ``ckpt`` holds (``_write_shards`` / the dequantizer's shards and
    ``_write_side_files``): its shards, the index, config.json, hf_quant_config.json and the copied files."""
    names = {s.path.name for s in ckpt.shards} | {f.name for f in ckpt.extra_files}
    if ckpt.has_index:
        names.add(INDEX_NAME)
    serving = quantized and target.checkpoint_format != "fp4ref"
    if ckpt.config is not None or (serving and target.checkpoint_format == "compressed-tensors"):
        names.add("config.json")
    if serving and target.checkpoint_format == "modelopt":
        names.add("hf_quant_config.json")
    return names


def _write_side_files(ckpt: Checkpoint, items: list, target: Target | None, tmp: Path, *, quantized: bool,
                      dtype: str | None = None) -> None:
    """Index (rewritten), config.json (+ quantization config), hf_quant_config.json, the other files (copied)."""
    out_names = {}
    for it in items:
        if quantized and it.quantized:
            for o in it.outputs:
                out_names[o[1]] = it.shard
        else:
            out_names[it.name] = it.shard
    if ckpt.has_index:
        meta = dict(ckpt.index_metadata)
        meta["total_size"] = sum(_data_size(tmp / s.path.name) for s in ckpt.shards)
        _write_json(tmp / INDEX_NAME, {"metadata": meta, "weight_map": dict(sorted(out_names.items()))})
    config = dict(ckpt.config) if ckpt.config is not None else None
    if quantized and target.checkpoint_format != "fp4ref":
        qc, hf = quantization_config(target, items)
        if config is not None or target.checkpoint_format == "compressed-tensors":
            config = config or {}
            config["quantization_config"] = qc
        if hf is not None:
            _write_json(tmp / "hf_quant_config.json", hf)
    elif not quantized and config is not None:
        config.pop("quantization_config", None)
        if dtype is not None:
            key = "dtype" if "dtype" in config and "torch_dtype" not in config else "torch_dtype"
            config[key] = dtype
    if config is not None:
        _write_json(tmp / "config.json", config)
    for f in ckpt.extra_files:
        shutil.copyfile(f, tmp / f.name)


def _data_size(path: Path) -> int:
    with open(path, "rb") as f:
        (n,) = np.frombuffer(f.read(8), "<u8")
    return path.stat().st_size - 8 - int(n)


# ------------------------------------------------------------------------------------------------------ reading


@dataclass
class Layer:
    """A quantized tensor found in a checkpoint: the original ``name``, its format ("nvfp4" | "mxfp4" | "mxfp8"),
    the names of its codes / scale / global tensors, the shard file, the original shape (K unpadded) and dtype
    (from ``fp4ref.tensors`` metadata when present, else derived: shape from the codes, dtype None)."""

    name: str
    fmt: str
    checkpoint_format: str
    codes: str
    scale: str
    global_: str | None
    shard: str
    shape: tuple
    dtype: str | None
    k_padded: int
    out_dtype: str | None = None


def detect_format(ckpt: Checkpoint) -> tuple:
    """(checkpoint format, format, recipe-or-mode or None) of a quantized checkpoint, from hf_quant_config.json,
    config.json's quantization_config, or fp4ref shard metadata; the recipe-or-mode is the recorded
    ``fp4ref.recipe`` of an NVFP4 checkpoint, ``fp4ref.mode`` of an MX one.

    Raises:
        QuantizeFileError: not a quantized checkpoint, or a quantization this reader does not know (an
            ``fp4ref.format`` or, without a loader config, an ``fp4ref.checkpoint_format`` it does not know is named
            with its shard).
    """
    first = next((s for s in ckpt.shards if "fp4ref.format" in s.metadata), None)
    meta = None if first is None else first.metadata

    def option_of(fmt: str):  # the recorded recipe (NVFP4) or mode (MX): the other key is not this format's
        return None if meta is None else meta.get("fp4ref.recipe" if fmt == "nvfp4" else "fp4ref.mode")

    hf = ckpt.json_files.get("hf_quant_config.json")
    qc = (ckpt.config or {}).get("quantization_config")
    if hf is not None or (isinstance(qc, dict) and qc.get("quant_method") == "modelopt"):
        algo = ((hf or {}).get("quantization") or {}).get("quant_algo") or (qc or {}).get("quant_algo")
        fmts = {"NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4", "NVFP4_AWQ": "nvfp4", "MXFP8": "mxfp8"}
        if algo not in fmts:
            raise QuantizeFileError(f"ModelOpt quant_algo {algo!r} is not one fp4ref reads ({sorted(fmts)})")
        return "modelopt", fmts[algo], option_of(fmts[algo])
    if isinstance(qc, dict) and qc.get("quant_method") == "compressed-tensors":
        fmts = {"nvfp4-pack-quantized": "nvfp4", "mxfp4-pack-quantized": "mxfp4", "mxfp8-quantized": "mxfp8"}
        f = qc.get("format")
        if f not in fmts:
            raise QuantizeFileError(f"compressed-tensors format {f!r} is not one fp4ref reads ({sorted(fmts)})")
        return "compressed-tensors", fmts[f], option_of(fmts[f])
    if meta is not None and meta.get("fp4ref.format") in FORMATS:
        cf = meta.get("fp4ref.checkpoint_format", "fp4ref")
        if cf not in CHECKPOINT_FORMATS:  # the tensors' names depend on the layout: name the record, read nothing
            raise QuantizeFileError(f"{str(first.path)!r}: metadata fp4ref.checkpoint_format={cf!r} is not a layout "
                                    f"fp4ref knows ({', '.join(CHECKPOINT_FORMATS)})")
        return cf, meta["fp4ref.format"], option_of(meta["fp4ref.format"])
    if meta is not None:  # metadata of a format this version does not know (or a tampered file): name it
        raise QuantizeFileError(f"{str(first.path)!r}: metadata fp4ref.format={meta['fp4ref.format']!r} is not a "
                                f"format fp4ref knows ({', '.join(FORMATS)})")
    raise QuantizeFileError(f"{_where(ckpt)!r} has no fp4ref quantization metadata (fp4ref.format / fp4ref.tensors), "
                            "no hf_quant_config.json and no quantization_config: it is not a quantized checkpoint "
                            "fp4ref reads")


def find_quantized_layers(ckpt) -> tuple:
    """(checkpoint format, format, option, {name: :class:`Layer`}) of a quantized checkpoint: a :class:`Checkpoint`
    or a path (opened with :func:`fp4ref.checkpoint_io.open_checkpoint`).

    The layers are those ``fp4ref.tensors`` lists in the shards that carry it (every shard fp4ref writes, in any
    layout: so a tensor kept unquantized with a scale-like name of its own is not taken for a layer), and in the
    ModelOpt and compressed-tensors layouts those found from their scale tensors (``*weight_scale``) in the shards
    that do not (all of them for a checkpoint another tool wrote; a shard re-saved without fp4ref's metadata).
    Raises QuantizeFileError as :func:`detect_format`; when a scale has no codes; when a shard's fp4ref.tensors is
    not JSON; in the fp4ref layout, when a shard lacks fp4ref.tensors (its layers cannot be told from its other
    tensors, and none may be left unchecked)."""
    if not isinstance(ckpt, Checkpoint):
        ckpt = open_checkpoint(ckpt)
    cf, fmt, option = detect_format(ckpt)
    layers = {}
    recorded = {}
    unrecorded = set()  # file names of the shards without fp4ref.tensors
    names = set(ckpt.weight_map)
    for s in ckpt.shards:
        if "fp4ref.tensors" in s.metadata:
            own = _tensors_record(s, cf, fmt)
            for orig in own:  # a record copied from another shard lists layers whose codes are not here
                codes = output_names(cf, fmt, orig)["codes"]
                if codes not in names:
                    raise QuantizeFileError(f"{str(s.path)!r}: metadata fp4ref.tensors lists {orig!r}, whose codes "
                                            f"tensor {codes!r} is missing from the checkpoint")
                if ckpt.weight_map[codes] != s.path.name:
                    raise QuantizeFileError(
                        f"{str(s.path)!r}: metadata fp4ref.tensors lists {orig!r}, whose codes tensor {codes!r} is "
                        f"in {ckpt.weight_map[codes]} (the metadata of another shard?)")
            recorded.update(own)
        else:
            unrecorded.add(s.path.name)
            if cf == "fp4ref":
                raise QuantizeFileError(
                    f"{str(s.path)!r} has no fp4ref.tensors metadata (a shard re-saved by another tool?): in the "
                    "fp4ref layout its quantized tensors cannot be told from its other tensors")
    candidates = set(recorded)
    for n in sorted(names):  # (unrecorded shards exist only outside fp4ref's layout: refused above)
        orig = _layer_of_scale(cf, n)
        if orig is not None and ckpt.weight_map[n] in unrecorded:
            candidates.add(orig)
    for orig in sorted(candidates):
        on = output_names(cf, fmt, orig)
        if on["codes"] not in names:
            raise QuantizeFileError(f"scale tensor {on['scale']!r} has no codes tensor {on['codes']!r}")
        if orig != on["codes"] and orig in names:  # (compressed-tensors: X.weight beside X.weight_packed)
            raise QuantizeFileError(f"tensor {orig!r} is stored beside the codes {on['codes']!r} of the quantized "
                                    "layer of that name: its dequantized weight would collide with it")
        shard = ckpt.weight_map[on["codes"]]
        cinfo = ckpt.shard_of(on["codes"]).tensors[on["codes"]]
        kp = cinfo.shape[-1] * (1 if fmt == "mxfp8" else 2) if cinfo.shape else 0
        rec = recorded.get(orig)
        shape = tuple(rec["shape"]) if rec else tuple(cinfo.shape[:-1]) + (kp,)
        layers[orig] = Layer(orig, fmt, cf, on["codes"], on["scale"],
                             on.get("global") if on.get("global") in names else None, shard, shape,
                             rec["dtype"] if rec else None, kp)
    _check_nothing_left_out(ckpt, cf, fmt, layers)
    return cf, fmt, option, layers


def _layer_of_scale(cf: str, n: str) -> str | None:
    """The quantized tensor whose scale tensor in layout ``cf`` would be named ``n`` (output_names' rule read
    backwards), or None when ``n`` is no scale name there: fp4ref ``X_scale``; compressed-tensors
    ``X.weight_scale``; ModelOpt ``X.weight_scale`` or, for a 3-D expert parameter P, ``P_weight_scale``."""
    if cf == "fp4ref":
        return n[: -len("_scale")] if n.endswith("_scale") else None
    if not n.endswith(".weight_scale" if cf == "compressed-tensors" else "weight_scale"):
        return None
    base = n[: -len("weight_scale")]
    if base.endswith(".") or base == "":
        return base + "weight"
    return base[:-1]  # 3-D expert parameter P: P_weight_scale


def _tensors_record(shard, cf: str, fmt: str) -> dict:
    """A shard's fp4ref.tensors record, checked: a JSON object {tensor: {"shape": [ints >= 0, ...], "dtype": F32,
    F16 or BF16 (the original dtypes fp4ref quantizes)}} whose tensors are names the layout can quantize
    (compressed-tensors: X.weight) and not themselves the scale or global tensor of another recorded layer."""
    where = f"{str(shard.path)!r}: metadata fp4ref.tensors"
    try:
        rec = json.loads(shard.metadata["fp4ref.tensors"])
    except json.JSONDecodeError:
        raise QuantizeFileError(f"{where} is not JSON") from None
    if not isinstance(rec, dict):
        raise QuantizeFileError(f"{where} is not a JSON object of tensors (got {type(rec).__name__})")
    for name, entry in rec.items():
        shape = entry.get("shape") if isinstance(entry, dict) else None
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if (not isinstance(entry, dict) or set(entry) != {"shape", "dtype"}  # (nothing else is recorded)
                or not isinstance(shape, list) or not shape
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
                or dtype not in _QUANTIZABLE):
            raise QuantizeFileError(f"{where}: entry {name!r} is {entry!r}, expected {{'shape': [ints >= 0], "
                                    f"'dtype': one of {list(_QUANTIZABLE)}}} (the original dtypes fp4ref "
                                    "quantizes)")
        if cf == "compressed-tensors" and not name.endswith(".weight"):
            raise QuantizeFileError(f"{where}: entry {name!r} is no X.weight tensor, the only kind compressed-tensors "
                                    "quantizes")
    side = {}  # scale / global tensor name -> the recorded layer it belongs to
    for other in rec:
        outs = output_names(cf, fmt, other)
        side.update({outs[k]: other for k in ("scale", "global") if k in outs})
    for name in rec:
        if name in side:
            raise QuantizeFileError(f"{where} lists {name!r}, a scale or global tensor of the layer {side[name]!r} it "
                                    "lists too")
    return rec


def _check_nothing_left_out(ckpt, cf: str, fmt: str, layers: dict) -> None:
    """Raise QuantizeFileError for a tensor that looks like part of a quantized layer but belongs to none found:
    a scale-named tensor of the format's scale dtype beside a codes tensor (a layer its shard's fp4ref.tensors does
    not list), or, in the ModelOpt and compressed-tensors layouts, a codes-named tensor of the codes dtype without
    its scale. Either would be skipped by audit and copied by --dequantize as if it were a weight."""
    owned = {nm for L in layers.values() for nm in (L.codes, L.scale, L.global_) if nm is not None}
    codes_dt, scale_dt = _STORED_DTYPES[fmt]
    shards = ckpt.shards_by_name  # (a property that builds the map: once, not per tensor)
    for n, shard_name in sorted(ckpt.weight_map.items()):
        if n in owned:
            continue
        dt = shards[shard_name].tensors[n].dtype
        orig = _layer_of_scale(cf, n)
        if orig is not None and dt == scale_dt:
            if output_names(cf, fmt, orig)["codes"] in ckpt.weight_map:
                raise QuantizeFileError(f"{shard_name}: {n!r} ({dt}) is the scale of a quantized layer {orig!r} that "
                                        "the shard's fp4ref.tensors metadata does not list (metadata copied or "
                                        "edited by another tool?)")
        if cf != "fp4ref" and dt == codes_dt and (n.endswith(".weight_packed") or n.endswith(".weight")
                                                  or cf == "modelopt" and n.endswith("weight")):
            orig = n[: -len("_packed")] if n.endswith(".weight_packed") else n
            scale = output_names(cf, fmt, orig)["scale"]
            if scale in ckpt.weight_map:
                raise QuantizeFileError(f"{shard_name}: {n!r} ({dt}) and {scale!r} are a quantized layer {orig!r} "
                                        "that the shard's fp4ref.tensors metadata does not list (metadata copied or "
                                        "edited by another tool?)")
            raise QuantizeFileError(f"{shard_name}: {n!r} ({dt}) looks like the codes of a quantized layer, but its "
                                    f"scale tensor {scale!r} is missing")


def layout_problems(layer: Layer, ckpt, cf: str) -> list:
    """What is wrong with the tensors of quantized ``layer`` against its layout, as text (empty: nothing): each of
    its codes / scale / global tensors must exist with the dtype and shape of the layout (codes U8 [.., N, K/2] or
    F8_E4M3 [.., N, K] for mxfp8; NVFP4 scales F8_E4M3, MX scales U8 [.., N, K/block]; the global scale F32 [] / [E]
    (ModelOpt, fp4ref) or [1] (compressed-tensors)), and the stored K must be the original K rounded up to the
    block. fp4ref audit reports them; --dequantize refuses a layer with any."""
    fmt = layer.fmt
    block = FORMATS[fmt][0]
    lead, k = tuple(layer.shape[:-1]), layer.shape[-1]
    kp = layer.k_padded
    codes_dt, scale_dt = _STORED_DTYPES[fmt]
    expect = [(layer.codes, codes_dt, lead + ((kp if fmt == "mxfp8" else kp // 2),)),
              (layer.scale, scale_dt, lead + (kp // block,))]
    if fmt == "nvfp4":
        gshape = (1,) if cf == "compressed-tensors" else ((layer.shape[0],) if len(layer.shape) == 3 else ())
        expect.append((output_names(cf, fmt, layer.name)["global"], "F32", gshape))
    bad = []
    if not (k <= kp < k + block and kp % block == 0):
        bad.append(f"stored K={kp} is not the original K={k} rounded up to a multiple of {block}")
    for name, dt, shape in expect:
        if name not in ckpt.weight_map:
            bad.append(f"{name} is missing")
            continue
        info = ckpt.shard_of(name).tensors[name]
        if info.dtype != dt or tuple(info.shape) != tuple(shape):
            bad.append(f"{name} is {info.dtype} {list(info.shape)}, expected {dt} {list(shape)}")
    return bad


def scale_byte_defects(fmt: str, sb: np.ndarray) -> tuple:
    """(NaN mask, negative mask) of scale bytes ``sb`` (uint8) of format ``fmt``: an NVFP4 scale is a non-negative
    E4M3FN value, so bytes 0x7F / 0xFF are NaN and the other bytes with the sign bit set (0x80 = -0 included) are
    negative; an MX scale is UE8M0, whose 0xFF is NaN and which has no sign. A quantizer writes neither; fp4ref
    audit counts them, --dequantize refuses them."""
    if fmt == "nvfp4":
        nan = (sb & 0x7F) == 0x7F
        return nan, ((sb & 0x80) != 0) & ~nan
    return sb == 0xFF, np.zeros(sb.shape, bool)


def zero_scale_blocks(el: np.ndarray, sb: np.ndarray, fmt: str) -> int:
    """Blocks whose block scale is zero while their element codes are not, so that their values decode to 0: NVFP4
    scale bytes 0x00 / 0x80 (E4M3 +-0) over a block with a non-zero E2M1 magnitude (UE8M0, the MX scale, has no
    zero). ``el``: element codes [rows, stored K] (``element_codes``); ``sb``: scale bytes [rows, stored K / block].
    fp4ref audit reports them (zero-scale-codes); quantize counts them (``TensorReport.lost_blocks``)."""
    if fmt != "nvfp4":
        return 0
    rows = el.shape[0]
    nonzero = np.any((el & 7).reshape(rows, -1, FORMATS[fmt][0]) != 0, axis=-1)
    return int(np.count_nonzero(((sb.reshape(rows, -1) & 0x7F) == 0) & nonzero))


def element_codes(codes: np.ndarray, fmt: str) -> np.ndarray:
    """The uint8 element codes [rows, stored K] of stored code rows ``codes`` [rows, ...] of format ``fmt``: the
    bytes (mxfp8, E4M3FN codes) or each byte's two E2M1 codes, element 2i in bits 3:0 (nvfp4, mxfp4). Beyond the
    original K every quantizer writes code 0 (a -0 code is not 0): fp4ref audit counts the others, --dequantize
    refuses them."""
    c = codes.view(np.uint8)
    if fmt == "mxfp8":
        return c.reshape(c.shape[0], -1)
    return np.stack([c & 15, c >> 4], axis=-1).reshape(c.shape[0], -1)


def _decode_rows(shard_of, layer: Layer, e: int, r0: int, r1: int) -> np.ndarray:
    """Exact float64 values of rows [r0, r1) of expert e (0 for 2-D) of a quantized layer, unpadded."""
    block = FORMATS[layer.fmt][0]
    experts = layer.shape[0] if len(layer.shape) == 3 else 1
    n = int(np.prod(layer.shape[:-1], dtype=np.int64)) // experts
    row0 = e * n
    cs = shard_of(layer.codes)
    ss = shard_of(layer.scale)
    codes = cs.read_rows(layer.codes, row0 + r0, row0 + r1)
    sb = ss.read_rows(layer.scale, row0 + r0, row0 + r1).view(np.uint8)
    el = element_codes(codes, layer.fmt)
    if layer.fmt == "mxfp8":
        cb = el.reshape(-1)
        nan_codes = np.flatnonzero((cb & 0x7F) == 0x7F)
        if nan_codes.size:  # E4M3FN NaN: no quantizer writes it, and it would decode to a NaN weight
            raise QuantizeFileError(f"{layer.codes}: element code {int(cb[nan_codes[0]]):#04x} at flat index "
                                    f"{int(nan_codes[0])} of rows [{row0 + r0}, {row0 + r1}) is NaN")
        vals = codes.astype(np.float64)
    else:
        vals = _E2M1[el]
    # codes beyond the original K are zero in every quantizer's output: others mean a wrong recorded K, whose
    # decode would drop values (audit's padding check)
    pad = el[:, layer.shape[-1]:]
    if np.any(pad):
        raise QuantizeFileError(f"{layer.codes}: {int(np.count_nonzero(pad))} non-zero code(s) beyond the original "
                                f"K={layer.shape[-1]} (stored K={layer.k_padded}) in rows [{row0 + r0}, "
                                f"{row0 + r1}); fp4ref audit reports the padding")
    # a corrupt scale byte is refused, never decoded into NaN or negated weights
    nan, neg = scale_byte_defects(layer.fmt, sb)
    bad = np.flatnonzero(nan | neg)
    if bad.size:
        raise QuantizeFileError(f"{layer.scale}: scale byte {int(sb.reshape(-1)[bad[0]]):#04x} at flat index "
                                f"{int(bad[0])} of rows [{row0 + r0}, {row0 + r1}) is NaN or negative")
    if layer.fmt == "nvfp4":
        import ml_dtypes

        scale = sb.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        g = shard_of(layer.global_).read_array(layer.global_).astype(np.float64).reshape(-1)
        gv = g[e] if g.size > 1 else g[0]
        if not (np.isfinite(gv) and gv > 0):
            which = f" (expert {e})" if g.size > 1 else ""  # a per-expert global scale names its expert
            raise QuantizeFileError(f"{layer.global_}: global scale {float(gv)!r}{which} is not a finite positive "
                                    "number")
        if layer.checkpoint_format == "compressed-tensors":
            with np.errstate(divide="ignore", over="ignore"):
                gv = float(np.float32(1.0) / np.float32(gv))  # stored ENCODE scale; decode with its fp32 reciprocal
            if not math.isfinite(gv):
                raise QuantizeFileError(f"{layer.global_}: global encode scale has no finite fp32 reciprocal (the "
                                        "decode scale)")
        out = vals.reshape(r1 - r0, -1, block) * scale[..., None] * gv
    else:
        out = vals.reshape(r1 - r0, -1, block) * np.ldexp(1.0, sb.astype(np.int64) - 127)[..., None]
    return out.reshape(r1 - r0, -1)[:, : layer.shape[-1]]


_MAX_FINITE = {"F32": float(np.finfo(np.float32).max), "BF16": float.fromhex("0x1.fep127"), "F16": 65504.0}


def round_to(x: np.ndarray, dtype: str, name: str = "x") -> np.ndarray:
    """Round float64 ``x`` once (RNE) to safetensors dtype ``dtype`` (F32, BF16, F16 or F64).

    numpy (float32, float16) and ml_dtypes (bfloat16) convert float64 directly with one rounding (no detour through
    float32 that could round twice; tests/test_checkpoint.py checks a double-rounding case). Raises ValueError when
    a finite value overflows the target (named by ``name``): nothing is silently cast to inf.
    """
    if dtype == "F64":
        return x.astype(np.float64)
    finite = np.isfinite(x)
    if finite.any() and float(np.max(np.abs(x[finite]))) > _MAX_FINITE[dtype]:
        with np.errstate(over="ignore"):
            r = x.astype(DTYPES[dtype])
        if np.any(np.isinf(r.astype(np.float64)) & finite):
            fix = ("pass a wider dtype (--dtype float32)" if dtype != "F32" else "no dtype --dequantize writes is "
                   "wider: a stored scale is too large (fp4ref audit reports it as decode-overflow)")
            raise ValueError(f"{name}: a value ({float(np.max(np.abs(x[finite]))):.6g}) overflows {dtype}; {fix}")
        return r
    return x.astype(DTYPES[dtype])


def _dtype_name(dt: str) -> str:
    return {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}[dt]


_DTYPE_ALIASES = {"float32": "F32", "fp32": "F32", "f32": "F32", "bfloat16": "BF16", "bf16": "BF16",
                  "float16": "F16", "fp16": "F16", "f16": "F16", "half": "F16", "float": "F32"}


def _dtype_like_name(x) -> str | None:
    """``np.dtype(x).name`` of a numpy dtype-like that is not a str: a np.dtype, or a scalar type
    (``np.float16``, ``ml_dtypes.bfloat16``); None for anything else (a class numpy reads as dtype object
    included)."""
    if isinstance(x, np.dtype):
        return x.name
    if not isinstance(x, type):
        return None
    try:
        dt = np.dtype(x)
    except (TypeError, ValueError):
        return None
    return None if dt.kind == "O" else dt.name


def parse_dtype(text, name: str = "dtype", *, float64: bool = False) -> str:
    """'float32' / 'bfloat16' / 'float16' (or F32/BF16/F16; with ``float64``, also 'float64' / F64), any case, or a
    numpy dtype-like of one of them, read by its name (``np.float16``, ``np.dtype("float32")``,
    ``ml_dtypes.bfloat16``) -> safetensors dtype string.

    Raises:
        TypeError: ``text`` neither a str nor a numpy dtype-like, naming the argument ``name`` and listing the
        accepted values. ValueError: another name or dtype, named the same way (the CLI passes ``"--dtype"``).
    """
    accepted = ("float64, " if float64 else "") + "float32, bfloat16, float16"
    if isinstance(text, str):
        t = text
        what = f"{name} {text!r}" if name.startswith("-") else f"{name}={text!r}"
    else:
        t = _dtype_like_name(text)
        if t is None:
            raise TypeError(f"{name}={text!r}: expected one of {accepted}, as a str or a numpy dtype (np.float16, "
                            f"ml_dtypes.bfloat16), got {type(text).__name__}")
        what = f"{name}={text!r} ({t})"
    if float64 and t.lower() in ("float64", "f64", "fp64", "double"):
        return "F64"
    if t.upper() in ("F32", "BF16", "F16"):
        return t.upper()
    if t.lower() in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[t.lower()]
    raise ValueError(f"{what} is not one of {accepted}")


@dataclass
class _DeqTask:
    paths: dict  # tensor name -> shard path
    layer: Layer
    dtype: str
    nbytes: int
    out_path: str
    offset: int

    @property
    def name(self):
        return self.layer.name


def _deq_task(t: _DeqTask):
    t0 = time.perf_counter()
    L = t.layer
    experts = L.shape[0] if len(L.shape) == 3 else 1
    n = int(np.prod(L.shape[:-1], dtype=np.int64)) // experts
    k = L.shape[-1]
    item = DTYPES[t.dtype].itemsize
    step = _row_step(L.k_padded)
    shard_of = lambda nm: _shard(t.paths[nm])  # noqa: E731
    for e in range(experts):
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            y = round_to(_decode_rows(shard_of, L, e, r0, r1), t.dtype, L.name)
            write_at(t.out_path, t.offset + (e * n + r0) * k * item, y)
    return {"seconds": time.perf_counter() - t0}


def _dequant_plan(ckpt: Checkpoint, dtype: str | None):
    cf, fmt, option, layers = find_quantized_layers(ckpt)
    cfg_dtype = None
    if ckpt.config:
        raw = ckpt.config.get("torch_dtype") or ckpt.config.get("dtype")
        if isinstance(raw, str) and raw.lower() in _DTYPE_ALIASES:
            cfg_dtype = _DTYPE_ALIASES[raw.lower()]
    for L in layers.values():  # (audit reports these; decoding through them would misread or crash)
        bad = layout_problems(L, ckpt, cf)
        if bad:
            raise QuantizeFileError(f"{L.name}: {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
                                    + "; fp4ref audit lists every layout problem")
    owned = {}
    for L in layers.values():
        for nm in (L.codes, L.scale, L.global_):
            if nm is not None:
                owned[nm] = L.name
        # ModelOpt's activation scale sits beside the weight scale: X.input_scale, P_input_scale for a parameter P
        base = L.scale[: -len("weight_scale")] if L.scale.endswith("weight_scale") else None
        if cf == "modelopt" and base is not None and base + "input_scale" in ckpt.weight_map:
            owned[base + "input_scale"] = L.name  # an activation scale: no weight to restore
        want = dtype or L.dtype or cfg_dtype
        if want is None:
            raise QuantizeFileError(f"the original dtype of {L.name!r} is not recorded (no fp4ref.tensors metadata, "
                                    "no torch_dtype in config.json): pass dtype (--dtype)")
        L.out_dtype = want
    return cf, fmt, option, layers, owned


def dequantize_checkpoint(in_path, out_path, *, dtype=None, jobs: int = 1, force: bool = False,
                          progress: bool = False) -> list:
    """Dequantize a quantized checkpoint (any of :data:`CHECKPOINT_FORMATS`) back to floating tensors.

    Each quantized tensor is restored under its original name and shape (padding dropped) in its original dtype
    (``fp4ref.tensors`` metadata, else config.json ``torch_dtype``), or ``dtype`` (float32 / bfloat16 / float16):
    the exact decoded value rounded once (RNE). Other tensors are copied byte for byte (``dtype`` does not convert
    them); ModelOpt ``input_scale`` tensors are dropped; config.json loses its ``quantization_config`` (with
    ``dtype``, its ``torch_dtype`` names ``dtype``); hf_quant_config.json is not written. The output is a directory
    unless the input is one file and ``out_path`` ends in ``.safetensors`` (a str ending in a path separator,
    ``"out.safetensors/"``, is a directory whatever its name).

    ``dtype`` is a name (any case; also F32 / BF16 / F16) or a numpy dtype-like of one (``np.float16``,
    ``np.dtype("float32")``, ``ml_dtypes.bfloat16``): :func:`parse_dtype`.

    Raises:
        TypeError: a path, flag, ``jobs`` or ``dtype`` of the wrong type. ValueError: ``dtype`` not one of
        float32, bfloat16, float16. QuantizeFileError / CheckpointError: not a quantized checkpoint, bad paths,
        ``jobs`` < 1, a value overflowing the target dtype (named).
    """
    return _dequantize_checkpoint(in_path, out_path, dtype=dtype, jobs=jobs, force=force, progress=progress)[0]


def _dequantize_checkpoint(in_path, out_path, *, dtype, jobs, force, progress) -> tuple:
    """:func:`dequantize_checkpoint`'s work: (its reports, the input :class:`Checkpoint` it opened)."""
    jobs = _check_jobs(jobs)
    _check_flags(force=force, progress=progress)
    path_arg(in_path, "input")  # the arguments in their order
    path_arg(out_path, "output")
    dt = parse_dtype(dtype, "dtype") if dtype is not None else None
    ckpt = open_checkpoint(in_path)
    cf, fmt, option, layers, owned = _dequant_plan(ckpt, dt)
    out = Path(out_path)
    is_dir = _out_is_dir(ckpt, out_path)
    loc = OutputLocation(out_path, is_dir=is_dir, force=force, source=ckpt,
                         names=_output_names(ckpt, None, quantized=False) if is_dir else None)
    paths = {n: str(ckpt.shard_of(n).path) for n in ckpt.weight_map}
    with Workers(jobs, len(ckpt.weight_map)) as pool, Progress(progress, "quantize --dequantize") as bar:
        with loc.building() as tmp:
            tasks, items = [], []
            for shard in ckpt.shards:
                entries, plan = [], []
                for n in sorted(n for n, f in ckpt.weight_map.items() if f == shard.path.name):
                    if n in owned:
                        if n == layers[owned[n]].codes:
                            L = layers[owned[n]]
                            nb = int(np.prod(L.shape, dtype=np.int64)) * DTYPES[L.out_dtype].itemsize
                            entries.append((L.name, L.out_dtype, L.shape, nb))
                            plan.append(("deq", L, nb))
                        continue
                    info = shard.tensors[n]
                    entries.append((n, info.dtype, info.shape, info.nbytes))
                    plan.append(("copy", info, info.nbytes))
                entries.sort(key=lambda e: e[0])
                meta = {k: v for k, v in shard.metadata.items() if not k.startswith("fp4ref.")}
                out_file = tmp / shard.path.name
                w = ShardWriter(out_file, entries, meta)
                for kind, obj, nb in plan:
                    if kind == "deq":
                        tasks.append((_deq_task, _DeqTask(paths, obj, obj.out_dtype, nb, str(out_file),
                                                          w.offsets[obj.name])))
                        items.append(_DeqItem(obj.name, shard.path.name, obj.out_dtype, obj.shape, nb, True))
                    else:
                        tasks.append((_copy_task, _CopyTask(str(shard.path), obj.name, nb, str(out_file),
                                                            w.offsets[obj.name])))
                        items.append(_DeqItem(obj.name, shard.path.name, obj.dtype, obj.shape, nb, False))
            results = pool.run(tasks, bar, "dequantize")
            dts = {L.out_dtype for L in layers.values()}
            _write_side_files(ckpt, items, None, tmp, quantized=False,
                              dtype=_dtype_name(dts.pop()) if len(dts) == 1 else None)
            loc.publish(None if is_dir else ckpt.shards[0].path.name)
    reports = []
    for (fn, t), it, r in zip(tasks, items, results):
        if it.dequantized:
            reports.append(TensorReport(it.name, tuple(it.shape), it.dtype, "dequantized", fmt=fmt,
                                        seconds=r["seconds"]))
        else:
            reports.append(TensorReport(it.name, tuple(it.shape), it.dtype, "copied", reason="not quantized"))
    return sorted(reports, key=lambda r: r.name), ckpt


@dataclass
class _DeqItem:
    name: str
    shard: str
    dtype: str
    shape: tuple
    nbytes: int
    dequantized: bool

    @property
    def quantized(self):
        return False


def read_dequantized(path, name: str, *, dtype: str = "F64") -> np.ndarray:
    """Read one quantized tensor of a checkpoint (any format) as its exact decoded values (float64 by default, or
    rounded once to ``dtype``), in its original shape. Reads the whole tensor: meant for checks and tests.

    ``dtype`` is one of ``"float64"`` (the default, also ``"F64"``: no rounding), ``"float32"``, ``"bfloat16"`` or
    ``"float16"`` (also the safetensors names ``"F32"``, ``"BF16"``, ``"F16"`` and the aliases ``"fp32"``,
    ``"bf16"``, ``"fp16"``, ``"half"``, and ``"float"`` for float32 as in torch), case-insensitive, or a numpy
    dtype-like of one (``np.float16``, ``ml_dtypes.bfloat16``).

    Raises:
        TypeError: ``name`` not a str, ``dtype`` neither a str nor a numpy dtype-like (named). ValueError:
        ``dtype`` not one of those, or a value overflowing it (named). QuantizeFileError: not a quantized
        checkpoint, or ``name`` is not a quantized tensor of it (a ValueError, as every bad input here).
    """
    if not isinstance(name, str):
        raise TypeError(f"name={name!r}: expected the name of a quantized tensor (str), got {type(name).__name__}")
    dt = parse_dtype(dtype, "dtype", float64=True)
    path_arg(path, "path")  # named as the argument here (open_checkpoint says "input")
    ckpt = open_checkpoint(path)
    _, _, _, layers = find_quantized_layers(ckpt)
    if name not in layers:
        some = ", ".join(sorted(layers)[:5]) + (", ..." if len(layers) > 5 else "")
        raise QuantizeFileError(f"{name!r} is not a quantized tensor of {str(path)!r} (its {len(layers)}: {some})")
    L = layers[name]
    experts = L.shape[0] if len(L.shape) == 3 else 1
    n = int(np.prod(L.shape[:-1], dtype=np.int64)) // experts
    shard_of = ckpt.shard_of
    parts = [_decode_rows(shard_of, L, e, 0, n) for e in range(experts)]
    out = np.concatenate(parts, axis=0).reshape(L.shape)
    return out if dt == "F64" else round_to(out, dt, name)


# ------------------------------------------------------------------------------------------------------ table


def _fmt_db(v: float) -> str:
    if math.isnan(v):
        return "-"
    return "inf" if math.isinf(v) and v > 0 else f"{v:.2f}"


def _shown_name(name: str) -> str:
    """``name`` as a report prints it: as is, or with control and other unprintable characters escaped (a tensor
    name holding "\\x1b[31m" or a newline would otherwise drive the terminal or split a table row)."""
    return name if name.isprintable() else name.encode("unicode_escape").decode("ascii")


def print_report(reports: list, *, title: str, file=None) -> None:
    """Print the per-tensor table (rich) to ``file`` (default stdout): name, shape, dtype, format (and the stored K
    where pad=True padded it) or why the tensor is copied as is, SQNR dB, max |err|, zero blocks, ms. A value not
    measured (NaN: a dry run's plan) shows "-"."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from ._tables_rich import print_table

    # every cell is Text, never rich markup: a tensor named "x[/].weight" or a reason holding "[experts, in, out]"
    # would otherwise raise MarkupError or lose its brackets (and escape() shows a trailing backslash twice)
    table = Table(title=Text(title))
    for col, just in (("tensor", "left"), ("shape", "left"), ("dtype", "left"), ("action", "left"),
                      ("SQNR dB", "right"), ("max |err|", "right"), ("zero blocks", "right"), ("ms", "right")):
        table.add_column(col, justify=just, overflow="fold")
    for r in reports:
        if r.action == "copied":
            table.add_row(Text(_shown_name(r.name)), str(list(r.shape)), r.dtype,
                          Text(_shown_name(f"copied as is: {r.reason}")), "", "", "", "")
        else:
            err = "-" if math.isnan(r.max_abs_err) else f"{r.max_abs_err:.4g}"
            planned = math.isnan(r.seconds)  # a dry run: nothing was quantized, nothing timed
            zb = "-" if r.action != "quantized" or planned else str(r.zero_blocks)
            ms = "-" if planned else f"{1e3 * r.seconds:.1f}"
            act = f"{r.action} {r.fmt}".strip() + (f", K padded to {r.padded_to}" if r.padded_to else "")
            table.add_row(Text(_shown_name(r.name)), str(list(r.shape)), r.dtype, Text(act), _fmt_db(r.sqnr_db), err,
                          zb, ms)
    print_table(Console(file=file or sys.stdout), table,
                whole=("shape", "dtype", "SQNR dB", "max |err|", "zero blocks", "ms"))
