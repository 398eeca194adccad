"""``fp4ref audit``: check every quantized tensor of a checkpoint (ModelOpt, compressed-tensors or fp4ref layout).

Usage::

    fp4ref audit PATH [--reference ORIGINAL [--recipe R | --mode M]] [--json FILE|- [--force]] [--quiet]

Checks per quantized tensor (docs/checkpoints.md, "fp4ref audit"):

* ``layout``: the codes / scale / global-scale tensors exist with the dtypes and shapes of the layout
  (:func:`fp4ref.checkpoint.output_names`; codes U8 [.., N, K/2] or F8_E4M3 [.., N, K]; NVFP4 scales F8_E4M3, MX
  scales U8 [.., N, K/block]; the global scale F32 [] / [E] (ModelOpt, fp4ref) or [1] (compressed-tensors)). A
  missing codes tensor, or codes without their scale in a shard without fp4ref's record, leave no layer to check:
  the checkpoint is unreadable (exit 2, the missing tensor named).
* ``scale-nan``: NVFP4 scale bytes 0x7F / 0xFF (E4M3FN NaN); MX scale byte 0xFF (UE8M0 NaN).
* ``scale-negative``: NVFP4 scale bytes with the sign bit set (0x80 = -0 included): UE4M3 has no sign, a
  reader that decodes them as E4M3FN gets a negative or -0 scale.
* ``code-nan``: MXFP8 element codes 0x7F / 0xFF (E4M3FN NaN).
* ``zero-scale-codes``: a zero block scale whose block holds non-zero codes (those codes decode to 0: lost values).
* ``padding``: codes beyond the original K (``fp4ref.tensors`` records it) must be zero.
* ``global-scale``: finite and positive (compressed-tensors stores the encode scale: its fp32 reciprocal, the
  decode scale, finite too); members of a fused group (q/k/v, gate/up, w1/w3) must share it.
* ``decode-overflow``: every stored value decodes within float32 (the widest dtype ``--dequantize`` writes): the
  largest |code value| x block scale (x the global decode scale of the row's expert, NVFP4) rounds to a finite
  float32.
* ``metadata``: the shard's fp4ref metadata, where present, agrees with the checkpoint: ``fp4ref.format`` is the
  detected format and ``fp4ref.block`` its block size (16 for nvfp4, 32 for mxfp4 / mxfp8); a recorded ``fp4ref.recipe``
  / ``fp4ref.mode`` is one the format and layout take (as ``--recipe`` / ``--mode`` would be judged), and the same in
  every shard that records one. An ``fp4ref.format`` fp4ref does not know is an error (exit 2) when the layout has no
  other record of the format.
* ``reference`` (with ``--reference``): the original re-quantized with the recipe (or mode) gives the same codes,
  scale and global-scale bytes. A tensor with a ``layout`` finding is not compared (its reference column reads
  "- (layout)").

Checks of the whole checkpoint (``AuditReport.findings``):

* ``config``: what the serving stacks read agrees with the tensors. ModelOpt: hf_quant_config.json and / or
  config.json's ``quantization_config`` present, every ``quant_algo`` given naming the detected format, every
  ``group_size`` given the block size, ``quant_algo`` "NVFP4" (weights and activations) with an ``input_scale`` beside
  every 2-D layer; compressed-tensors: ``quantization_config`` present, each ``config_groups`` weight scheme with the
  format's ``num_bits`` and ``group_size``. Both: no quantized layer's module listed in ``exclude_modules`` /
  ``ignore`` (names, ``fnmatch`` patterns, or compressed-tensors' ``re:`` regular expressions): a loader would read
  its codes as an unquantized weight.
* ``reference`` (with ``--reference``): every tensor of the original that was not quantized (embeddings, norms,
  lm_head, excluded layers) is in the checkpoint with the same dtype, shape and bytes (a quantizer copies them).

Exit status: 0 iff every check passes, 1 if any fails, 2 for bad arguments or an unreadable checkpoint, 130 on
Ctrl-C, 143 on SIGTERM (no partial --json report is left; an existing one is replaced only with --force, and
never an input: the checkpoint, the reference, a file in their directories or a link to one).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
from dataclasses import asdict, dataclass, field

import ml_dtypes
import numpy as np

from . import checkpoint as C
from .blockscale import _parse_mode, _parse_recipe
from ._validate import (STDOUT, OnceAction, check_report_path, emit_report, help_description, path_option,
                        sigterm_as_interrupt)
from .checkpoint_io import CheckpointError, open_checkpoint, path_arg

__all__ = ["Finding", "TensorAudit", "AuditReport", "audit_checkpoint", "add_parser", "run", "main"]

_DESCRIPTION = help_description(__doc__)


@dataclass
class Finding:
    """One failed check: ``check`` (name as in the module docstring), ``count`` (elements or bytes), ``detail``."""

    check: str
    count: int
    detail: str


@dataclass
class TensorAudit:
    """The checks of one quantized tensor: its original name, format, shape, findings, reference verdict."""

    name: str
    fmt: str
    shape: list
    findings: list = field(default_factory=list)
    reference: str = "-"

    @property
    def clean(self) -> bool:
        return not self.findings


@dataclass
class AuditReport:
    """Result of :func:`audit_checkpoint`: ``clean`` iff no tensor has a finding and the checkpoint-wide
    ``findings`` (the ``config`` and ``reference`` checks) are empty. ``copied_checked``: with a reference, how many
    of its tensors that were not quantized were compared with the checkpoint's (None without one)."""

    path: str
    checkpoint_format: str
    fmt: str
    tensors: list
    findings: list = field(default_factory=list)
    copied_checked: int | None = None

    @property
    def clean(self) -> bool:
        return not self.findings and all(t.clean for t in self.tensors)

    def to_json(self) -> dict:
        return {"path": self.path, "checkpoint_format": self.checkpoint_format, "format": self.fmt,
                "clean": self.clean, "findings": [asdict(f) for f in self.findings],
                "copied_checked": self.copied_checked, "tensors": [asdict(t) for t in self.tensors]}


