"""``fp4ref quantize``: quantize (or dequantize) the weights of a safetensors file.

Usage::

    fp4ref quantize IN.safetensors -o OUT.safetensors --format nvfp4|mxfp4|mxfp8 [--recipe te] [--mode floor]
                    [--include REGEX] [--quiet]
    fp4ref quantize OUT.safetensors -o DEQ.safetensors --dequantize

Which tensors: every 2-D floating tensor (F16, BF16, F32) whose name matches ``--include`` (``re.search``; default:
all) and whose last dimension K is a multiple of the block (16 for NVFP4, 32 for MX). Every other tensor is copied
unchanged and listed as skipped with the reason (F64 tensors are skipped: the recipes take float32 values).

Tensor names written for a quantized tensor NAME (ModelOpt's NVFP4 checkpoint convention: ``weight``,
``weight_scale``, ``weight_scale_2``):

* nvfp4: NAME U8 [N, K/2] packed E2M1 (element 2i low); NAME_scale F8_E4M3 [N, K/16] block scales;
  NAME_scale_2 F32 [] global decode scale.
* mxfp4: NAME U8 [N, K/2] packed E2M1; NAME_scale U8 [N, K/32] UE8M0 bytes.
* mxfp8: NAME F8_E4M3 [N, K]; NAME_scale U8 [N, K/32] UE8M0 bytes.

Values: nvfp4 ``w = e2m1(NAME) * e4m3(NAME_scale) * NAME_scale_2``; MX ``w = elem(NAME) * 2^(NAME_scale - 127)``.
The header's ``__metadata__`` keeps the input's entries and adds ``fp4ref.format``, ``fp4ref.recipe`` (nvfp4) or
``fp4ref.mode`` (MX), ``fp4ref.block`` and ``fp4ref.tensors`` (JSON: original shape and dtype of each quantized
tensor), which ``--dequantize`` reads to restore each quantized tensor as F32 (value exactly
:func:`fp4ref.blockscale.nvfp4_dequantize` / :func:`~fp4ref.blockscale.mx_dequantize`, one fp32 rounding).

Bad input (missing file, not a safetensors file, ``--include`` matching no tensor, output path equal to the input,
an output name that would collide with an input tensor) gives a clear error and writes nothing. The output is
written atomically: a temporary file in the output's directory, then ``os.replace``.

CLI wiring (fp4ref/cli.py): ``add_parser(subparsers)`` registers the ``quantize`` subcommand with
``func=run``; ``run(args) -> int`` is the exit status. ``main(argv)`` runs it standalone.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

from .blockscale import (
    MX_ELEMENTS,
    MXMode,
    MXTensor,
    NVFP4Recipe,
    NVFP4Tensor,
    mx_dequantize,
    mx_quantize,
    nvfp4_dequantize,
    nvfp4_quantize,
)
from .packing import pack_fp4, unpack_fp4

__all__ = [
    "FORMATS",
    "QuantizeFileError",
    "TensorReport",
    "quantize_file",
    "dequantize_file",
    "add_parser",
    "run",
    "main",
]

#: --format name -> (block, MX element or None)
FORMATS = {"nvfp4": (16, None), "mxfp4": (32, "e2m1"), "mxfp8": (32, "e4m3")}

# safetensors dtype string -> numpy dtype (ml_dtypes for the ones numpy lacks). F4 (packed) is not supported.
_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64), "U32": np.dtype(np.uint32), "U16": np.dtype(np.uint16), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(bool),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}
_QUANTIZABLE = ("F16", "BF16", "F32")


class QuantizeFileError(ValueError):
    """A bad input to quantize_file / dequantize_file (nothing was written)."""


@dataclass
class TensorReport:
    """One line of the per-tensor table.

    Attributes: name; shape (of the original tensor); dtype (safetensors dtype string); action ("quantized",
    "dequantized" or "copied"); reason (why a tensor was copied); sqnr_db (10 log10(sum x^2 / sum (x - x_hat)^2),
    exact in float64; inf when x_hat == x); max_abs_err; zero_blocks (blocks whose amax is 0); seconds.
    """

    name: str
    shape: tuple
    dtype: str
    action: str
    reason: str = ""
    sqnr_db: float = math.nan
    max_abs_err: float = math.nan
    zero_blocks: int = 0
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------------------- I/O


def _read(path) -> tuple[dict, dict, dict]:
    """(tensors name -> array, dtype strings name -> str, metadata) of a safetensors file, sorted by name."""
    from safetensors import SafetensorError, deserialize, safe_open

    p = Path(path)
    if not p.exists():
        raise QuantizeFileError(f"input file {str(p)!r} does not exist")
    if not p.is_file():
        raise QuantizeFileError(f"input {str(p)!r} is not a regular file")
    try:
        with safe_open(str(p), framework="np") as f:
            metadata = dict(f.metadata() or {})
        flat = deserialize(p.read_bytes())
    except (SafetensorError, OSError, ValueError) as e:
        raise QuantizeFileError(f"{str(p)!r} is not a readable safetensors file: {e}") from None
    tensors, dtypes = {}, {}
    for name, info in sorted(flat, key=lambda item: item[0]):
        dt = info["dtype"]
        if dt not in _DTYPES:
            raise QuantizeFileError(
                f"tensor {name!r} in {str(p)!r} has dtype {dt}, which fp4ref quantize does not support "
                f"(supported: {sorted(_DTYPES)})"
            )
        tensors[name] = np.frombuffer(info["data"], dtype=_DTYPES[dt]).reshape(info["shape"])
        dtypes[name] = dt
    return tensors, dtypes, metadata


def _write_atomic(tensors: dict, metadata: dict, out: Path) -> None:
    from safetensors.numpy import save_file

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=str(out.parent))
    except OSError as e:
        raise QuantizeFileError(f"cannot write in {str(out.parent)!r}: {e.strerror}") from None
    os.close(fd)
    try:
        # (np.ascontiguousarray would turn a 0-d array such as weight_scale_2 into shape [1])
        arrays = {k: v if v.flags.c_contiguous else v.copy(order="C") for k, v in tensors.items()}
        save_file(arrays, tmp, metadata=metadata)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _check_paths(in_path, out_path) -> tuple[Path, Path]:
    src, dst = Path(in_path), Path(out_path)
    same = src.resolve() == dst.resolve()
    if not same and dst.exists() and src.exists():
        try:
            same = os.path.samefile(src, dst)
        except OSError:
            same = False
    if same:
        raise QuantizeFileError(f"output path {str(dst)!r} is the input file; choose another output path")
    if dst.exists() and dst.is_dir():
        raise QuantizeFileError(f"output path {str(dst)!r} is a directory")
    if not dst.parent.is_dir():
        raise QuantizeFileError(f"output directory {str(dst.parent)!r} does not exist (fp4ref quantize creates no "
                                "directories)")
    return src, dst


def _compile_include(include):
    if include is None:
        return None
    try:
        return re.compile(include)
    except re.error as e:
        raise QuantizeFileError(f"--include {include!r} is not a valid regular expression: {e}") from None


# ------------------------------------------------------------------------------------------------------- quantize


def _stats(x32: np.ndarray, xhat: np.ndarray) -> tuple[float, float]:
    x = x32.astype(np.float64)
    err = x - xhat.astype(np.float64)
    num, den = float(np.sum(x * x)), float(np.sum(err * err))
    if den == 0:
        sqnr = math.inf
    elif num == 0:
        sqnr = -math.inf
    else:
        sqnr = 10.0 * math.log10(num / den)
    return sqnr, float(np.max(np.abs(err))) if err.size else 0.0


def _eligibility(name: str, arr: np.ndarray, dt: str, block: int, pattern) -> str:
    """'' if the tensor is quantized, else the reason it is copied."""
    if pattern is not None and not pattern.search(name):
        return "excluded by --include"
    if dt not in _QUANTIZABLE:
        return f"dtype {dt} (quantized: {', '.join(_QUANTIZABLE)})"
    if arr.ndim != 2:
        return f"{arr.ndim}-D (quantized: 2-D)"
    if arr.shape[1] % block or arr.shape[1] == 0:
        return f"K={arr.shape[1]} is not a positive multiple of {block}"
    if arr.size == 0:
        return "empty (0 rows)"
    return ""


def quantize_file(in_path, out_path, *, fmt: str = "nvfp4", recipe: str | None = None, mode: str | None = None,
                  include: str | None = None, progress: bool = False) -> list[TensorReport]:
    """Quantize the eligible tensors of ``in_path`` into ``out_path`` (see the module docstring).

    Args:
        in_path, out_path: file paths (must differ).
        fmt: ``"nvfp4"``, ``"mxfp4"`` or ``"mxfp8"``.
        recipe: NVFP4 recipe (:class:`fp4ref.blockscale.NVFP4Recipe`); nvfp4 only (None: "te").
        mode: MX scale mode (:class:`fp4ref.blockscale.MXMode`); mxfp4/mxfp8 only (None: "floor").
        include: regular expression; only tensors whose name matches (``re.search``) are quantized.
        progress: show a rich progress bar on stderr.

    Returns:
        One :class:`TensorReport` per input tensor, sorted by name.

    Raises:
        QuantizeFileError (a ValueError): bad paths, not a safetensors file, bad ``fmt``/``recipe``/``mode``,
        ``include`` matching no tensor name, an output name collision. Nothing is written then.
    """
    if fmt not in FORMATS:
        raise QuantizeFileError(f"--format {fmt!r} is not one of {list(FORMATS)}")
    block, elem = FORMATS[fmt]
    if fmt == "nvfp4" and mode is not None:
        raise QuantizeFileError("--mode applies to mxfp4/mxfp8, not nvfp4")
    if fmt != "nvfp4" and recipe is not None:
        raise QuantizeFileError(f"--recipe applies to nvfp4, not {fmt}")
    try:
        rec = NVFP4Recipe(recipe or "te")
        md = MXMode(mode or "floor")
    except ValueError as e:
        raise QuantizeFileError(str(e)) from None
    src, dst = _check_paths(in_path, out_path)
    pattern = _compile_include(include)
    tensors, dtypes, metadata = _read(src)
    if "fp4ref.format" in metadata:
        raise QuantizeFileError(
            f"{str(src)!r} is already quantized by fp4ref (fp4ref.format={metadata['fp4ref.format']!r}); "
            "quantizing packed codes again would destroy them: use --dequantize first"
        )
    if pattern is not None and not any(pattern.search(n) for n in tensors):
        raise QuantizeFileError(
            f"--include {include!r} matches none of the {len(tensors)} tensor names in {str(src)!r}"
        )
    plan = {n: _eligibility(n, a, dtypes[n], block, pattern) for n, a in tensors.items()}
    if all(plan.values()):
        reasons = "; ".join(f"{n}: {why}" for n, why in list(plan.items())[:5])
        raise QuantizeFileError(f"no tensor of {str(src)!r} can be quantized to {fmt} ({reasons}"
                                f"{'; ...' if len(plan) > 5 else ''})")
    for n, why in plan.items():
        if not why:
            with np.errstate(invalid="ignore"):
                bad = int(np.sum(~np.isfinite(tensors[n].astype(np.float32))))
            if bad:
                raise QuantizeFileError(
                    f"tensor {n!r} holds {bad} NaN/inf value(s); fp4ref quantize refuses non-finite weights "
                    "(leave the tensor out with --include, or fix the checkpoint)"
                )
    suffixes = ("_scale", "_scale_2") if fmt == "nvfp4" else ("_scale",)
    for n, why in plan.items():
        if not why:
            for s in suffixes:
                if n + s in tensors:
                    raise QuantizeFileError(
                        f"output name {n + s!r} for quantized tensor {n!r} collides with an input tensor of that "
                        f"name (which would be copied to the output too); rename one of them, or keep {n!r} "
                        "unquantized with an --include that does not match it"
                    )

    out: dict = {}
    reports: list[TensorReport] = []
    quantized_meta: dict = {}
    bar = _Progress(progress, total=sum(1 for w in plan.values() if not w))
    with bar:
        for name, arr in tensors.items():
            why = plan[name]
            if why:
                out[name] = arr
                reports.append(TensorReport(name, tuple(arr.shape), dtypes[name], "copied", reason=why))
                continue
            t0 = time.perf_counter()
            x32 = arr.astype(np.float32)
            if fmt == "nvfp4":
                t = nvfp4_quantize(x32, recipe=rec)
                xhat = nvfp4_dequantize(t)
                out[name] = t.codes
                out[name + "_scale"] = t.scales.view(ml_dtypes.float8_e4m3fn)
                out[name + "_scale_2"] = np.asarray(t.global_decode_scale, dtype=np.float32).reshape(())
            else:
                t = mx_quantize(x32, elem, mode=md, block=block)
                xhat = mx_dequantize(t)
                out[name] = pack_fp4(t.codes) if elem == "e2m1" else t.codes.view(ml_dtypes.float8_e4m3fn)
                out[name + "_scale"] = t.scales
            secs = time.perf_counter() - t0
            sqnr, maxerr = _stats(x32, xhat)
            zero_blocks = int(np.sum(np.max(np.abs(x32.reshape(x32.shape[0], -1, block)), axis=-1) == 0))
            reports.append(TensorReport(name, tuple(arr.shape), dtypes[name], "quantized", sqnr_db=sqnr,
                                        max_abs_err=maxerr, zero_blocks=zero_blocks, seconds=secs))
            quantized_meta[name] = {"shape": list(arr.shape), "dtype": dtypes[name]}
            bar.advance(name)
    meta = {k: str(v) for k, v in metadata.items()}
    meta.update({
        "fp4ref.format": fmt,
        "fp4ref.block": str(block),
        "fp4ref.tensors": json.dumps(quantized_meta, separators=(",", ":")),
    })
    if fmt == "nvfp4":
        meta["fp4ref.recipe"] = rec.value
    else:
        meta["fp4ref.mode"] = md.value
    _write_atomic(out, meta, dst)
    return reports


def dequantize_file(in_path, out_path, *, progress: bool = False) -> list[TensorReport]:
    """Reverse :func:`quantize_file`: every tensor listed in ``fp4ref.tensors`` becomes F32 again.

    Raises:
        QuantizeFileError: bad paths, not a safetensors file, or a file without fp4ref metadata.
    """
    src, dst = _check_paths(in_path, out_path)
    tensors, dtypes, metadata = _read(src)
    fmt = metadata.get("fp4ref.format")
    if fmt not in FORMATS or "fp4ref.tensors" not in metadata:
        raise QuantizeFileError(
            f"{str(src)!r} has no fp4ref quantization metadata (fp4ref.format / fp4ref.tensors); "
            "--dequantize reads files written by fp4ref quantize"
        )
    block, elem = FORMATS[fmt]
    try:
        listed = json.loads(metadata["fp4ref.tensors"])
    except json.JSONDecodeError as e:
        raise QuantizeFileError(f"fp4ref.tensors metadata of {str(src)!r} is not JSON: {e}") from None
    derived = set()
    for name in listed:
        for s in ("", "_scale") + (("_scale_2",) if fmt == "nvfp4" else ()):
            if name + s not in tensors:
                raise QuantizeFileError(f"{str(src)!r} lists {name!r} as quantized but has no tensor {name + s!r}")
            derived.add(name + s)
    out: dict = {}
    reports: list[TensorReport] = []
    with _Progress(progress, total=len(listed)) as bar:
        for name, arr in tensors.items():
            if name in derived and name not in listed:
                continue
            if name not in listed:
                out[name] = arr
                reports.append(TensorReport(name, tuple(arr.shape), dtypes[name], "copied", reason="not quantized"))
                continue
            t0 = time.perf_counter()
            shape = tuple(listed[name]["shape"])
            scales = np.asarray(tensors[name + "_scale"]).view(np.uint8)
            if fmt == "nvfp4":
                g = np.float32(np.asarray(tensors[name + "_scale_2"], dtype=np.float32).reshape(()))
                t = NVFP4Tensor(codes=np.asarray(arr).view(np.uint8), scales=scales, global_decode_scale=g,
                                shape=shape, recipe=metadata.get("fp4ref.recipe", ""), block=(1, 16), axis=1)
                value = nvfp4_dequantize(t)
            else:
                codes = unpack_fp4(np.asarray(arr).view(np.uint8)) if elem == "e2m1" else np.asarray(arr).view(np.uint8)
                t = MXTensor(codes=codes, scales=scales, elem=elem, mode=metadata.get("fp4ref.mode", ""),
                             block=block, shape=shape, axis=1)
                value = mx_dequantize(t)
            out[name] = value
            reports.append(TensorReport(name, shape, "F32", "dequantized", seconds=time.perf_counter() - t0))
            bar.advance(name)
    meta = {k: v for k, v in metadata.items() if not k.startswith("fp4ref.")}
    meta["fp4ref.dequantized_from"] = fmt
    _write_atomic(out, meta, dst)
    return reports


# ------------------------------------------------------------------------------------------------------- display


class _Progress:
    """A rich progress bar on stderr (or nothing)."""

    def __init__(self, enabled: bool, total: int):
        self._p = None
        self._task = None
        if enabled and total:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                               TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                               console=Console(stderr=True), transient=True)
            self._total = total

    def __enter__(self):
        if self._p is not None:
            self._p.__enter__()
            self._task = self._p.add_task("quantize", total=self._total)
        return self

    def advance(self, name: str) -> None:
        if self._p is not None:
            self._p.update(self._task, advance=1, description=name[-40:])

    def __exit__(self, *exc):
        if self._p is not None:
            self._p.__exit__(*exc)
        return False


def _fmt_db(v: float) -> str:
    if math.isnan(v):
        return "-"
    return "inf" if math.isinf(v) and v > 0 else f"{v:.2f}"


def print_report(reports: list[TensorReport], *, title: str, file=None) -> None:
    """Print the per-tensor table (rich) to ``file`` (default stdout)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col, just in (("tensor", "left"), ("shape", "left"), ("dtype", "left"), ("action", "left"),
                      ("SQNR dB", "right"), ("max |err|", "right"), ("zero blocks", "right"), ("ms", "right")):
        table.add_column(col, justify=just)
    for r in reports:
        if r.action == "copied":
            table.add_row(r.name, str(list(r.shape)), r.dtype, f"skipped: {r.reason}", "", "", "", "")
        else:
            err = "-" if math.isnan(r.max_abs_err) else f"{r.max_abs_err:.4g}"
            zb = "-" if r.action != "quantized" else str(r.zero_blocks)
            table.add_row(r.name, str(list(r.shape)), r.dtype, r.action, _fmt_db(r.sqnr_db), err, zb,
                          f"{1e3 * r.seconds:.1f}")
    Console(file=file or sys.stdout, width=160).print(table)