def _check_layout(layer, ckpt, cf: str) -> list:
    return [Finding("layout", 1, text) for text in C.layout_problems(layer, ckpt, cf)]


# |element| of every code: E2M1 (nvfp4, mxfp4) by its 3 magnitude bits, E4M3FN (mxfp8) by its 7 (0x7F, NaN: 0 here,
# counted by code-nan); and |block scale| of every byte: E4M3FN (nvfp4; NaN bytes 0 here, counted by scale-nan) or
# UE8M0 2^(e - 127) (mx; 0xFF, NaN, 0 here)
_E2M1_MAG = np.abs(C._E2M1[:8])
_E4M3_MAG = np.nan_to_num(np.arange(128, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64), nan=0.0)
_E4M3_SCALE = np.concatenate([_E4M3_MAG, _E4M3_MAG])
_UE8M0_SCALE = np.where(np.arange(256) == 255, 0.0, np.ldexp(1.0, np.arange(256) - 127))
# the smallest magnitude that rounds (RNE) to inf in float32, the widest dtype --dequantize writes
_F32_INF = 2.0**128 - 2.0**103


def _check_bytes(layer, ckpt) -> tuple:
    """Scale bytes, zero scales with codes, padding: read in row chunks. Returns (findings, each row's largest
    |code value| x |block scale|, float64: what its decode reaches before any global scale)."""
    fmt = layer.fmt
    block = C.FORMATS[fmt][0]
    k, kp = layer.shape[-1], layer.k_padded
    rows = int(np.prod(layer.shape[:-1], dtype=np.int64))
    cs, ss = ckpt.shard_of(layer.codes), ckpt.shard_of(layer.scale)
    nan = neg = negzero = zsc = pad = code_nan = 0
    row_max = np.zeros(rows)
    step = C._row_step(kp)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        sb = ss.read_rows(layer.scale, r0, r1).view(np.uint8)
        el = C.element_codes(cs.read_rows(layer.codes, r0, r1), fmt)
        if fmt == "mxfp8":
            mag = el & 0x7F  # E4M3 codes: non-zero magnitude
            code_nan += int(np.count_nonzero(mag == 0x7F))
            values = _E4M3_MAG[mag]
        else:
            mag = el & 7
            values = _E2M1_MAG[mag]
        if kp > k:  # padding codes are never decoded (the padding check counts them)
            values = np.where(np.arange(kp) < k, values, 0.0)
        scale = (_E4M3_SCALE if fmt == "nvfp4" else _UE8M0_SCALE)[sb]
        row_max[r0:r1] = np.max(values.reshape(r1 - r0, -1, block).max(axis=-1) * scale, axis=-1, initial=0.0)
        nan_b, neg_b = C.scale_byte_defects(fmt, sb)
        nan += int(np.count_nonzero(nan_b))
        neg += int(np.count_nonzero(neg_b))
        if fmt == "nvfp4":
            negzero += int(np.count_nonzero(sb == 0x80))
        zsc += C.zero_scale_blocks(el, sb, fmt)
        if kp > k:
            pad += int(np.count_nonzero(el[:, k:]))  # (a -0 code, 0x8 / 0x80, is not code 0: it counts)
    out = []
    if nan:
        out.append(Finding("scale-nan", nan, f"{nan} NaN scale byte(s) in {layer.scale}"))
    if neg:
        out.append(Finding("scale-negative", neg, f"{neg} scale byte(s) with the sign bit set in {layer.scale} "
                                                  f"({negzero} of them -0 = 0x80)"))
    if code_nan:
        out.append(Finding("code-nan", code_nan, f"{code_nan} NaN element code(s) (E4M3FN 0x7F / 0xFF) in "
                                                 f"{layer.codes}"))
    if zsc:
        out.append(Finding("zero-scale-codes", zsc, f"{zsc} block(s) with scale 0 but non-zero codes"))
    if pad:
        out.append(Finding("padding", pad, f"{pad} non-zero code(s) beyond K={k} (stored K={kp})"))
    return out, row_max


def _decode_overflow(layer, cf: str, row_max, g) -> Finding | None:
    """The decode-overflow finding: a decoded value (|code value| x |block scale|, x the global decode scale for
    NVFP4: ``g``'s value of the row's expert, or its fp32 reciprocal in compressed-tensors) that float32 cannot
    hold (RNE to inf), or None. ``g`` None: MX, or an NVFP4 layer without a readable global scale."""
    if layer.fmt == "nvfp4":
        if g is None:
            return None  # no decode scale to apply (a layout finding says why)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            dec = (np.float32(1) / g.astype(np.float32) if cf == "compressed-tensors" else g).astype(np.float64)
            # an expert whose global scale is not a finite positive decode scale: the global-scale finding names
            # it, and the others are still checked
            dec = np.where(np.isfinite(dec) & (dec > 0) & np.isfinite(g) & (g > 0), dec, 0.0)
        top = row_max.reshape(dec.size, -1).max(axis=1, initial=0.0) * dec  # per expert (one, 2-D)
    else:
        top = np.array([row_max.max(initial=0.0)])
    bad = top >= _F32_INF
    if not bad.any():
        return None
    where = "" if top.size == 1 else f" (expert(s) {np.flatnonzero(bad)[:8].tolist()})"
    return Finding("decode-overflow", int(bad.sum()), f"the largest decoded magnitude{where} is "
                                                      f"{float(top.max()):.6g}, beyond float32 (the widest dtype "
                                                      f"--dequantize writes): a block scale or the global scale is "
                                                      f"too large")


def _global_values(layer, ckpt, cf: str):
    if layer.fmt != "nvfp4":
        return None
    gname = C.output_names(cf, layer.fmt, layer.name)["global"]
    if gname not in ckpt.weight_map:
        return None
    return ckpt.shard_of(gname).read_array(gname).astype(np.float32).reshape(-1)


def _bad_global(layer, cf: str, g) -> Finding | None:
    """The global-scale finding for values ``g`` that are not finite and positive (naming the tensor and them)."""
    bad = ~(np.isfinite(g) & (g > 0))
    what = "not finite and positive"
    if not bad.any() and cf == "compressed-tensors":
        with np.errstate(divide="ignore", over="ignore"):
            # compressed-tensors stores the encode scale: its fp32 reciprocal decodes the layer
            bad = ~np.isfinite(np.float32(1) / g.astype(np.float32))
        what = "whose fp32 reciprocal (the decode scale of compressed-tensors' stored encode scale) overflows"
    if not bad.any():
        return None
    gname = C.output_names(cf, layer.fmt, layer.name)["global"]
    vals = ", ".join(str(v) for v in g[bad][:8].tolist()) + (", ..." if bad.sum() > 8 else "")
    where = "" if g.size == 1 else f" (first at index {int(np.flatnonzero(bad)[0])})"
    return Finding("global-scale", int(bad.sum()), f"{gname}: {int(bad.sum())} of {g.size} value(s) {what}: "
                                                   f"{vals}{where}")


def _listed(module: str, patterns: list, exact_names: bool = False) -> str | None:
    """The first of ``patterns`` (exclude_modules / ignore entries) that names ``module``: compressed-tensors' ``re:``
    regular expression (re.match), else the name itself (``exact_names``: compressed-tensors compares a plain entry
    with the name) or an ``fnmatch`` pattern (ModelOpt's wildcards)."""
    for pat in patterns:
        if pat.startswith("re:"):
            try:
                if re.match(pat[3:], module):
                    return pat
            except re.error:
                continue
        elif module == pat if exact_names else fnmatch.fnmatchcase(module, pat):
            return pat
    return None