# ----------------------------------------------------------------------------------------------------------- CLI


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``quantize`` subcommand on an argparse subparsers object; sets ``func=run``."""
    p = subparsers.add_parser(
        "quantize",
        help="quantize the 2-D weights of a safetensors file to NVFP4 / MXFP4 / MXFP8 (or --dequantize)",
        description=(__doc__ or "").split("\n\n")[0],
    )
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN.safetensors", help="input safetensors file (never modified)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.safetensors",
                   help="output file (written atomically; must differ from the input)")
    p.add_argument("--format", choices=list(FORMATS), default=None, help="target format (default nvfp4)")
    p.add_argument("--recipe", choices=[r.value for r in NVFP4Recipe], default=None,
                   help="NVFP4 recipe (nvfp4 only; default te; see docs/quantization.md)")
    p.add_argument("--mode", choices=[m.value for m in MXMode], default=None,
                   help="MX scale mode (mxfp4/mxfp8 only; default floor, OCP)")
    p.add_argument("--include", metavar="REGEX", default=None,
                   help="quantize only tensors whose name matches REGEX (re.search); others are copied")
    p.add_argument("--dequantize", action="store_true",
                   help="reverse: read a file written by fp4ref quantize and write F32 tensors")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no table")


def run(args) -> int:
    """Run the subcommand from parsed ``args``; returns the exit status (0 ok, 2 bad input)."""
    show = not args.quiet
    given = [f"--{k}" for k in ("format", "recipe", "mode", "include") if getattr(args, k) is not None]
    if args.dequantize and given:
        print(f"fp4ref quantize: error: {', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to "
              "--dequantize", file=sys.stderr)
        return 2
    fmt = args.format or "nvfp4"
    try:
        if args.dequantize:
            reports = dequantize_file(args.input, args.output, progress=show)
            title = f"fp4ref quantize --dequantize {args.input} -> {args.output}"
        else:
            reports = quantize_file(args.input, args.output, fmt=fmt, recipe=args.recipe, mode=args.mode,
                                    include=args.include, progress=show)
            what = f"recipe {args.recipe or 'te'}" if fmt == "nvfp4" else f"mode {args.mode or 'floor'}"
            title = f"fp4ref quantize {args.input} -> {args.output} ({fmt}, {what})"
    except QuantizeFileError as e:
        print(f"fp4ref quantize: error: {e}", file=sys.stderr)
        return 2
    if show:
        print_report(reports, title=title)
    return 0


def main(argv=None) -> int:
    """Standalone entry point (``python -m fp4ref.quantize_file ...``); returns the exit status."""
    p = argparse.ArgumentParser(prog="fp4ref quantize", description=(__doc__ or "").split("\n\n")[0])
    _add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