def _config_findings(ckpt, cf: str, fmt: str, layers: dict) -> list:
    """The ``config`` check (module docstring): what hf_quant_config.json and config.json's quantization_config
    tell a loader, against the layers found."""
    if cf == "fp4ref":
        return []  # fp4ref's own layout is read from the shard metadata; no loader config is written
    block = C.FORMATS[fmt][0]
    hf = ckpt.json_files.get("hf_quant_config.json")
    qc = (ckpt.config or {}).get("quantization_config")
    out = []

    def bad(text):
        out.append(Finding("config", 1, text))

    hq = hf.get("quantization") if isinstance(hf, dict) else None
    sources = [("hf_quant_config.json quantization", hq), ("config.json quantization_config", qc)]
    sources = [(where, d) for where, d in sources if isinstance(d, dict)]
    if not sources:
        bad("no hf_quant_config.json and no config.json quantization_config: a loader cannot tell the checkpoint is "
            "quantized" if cf == "modelopt" else "config.json has no quantization_config: a loader cannot tell the "
            "checkpoint is quantized")
        return out
    if cf == "modelopt":
        algos = {"NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4", "NVFP4_AWQ": "nvfp4", "MXFP8": "mxfp8"}
        for where, d in sources:
            algo = d.get("quant_algo")
            if algo is not None and algos.get(algo) != fmt:
                bad(f"{where} quant_algo={algo!r}, but the tensors are {fmt}")
            if d.get("group_size", block) != block:
                bad(f"{where} group_size={d.get('group_size')!r}, but the {fmt} block is {block}")
            if algo == "NVFP4":  # weights and activations: a loader needs each layer's activation scale
                missing = sorted(n for n, L in layers.items() if len(L.shape) == 2 and L.scale.endswith(
                    "weight_scale") and L.scale[: -len("weight_scale")] + "input_scale" not in ckpt.weight_map)
                if missing:
                    bad(f"{where} quant_algo 'NVFP4' (activations quantized too), but {len(missing)} layer(s) have "
                        f"no input_scale, e.g. {missing[0]!r} (fp4ref writes 'W4A16_NVFP4')")
    groups = qc.get("config_groups") if isinstance(qc, dict) else None
    if cf == "compressed-tensors" and not (isinstance(groups, dict) and groups):
        bad("config.json quantization_config has no config_groups: a loader has no weight scheme to apply")
    for gname, g in (groups.items() if isinstance(groups, dict) else ()):
        w = g.get("weights") if isinstance(g, dict) else None
        if not isinstance(w, dict):
            continue
        bits = 8 if fmt == "mxfp8" else 4
        if w.get("num_bits", bits) != bits:
            bad(f"config.json quantization_config config_groups.{gname}.weights.num_bits={w.get('num_bits')!r}, but "
                f"{fmt} elements have {bits} bits")
        if w.get("group_size", block) != block:
            bad(f"config.json quantization_config config_groups.{gname}.weights.group_size={w.get('group_size')!r}, "
                f"but the {fmt} block is {block}")
    for where, key, d in (("hf_quant_config.json quantization", "exclude_modules", hq),
                          ("config.json quantization_config", "ignore", qc),
                          ("config.json quantization_config", "exclude_modules", qc)):
        pats = d.get(key) if isinstance(d, dict) else None
        if pats is None:
            continue
        if not isinstance(pats, list) or not all(isinstance(p, str) for p in pats):
            bad(f"{where} {key} is {pats!r}, not a list of module names")
            continue
        for p in pats:
            if p.startswith("re:"):
                try:
                    re.compile(p[3:])
                except re.error as e:
                    bad(f"{where} {key} entry {p!r} is not a valid regular expression ({e}): a loader fails on it")
        hits = [(n, _listed(C._module_of(n), pats, exact_names=cf == "compressed-tensors")) for n in sorted(layers)]
        hits = [(n, pat) for n, pat in hits if pat is not None]
        if hits:
            bad(f"{where} {key} lists {len(hits)} quantized layer(s) (e.g. {hits[0][0]!r} by {hits[0][1]!r}): a "
                "loader would read their codes as unquantized weights")
    return out


def _metadata_findings(ckpt, fmt: str, cf: str | None = None) -> dict:
    """{shard file name: [Finding]} for fp4ref shard metadata that disagrees with the detected format ``fmt`` and
    layout ``cf``: ``fp4ref.format`` another format, ``fp4ref.checkpoint_format`` another layout, ``fp4ref.block``
    not that format's block (as fp4ref writes them), a recorded recipe / mode the layout does not take, or shards
    that record different ones."""
    block = str(C.FORMATS[fmt][0])
    out = {}
    for s in ckpt.shards:
        meta, bad = s.metadata, []
        if "fp4ref.format" in meta and meta["fp4ref.format"] != fmt:
            bad.append(f"{s.path.name}: metadata fp4ref.format={meta['fp4ref.format']!r}, but the checkpoint is "
                       f"{fmt}")
        if "fp4ref.checkpoint_format" in meta and cf is not None and meta["fp4ref.checkpoint_format"] != cf:
            bad.append(f"{s.path.name}: metadata fp4ref.checkpoint_format={meta['fp4ref.checkpoint_format']!r}, but "
                       f"the checkpoint's layout is {cf}")
        if "fp4ref.block" in meta and meta["fp4ref.block"] != block:
            bad.append(f"{s.path.name}: metadata fp4ref.block={meta['fp4ref.block']!r}, expected {block!r} "
                       f"(the {fmt} block size)")
        for key in ("fp4ref.recipe", "fp4ref.mode"):
            if key in meta:
                problem = _recorded_option_problem(cf, fmt, key, meta[key])
                if problem:
                    bad.append(f"{s.path.name}: metadata {key}={meta[key]!r}: {problem}")
        if bad:
            out[s.path.name] = [Finding("metadata", 1, b) for b in bad]
    for key in ("fp4ref.recipe", "fp4ref.mode"):  # one quantize run records one option in every shard it writes
        seen = {s.path.name: s.metadata[key] for s in ckpt.shards if key in s.metadata}
        if len(set(seen.values())) > 1:
            told = ", ".join(f"{v!r} in {n}" for n, v in sorted(seen.items()))
            for name in seen:
                out.setdefault(name, []).append(Finding("metadata", 1, f"{name}: the shards record different {key} "
                                                                       f"values ({told})"))
    return out


def _recorded_option_problem(cf, fmt: str, key: str, value) -> str | None:
    """Why a shard's recorded ``fp4ref.recipe`` / ``fp4ref.mode`` ``value`` is not one the checkpoint's format and
    layout take (as resolve_target judges a --recipe / --mode), or None."""
    try:
        C.resolve_target(cf or "fp4ref", fmt, value if key == "fp4ref.recipe" else None,
                         value if key == "fp4ref.mode" else None)
    except (ValueError, TypeError) as e:  # QuantizeFileError is a ValueError; its text names --recipe / --mode
        return str(e).replace(" (--recipe)", "").replace(" (--mode)", "")
    return None


def audit_checkpoint(path, *, reference=None, recipe=None, mode=None) -> AuditReport:
    """Audit a quantized checkpoint (see the module docstring).

    Args:
        path: the quantized checkpoint (file, index or directory).
        reference: the original checkpoint; every quantized tensor is re-quantized from it and compared byte for
            byte. recipe / mode: the NVFP4 recipe / MX mode for that (default: the one recorded in the shards'
            ``fp4ref.recipe`` / ``fp4ref.mode``, else the layout's default).

    Returns:
        :class:`AuditReport`.

    Raises:
        TypeError: ``path`` or ``reference`` not a str or os.PathLike (named), ``recipe`` / ``mode`` neither a str
        nor an NVFP4Recipe / MXMode (named, with the names). ValueError: ``recipe`` / ``mode`` given without
        ``reference`` (they apply with ``reference`` only). CheckpointError / QuantizeFileError (ValueErrors):
        unreadable or unquantized checkpoint, an unknown recipe or mode name, a recipe with an MX checkpoint or a
        mode with an NVFP4 one, a reference that cannot be read, is already quantized or lacks a tensor. The
        messages name the argument (``reference=... (--reference)``, ``mode=... (--mode)``).
    """
    path_arg(path, "path")  # named as the arguments here, before any work (open_checkpoint says "input")
    if reference is not None:
        path_arg(reference, "reference")
    for arg, value, parse in (("recipe", recipe, _parse_recipe), ("mode", mode, _parse_mode)):
        if value is None:
            continue
        if not isinstance(value, str):
            parse(value)  # an NVFP4Recipe / MXMode passes; any other type is a TypeError naming the argument
        if reference is None:  # the CLI refuses the same: --recipe / --mode apply with --reference only
            raise ValueError(f"{arg}={value!r} applies with reference only (the original checkpoint, re-quantized "
                             f"with that {arg} and compared byte for byte); pass reference=... or leave {arg} out")
    ckpt = open_checkpoint(path)
    cf, fmt, option, layers = C.find_quantized_layers(ckpt)
    meta_bad = _metadata_findings(ckpt, fmt, cf)
    rows = []
    globals_ = {}
    for name in sorted(layers):
        L = layers[name]
        ta = TensorAudit(name, fmt, list(L.shape))
        ta.findings += meta_bad.get(L.shard, [])
        ta.findings += _check_layout(L, ckpt, cf)
        if not any(f.check == "layout" for f in ta.findings):
            found, row_max = _check_bytes(L, ckpt)
            ta.findings += found
            g = _global_values(L, ckpt, cf)
            if g is not None:
                globals_[name] = g
                bad = _bad_global(L, cf, g)
                if bad is not None:
                    ta.findings.append(bad)
            over = _decode_overflow(L, cf, row_max, g)
            if over is not None:
                ta.findings.append(over)
        rows.append(ta)
    by_name = {t.name: t for t in rows}
    groups = {}
    for name in globals_:
        key = C._fused_key(name)
        if key is not None:
            groups.setdefault(key, []).append(name)
    for key, members in groups.items():
        vals = {m: globals_[m].tolist() for m in members}
        if len({tuple(v) for v in vals.values()}) > 1:
            for m in members:
                by_name[m].findings.append(Finding("global-scale", 1, f"fused layer {key}: members' global scales "
                                                                      f"differ ({vals})"))
    whole = _config_findings(ckpt, cf, fmt, layers)
    copied = None
    if reference is not None:
        found, copied = _compare_reference(ckpt, cf, fmt, option, layers, by_name, reference, recipe, mode)
        whole += found
    return AuditReport(str(path), cf, fmt, rows, whole, copied)


_COMPARE_CHUNK = 64 * 2**20  # bytes of a copied tensor compared at a time


def _copied_tensor_findings(ckpt, ref, layers) -> tuple:
    """The reference's tensors other than the quantized layers against the checkpoint's: missing ones, and those
    stored with another dtype, shape or bytes (a quantizer copies them unchanged). ([Finding] (check "reference"),
    how many tensors were compared)."""
    missing, differ = [], []
    compared = 0
    for name in sorted(ref.weight_map):
        if name in layers:
            continue
        compared += 1
        if name not in ckpt.weight_map:
            missing.append(name)
            continue
        rs, cs = ref.shard_of(name), ckpt.shard_of(name)
        ri, ci = rs.tensors[name], cs.tensors[name]
        if (ri.dtype, tuple(ri.shape)) != (ci.dtype, tuple(ci.shape)):
            differ.append(f"{name} ({ri.dtype} {list(ri.shape)} stored as {ci.dtype} {list(ci.shape)})")
            continue
        for b in range(0, ri.nbytes, _COMPARE_CHUNK):
            e = min(b + _COMPARE_CHUNK, ri.nbytes)
            if rs.read_bytes(name, b, e) != cs.read_bytes(name, b, e):
                differ.append(f"{name} (bytes differ)")
                break
    out = []
    if missing:
        out.append(Finding("reference", len(missing), f"{len(missing)} tensor(s) of the reference are missing: "
                                                      f"{_some(missing)}"))
    if differ:
        out.append(Finding("reference", len(differ), f"{len(differ)} tensor(s) not quantized differ from the "
                                                     f"reference: {_some(differ)}"))
    return out, compared


def _some(names: list, most: int = 5) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names) - most} more)" if len(names) > most else "")


def _compare_reference(ckpt, cf, fmt, option, layers, by_name, reference, recipe, mode) -> tuple:
    """Re-quantize every quantized layer from ``reference`` and compare (findings on the layers' rows); returns the
    checkpoint-wide findings of the other tensors and how many were compared (``_copied_tensor_findings``)."""
    # (resolve_target refuses a mode for nvfp4 and a recipe for an MX format)
    flag = "--recipe" if fmt == "nvfp4" else "--mode"
    if (option is not None and (recipe if fmt == "nvfp4" else mode) is None
            and _recorded_option_problem(cf, fmt, "fp4ref." + flag[2:], option)):
        raise C.QuantizeFileError(f"the shards' recorded {flag[2:]} {option!r} (fp4ref metadata) is not one this "
                                  f"{fmt} checkpoint takes; pass {flag} to compare with the reference")
    target = C.resolve_target(cf, fmt, recipe if recipe is not None else option if fmt == "nvfp4" else None,
                              mode if mode is not None else option if fmt != "nvfp4" else None)
    try:
        ref = open_checkpoint(reference)
    except CheckpointError as e:  # its messages say "input": name the option
        raise CheckpointError(f"reference (--reference): {e}") from None
    done = C._already_quantized(ref)
    if done:
        raise C.QuantizeFileError(f"reference={str(reference)!r} (--reference) is already quantized ({done}): pass "
                                  "the original checkpoint")
    missing = sorted(n for n in layers if n not in ref.weight_map)
    if missing:
        raise C.QuantizeFileError(f"reference={str(reference)!r} (--reference) lacks tensor {missing[0]!r} of the "
                                  "audited checkpoint")
    amax = {}
    for n in layers:
        if any(f.check == "layout" for f in by_name[n].findings):  # its codes / scales cannot be read as stored
            by_name[n].reference = "- (layout)"
            continue
        info = ref.shard_of(n).tensors[n]
        if info.dtype not in C._QUANTIZABLE or tuple(info.shape) != tuple(layers[n].shape):
            by_name[n].findings.append(Finding("reference", 1, f"reference tensor is {info.dtype} "
                                                               f"{list(info.shape)}, expected {list(layers[n].shape)}"))
            continue
        a, bad = C._amax_task(C._AmaxTask(str(ref.shard_of(n).path), n, info.shape, info.nbytes))
        amax[n] = a
    group_amax = C._group_amax((C._fused_key(n), a) for n, a in amax.items())
    for n, a in amax.items():
        L = layers[n]
        key = C._fused_key(n)
        if key is not None:
            a = group_amax[key]
        t = C._QuantTask(str(ref.shard_of(n).path), n, tuple(L.shape), 0, None, {}, cf, fmt, target.block,
                         target.elem, target.option, L.k_padded, [float(v) for v in a])
        dc = ds = 0
        gvals = []
        cs, ss = ckpt.shard_of(L.codes), ckpt.shard_of(L.scale)
        for part in C.quantized_chunks(t):
            if part[0] == "global":
                gvals.append(part[2])
                continue
            _, row0, codes, scales, _stats = part
            r1 = row0 + codes.shape[0]
            dc += int(np.count_nonzero(cs.read_rows(L.codes, row0, r1).view(np.uint8).reshape(codes.shape)
                                       != codes.view(np.uint8)))
            ds += int(np.count_nonzero(ss.read_rows(L.scale, row0, r1).view(np.uint8).reshape(scales.shape)
                                       != scales.view(np.uint8)))
        dg = 0
        if fmt == "nvfp4":
            stored = _global_values(L, ckpt, cf)
            want = np.asarray(gvals, np.float32)
            dg = int(np.count_nonzero(stored.view(np.uint32) != want.view(np.uint32)))
        if dc or ds or dg:
            diffs = f"{dc} code byte(s), {ds} scale byte(s)"  # MX formats have no global scale: none counted
            by_name[n].reference = "differs: " + diffs + (f", {dg} global scale(s)" if fmt == "nvfp4" else "")
            by_name[n].findings.append(Finding("reference", dc + ds + dg, by_name[n].reference + f" (recipe/mode "
                                                                                              f"{target.option})"))
        else:
            by_name[n].reference = "equal"
    return _copied_tensor_findings(ckpt, ref, layers)


# ----------------------------------------------------------------------------------------------------------- CLI


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``audit`` subcommand on an argparse subparsers object; sets ``func=run``."""
    p = subparsers.add_parser("audit", help="check the scales, padding, layout and global scales of a quantized "
                                            "checkpoint (exit 0 iff clean)",
                              description=_DESCRIPTION)
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    from .blockscale import MXMode, NVFP4Recipe

    p.add_argument("path", metavar="PATH", type=path_option,
                   help="quantized checkpoint: .safetensors file, index or directory")
    p.add_argument("--reference", metavar="ORIGINAL", type=path_option, action=OnceAction,
                   help="original checkpoint: re-quantize and compare bytes")
    p.add_argument("--recipe", choices=[r.value for r in NVFP4Recipe], type=str.lower, action=OnceAction,
                   help="NVFP4 recipe for --reference (default: the recorded one)")
    p.add_argument("--mode", choices=[m.value for m in MXMode], type=str.lower, action=OnceAction,
                   help="MX mode for --reference (default: recorded)")
    p.add_argument("--json", metavar="FILE", type=path_option, action=OnceAction,
                   help="write the report as JSON to FILE ('-' for stdout; an existing FILE only with --force)")
    p.add_argument("--force", action="store_true", help="replace an existing --json output")
    p.add_argument("--quiet", action="store_true",
                   help="no table (without one, a failed audit prints its summary line to stderr; so does --json -)")


def run(args) -> int:
    """Run ``fp4ref audit`` from parsed ``args``: 0 clean, 1 findings, 2 bad arguments or input, 130 Ctrl-C, 143
    SIGTERM."""
    if (args.recipe or args.mode) and not args.reference:
        print("fp4ref audit: error: --recipe / --mode apply with --reference only", file=sys.stderr)
        return 2
    if args.force and (not args.json or args.json == STDOUT):  # it replaces a --json FILE: else a no-op
        print("fp4ref audit: error: --force applies with --json FILE only (not alone, not with --json -)",
              file=sys.stderr)
        return 2
    if args.json:
        try:
            check_report_path(args.json, "--json", force=args.force, inputs=(args.path, args.reference))
        except ValueError as e:
            print(f"fp4ref audit: error: {e}", file=sys.stderr)
            return 2
    to_file = bool(args.json) and args.json != STDOUT
    written = False
    with sigterm_as_interrupt() as stop:  # SIGTERM takes Ctrl-C's path, exit 143
        try:
            try:
                report = audit_checkpoint(args.path, reference=args.reference, recipe=args.recipe, mode=args.mode)
            except (CheckpointError, ValueError) as e:
                print(f"fp4ref audit: error: {e}", file=sys.stderr)
                return 2
            if args.json:
                text = json.dumps(report.to_json(), indent=2, allow_nan=False)
                try:  # a file whole or not at all: a Ctrl-C or a full disk leaves no partial report
                    emit_report(args.json, text + "\n")
                except OSError as e:
                    print(f"fp4ref audit: error: --json {args.json!r}: cannot write it ({e.strerror or e})",
                          file=sys.stderr)
                    return 2
                written = to_file
            if not args.quiet and args.json != STDOUT:  # standard output holds the JSON alone
                _print_table(report)
            elif not report.clean:  # no table: the exit status and one line on stderr say what failed
                print(f"fp4ref audit: {_summary(report)} ({args.path})", file=sys.stderr)
        except KeyboardInterrupt:  # one line saying what is on disk, no traceback
            said = "nothing written" if not to_file else f"{args.json} is complete" if written else \
                "no --json report written"
            print(f"fp4ref audit: {stop.word}; {said}", file=sys.stderr)
            return stop.status
    return 0 if report.clean else 1


def _print_table(report: AuditReport) -> None:
    from rich.console import Console
    from rich.table import Table

    from rich.text import Text

    from ._tables_rich import print_table

    # Text cells: values such as "[nan]" and tensor names are text, never rich markup (tags would vanish, and an
    # escaped trailing backslash would show twice)
    t = Table(title=Text(f"fp4ref audit {report.path} ({report.checkpoint_format} {report.fmt})"))
    for col in ("tensor", "shape", "checks", "reference"):
        t.add_column(col, overflow="fold")  # a narrow terminal folds names over lines, never cuts them to "…"
    for r in report.tensors:
        # a failed reference check is shown once: in the reference column, with its detail
        ref = "; ".join(f.detail for f in r.findings if f.check == "reference") or r.reference
        checks = "; ".join(f"{f.check}: {f.detail}" for f in r.findings if f.check != "reference") or "ok"
        t.add_row(*(Text(C._shown_name(v)) for v in (r.name, str(r.shape), checks, ref)))
    console = Console()
    print_table(console, t, whole=("shape",))
    for f in report.findings:  # the checkpoint-wide checks, below the per-tensor table
        console.print(Text(C._shown_name(f"checkpoint {f.check}: {f.detail}")))
    console.print(_summary(report))


def _summary(report: AuditReport) -> str:
    """The table's last line (and --quiet's stderr line for a failed audit)."""
    if report.clean:
        if report.copied_checked is None:
            return "clean"
        return f"clean ({report.copied_checked} tensor(s) of the reference that were not quantized: equal)"
    bad = sum(not r.clean for r in report.tensors)
    what = [f"{bad} of {len(report.tensors)} tensor(s) FAIL"] if bad else []
    what += [f"{len(report.findings)} checkpoint finding(s)"] if report.findings else []
    return "; ".join(what)


def main(argv=None) -> int:
    """Standalone entry point (``python -m fp4ref.audit``)."""
    p = argparse.ArgumentParser(prog="fp4ref audit", description=_DESCRIPTION)
    _add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())

