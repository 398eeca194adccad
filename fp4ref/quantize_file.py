"""``fp4ref quantize``: quantize (or dequantize) the weights of a safetensors file, a sharded checkpoint or a Hugging
Face model directory, in fp4ref's layout or the layouts serving stacks load (ModelOpt, compressed-tensors).

Usage::

    fp4ref quantize IN -o OUT [--format nvfp4|mxfp4|mxfp8] [--checkpoint-format fp4ref|modelopt|compressed-tensors]
                    [--recipe R] [--mode M] [--include REGEX] [--ignore REGEX ...] [--no-default-ignore]
                    [--pad] [--jobs N] [--force] [--dry-run] [--quiet]
    fp4ref quantize QUANTIZED -o OUT --dequantize [--dtype float32|bfloat16|float16] [--jobs N] [--force]

IN is one ``*.safetensors`` file, a ``*.safetensors.index.json`` or a model directory; OUT is a directory (same
sharding, rewritten index, config files) unless IN is one file and OUT ends in ``.safetensors`` (fp4ref layout only);
an OUT ending in ``/`` is a directory whatever its name.
The engine, the layouts and the formats' sources are in :mod:`fp4ref.checkpoint`; docs/checkpoints.md is the page.

fp4ref's own layout (``--checkpoint-format fp4ref``, the default) for a quantized tensor NAME: nvfp4: NAME U8 [N, K/2]
packed E2M1 (element 2i low); NAME_scale F8_E4M3 [N, K/16]; NAME_scale_2 F32 [] global decode scale. mxfp4: NAME
U8 [N, K/2]; NAME_scale U8 [N, K/32] UE8M0 bytes. mxfp8: NAME F8_E4M3 [N, K]; NAME_scale U8 [N, K/32]. Values:
nvfp4 ``w = e2m1(NAME) * e4m3(NAME_scale) * NAME_scale_2``; MX ``w = elem(NAME) * 2^(NAME_scale - 127)``. The
header's ``__metadata__`` keeps the input's entries and adds ``fp4ref.format``, ``fp4ref.checkpoint_format``,
``fp4ref.recipe`` (nvfp4) or ``fp4ref.mode`` (MX), ``fp4ref.block`` and ``fp4ref.tensors`` (JSON: original shape and
dtype of each quantized tensor), which ``--dequantize`` reads to restore each tensor in its original dtype (or
``--dtype``): the exact decoded value rounded once (RNE).

Bad input gives a clear error (exit status 2) and writes nothing; an existing output is replaced only with
``--force``; the output is built under a temporary name beside it and renamed on success; Ctrl-C removes the
partial output, prints one line and exits with status 130; SIGTERM (``kill``, ``timeout``) does the same and
exits with status 143.

CLI wiring (fp4ref/cli.py): ``add_parser(subparsers)`` registers the ``quantize`` subcommand with
``func=run``; ``run(args) -> int`` is the exit status. ``main(argv)`` runs it standalone.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .blockscale import MXMode, NVFP4Recipe
from .checkpoint import (
    CHECKPOINT_FORMATS,
    DEFAULT_IGNORE,
    FORMATS,
    LAYOUTS,
    QuantizeFileError,
    TensorReport,
    _dequantize_checkpoint,
    _quantize_checkpoint,
    dequantize_checkpoint,
    parse_dtype,
    print_report,
    quantize_checkpoint,
)
from ._validate import STDOUT, OnceAction, Stop, help_description, sigterm_as_interrupt
from .checkpoint_io import CheckpointError

__all__ = [
    "FORMATS",
    "QuantizeFileError",
    "TensorReport",
    "quantize_file",
    "dequantize_file",
    "print_report",
    "add_parser",
    "run",
    "main",
]

_DESCRIPTION = help_description(__doc__)


def quantize_file(in_path, out_path, *, fmt: str = "nvfp4", recipe: str | None = None, mode: str | None = None,
                  include: str | None = None, progress: bool = False, checkpoint_format: str = "fp4ref",
                  ignore=None, jobs: int = 1, force: bool = False) -> list:
    """Quantize the eligible tensors of ``in_path`` into ``out_path``: :func:`fp4ref.checkpoint.quantize_checkpoint`
    with fp4ref's layout by default (see the module docstring).

    Args:
        in_path, out_path: paths (must differ; an existing output is replaced only with ``force``).
        fmt: ``"nvfp4"``, ``"mxfp4"`` or ``"mxfp8"``, any case (as ``checkpoint_format``).
        recipe: NVFP4 recipe (:class:`fp4ref.blockscale.NVFP4Recipe`); nvfp4 only.
        mode: MX scale mode (:class:`fp4ref.blockscale.MXMode`); mxfp4/mxfp8 only.
        include: regular expression; only tensors whose name matches (``re.search``) are quantized.
        progress: show progress on stderr. checkpoint_format, ignore, jobs, force: as quantize_checkpoint.

    Returns:
        One :class:`TensorReport` per input tensor, sorted by name.

    Raises:
        TypeError: a path, ``fmt``, ``checkpoint_format``, ``include``, ``ignore``, ``recipe``, ``mode``, ``jobs``
        or flag of the wrong type.
        QuantizeFileError (a ValueError): bad paths, not a safetensors file, bad ``fmt``/``recipe``/``mode``,
        ``include`` matching no tensor name, an output name collision, a non-finite weight. Nothing is written then.
    """
    return quantize_checkpoint(in_path, out_path, fmt=fmt, checkpoint_format=checkpoint_format, recipe=recipe,
                               mode=mode, include=include, ignore=ignore, jobs=jobs, force=force, progress=progress)


def dequantize_file(in_path, out_path, *, progress: bool = False, dtype=None, jobs: int = 1,
                    force: bool = False) -> list:
    """Reverse :func:`quantize_file`: :func:`fp4ref.checkpoint.dequantize_checkpoint` (every quantized tensor back
    in its original dtype, or ``dtype``: a name or a numpy dtype, as :func:`fp4ref.checkpoint.parse_dtype` reads it).

    Raises:
        TypeError: a path, flag, ``jobs`` or ``dtype`` of the wrong type. ValueError: another ``dtype``.
        QuantizeFileError: bad paths, not a safetensors file, or a file without quantization metadata.
    """
    return dequantize_checkpoint(in_path, out_path, dtype=dtype, jobs=jobs, force=force, progress=progress)


# ----------------------------------------------------------------------------------------------------------- CLI


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``quantize`` subcommand on an argparse subparsers object; sets ``func=run``."""
    p = subparsers.add_parser(
        "quantize",
        help="quantize a safetensors file, sharded checkpoint or model directory to NVFP4 / MXFP4 / MXFP8 "
             "(fp4ref, ModelOpt or compressed-tensors layout), or --dequantize",
        description=_DESCRIPTION,
    )
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return n


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN", help="a .safetensors file, a *.safetensors.index.json or a model directory "
                                              "(never modified)")
    p.add_argument("-o", "--output", metavar="OUT", default=None, action=OnceAction,
                   help="output directory, or a .safetensors file when IN is one file (fp4ref layout; a trailing / "
                        "makes it a directory whatever its name); built under a temporary name and renamed on "
                        "success (required unless --dry-run; '-' is refused: a checkpoint is files, not stdout)")
    p.add_argument("--format", choices=list(FORMATS), type=str.lower, default=None, action=OnceAction,
                   help="target format (default nvfp4)")
    p.add_argument("--checkpoint-format", choices=list(CHECKPOINT_FORMATS), type=str.lower, default=None,
                   action=OnceAction,
                   help="tensor names and config files: fp4ref (default), modelopt (nvidia-modelopt 0.47.0 unified "
                        "HF export) or compressed-tensors (0.20.1); see docs/checkpoints.md")
    p.add_argument("--recipe", choices=[r.value for r in NVFP4Recipe], type=str.lower, default=None, action=OnceAction,
                   help="NVFP4 recipe (nvfp4 only; default te, modelopt for --checkpoint-format modelopt; "
                        "compressed-tensors takes te, sol and the te-4over6 recipes, which have a global encode scale)")
    p.add_argument("--mode", choices=[m.value for m in MXMode], type=str.lower, default=None, action=OnceAction,
                   help="MX scale mode (mxfp4/mxfp8 only; default floor, rceil for modelopt)")
    p.add_argument("--include", metavar="REGEX", default=None, action=OnceAction,
                   help="quantize only tensors whose name matches REGEX (re.search; one REGEX: join names with |); "
                        "others are copied")
    p.add_argument("--ignore", metavar="REGEX", action="append", default=None,
                   help="never quantize tensors whose name matches REGEX (repeatable); added to the defaults of the "
                        "serving layouts (lm_head, embeddings, norms, router/gate, vision towers)")
    p.add_argument("--no-default-ignore", action="store_true",
                   help="drop the default --ignore patterns of the serving layouts")
    p.add_argument("--pad", action="store_true",
                   help="fp4ref layout only: zero-pad K to a multiple of the block instead of copying such tensors")
    p.add_argument("--jobs", type=_jobs, default=1, metavar="N", action=OnceAction,
                   help="worker processes (default 1; at most one per CPU and per tensor are started); the output "
                        "bytes are the same for every N")
    p.add_argument("--force", action="store_true",
                   help="replace an existing output (a directory only by a previous output of the same checkpoint "
                        "and layout: one holding files the new output does not replace is refused; never a file by "
                        "a directory or a directory by a file)")
    p.add_argument("--dry-run", action="store_true",
                   help="list what would be quantized and write nothing; reads the headers only, not the tensor "
                        "values, so it cannot see what the real run refuses for values (weights holding NaN/inf, MX "
                        "weights whose decoded values would overflow): it lists them as quantized")
    p.add_argument("--dequantize", action="store_true",
                   help="reverse: read a quantized checkpoint (any layout) and write floating tensors")
    p.add_argument("--dtype", default=None, metavar="DTYPE", action=OnceAction,
                   help="--dequantize only: float32, bfloat16 or float16 for the dequantized tensors (default: each "
                        "tensor's original dtype); tensors that were not quantized keep their bytes and dtype")
    p.add_argument("--quiet", action="store_true", help="no progress and no table (--dry-run still prints its plan)")


#: The line under a dry run's table: what the plan cannot check, as it reads no values.
DRY_RUN_NOTE = ("fp4ref quantize: note: a dry run reads the tensor headers only, not their values, so it cannot see "
                "what the real run refuses for values: weights holding NaN/inf, and MX weights whose decoded values "
                "would overflow; it lists them as quantized")

LOW_SQNR_DB = 10.0  # NVFP4 / MXFP4 of ordinary weights: ~20 dB; below this a tensor has lost most of its signal


def _error(message: str) -> int:
    print(f"fp4ref quantize: error: {message}", file=sys.stderr)
    return 2


def run(args) -> int:
    """Run the subcommand from parsed ``args``; returns the exit status (0 ok, 2 bad input, 130 interrupted by
    Ctrl-C, 143 by SIGTERM). Must run in the main thread (it handles SIGTERM while it works)."""
    show = not args.quiet
    if args.dequantize:
        given = [f"--{k.replace('_', '-')}" for k in ("format", "recipe", "mode", "include", "ignore",
                                                       "checkpoint_format") if getattr(args, k) is not None]
        given += [f for f, on in (("--no-default-ignore", args.no_default_ignore), ("--dry-run", args.dry_run),
                                  ("--pad", args.pad)) if on]
        if given:
            return _error(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to --dequantize")
    elif args.dtype is not None:
        return _error("--dtype applies to --dequantize only")
    if args.no_default_ignore and (args.checkpoint_format or "fp4ref") == "fp4ref":  # it has nothing to drop there
        return _error("--no-default-ignore applies to the modelopt and compressed-tensors layouts only (the fp4ref "
                      "layout has no default ignore list)")
    if args.output is None and not args.dry_run:
        return _error("the following arguments are required: -o/--output")
    if str(args.output) == STDOUT:  # a checkpoint is files: never standard output (as verify --repro)
        return _error(f"-o {STDOUT!r}: a checkpoint is written as files, not to standard output; give a path "
                      f"(./{STDOUT} for one named {STDOUT!r})")
    fmt = args.format or "nvfp4"
    cf = args.checkpoint_format or "fp4ref"
    ignore = None
    if args.no_default_ignore or args.ignore:
        ignore = ([] if args.no_default_ignore or cf == "fp4ref" else list(DEFAULT_IGNORE)) + (args.ignore or [])
    # SIGTERM takes Ctrl-C's clean-up path: workers stopped, partial output removed
    with sigterm_as_interrupt() as stop:
        return _run(args, fmt, cf, ignore, show, stop)


def _run(args, fmt: str, cf: str, ignore, show: bool, stop: Stop) -> int:
    try:
        if args.dequantize:
            if args.dtype is not None:
                parse_dtype(args.dtype, "--dtype")
            reports, ckpt = _dequantize_checkpoint(args.input, args.output, progress=show, dtype=args.dtype,
                                                   jobs=args.jobs, force=args.force)
            title = f"fp4ref quantize --dequantize {args.input} -> {args.output}"
        else:
            # the Checkpoint the run opened: the notes below read its config and subdirectories
            reports, ckpt = _quantize_checkpoint(args.input, args.output, fmt=fmt, checkpoint_format=cf,
                                                 recipe=args.recipe, mode=args.mode, include=args.include,
                                                 ignore=ignore, jobs=args.jobs, force=args.force,
                                                 progress=show and not args.dry_run, dry_run=args.dry_run,
                                                 pad=args.pad)
            default = LAYOUTS[(cf, fmt)]  # (an unsupported pair was refused above)
            opt = (f"recipe {args.recipe}" if args.recipe else f"mode {args.mode}" if args.mode
                   else f"recipe {default}, the layout's default" if fmt == "nvfp4"
                   else f"mode {default}, the layout's default")
            # an output path without .safetensors is a directory (the file goes inside it): the title says so
            out = (f"{args.output}/" if args.output and not str(args.output).endswith("/")
                   and Path(args.output).is_dir() else args.output)
            title = f"fp4ref quantize {args.input} -> {out} ({cf} {fmt}, {opt})"
            if args.dry_run:
                title = f"fp4ref quantize --dry-run {args.input} ({cf} {fmt}): nothing written"
    except (QuantizeFileError, CheckpointError, ValueError) as e:
        return _error(str(e))
    except KeyboardInterrupt:
        print(f"fp4ref quantize: {stop.word}; no partial output left", file=sys.stderr)
        return stop.status
    if show or args.dry_run:
        try:
            print_report(reports, title=title)
            if args.dry_run:  # the plan is cheap because it reads no values: say what it cannot check
                print(DRY_RUN_NOTE)
        except KeyboardInterrupt:  # the output (if any) is already complete: say so, same status
            done = "" if args.dry_run else f"; {args.output} is complete"
            print(f"fp4ref quantize: {stop.word} while printing the report{done}", file=sys.stderr)
            return stop.status
    if args.dry_run and args.output is not None and Path(args.output).exists() and not args.force:
        print(f"fp4ref quantize: note: {args.output} exists; the run itself needs --force to replace it",
              file=sys.stderr)
    if not args.dequantize and not args.dry_run and cf != "fp4ref" and ckpt.config is None:
        carried = "hf_quant_config.json" if cf == "modelopt" else "a config.json holding only quantization_config"
        if ckpt.kind == "file":
            why, fix = ("is read as a lone weight file, with no config.json (one beside it is not read)",
                        "quantize the model directory (config.json + shards) instead")
        else:
            why, fix = ("has no config.json", f"put the model's config.json in {args.input} and quantize again")
        print(f"fp4ref quantize: warning: {args.input} {why}, so the {cf} output has {carried} but not the model's "
              f"config.json, which vLLM / SGLang need to load it; {fix}", file=sys.stderr)
    if ckpt.sub_dirs:  # a dry run without -o too: the plan says what the run would leave behind
        names = ", ".join(d.name + "/" for d in ckpt.sub_dirs)
        verb = "would not be" if args.dry_run else "were not"
        print(f"fp4ref quantize: note: subdirectories of {args.input} {verb} copied (only its top-level files "
              f"are): {names}", file=sys.stderr)
    low = [r for r in reports if r.action == "quantized" and r.sqnr_db < LOW_SQNR_DB]
    if low:  # faithful to the recipe, but likely not what the user wants: say so even with --quiet
        worst = min(low, key=lambda r: r.sqnr_db)
        print(f"fp4ref quantize: warning: {len(low)} tensor(s) quantized with SQNR below {LOW_SQNR_DB:g} dB (worst "
              f"{worst.name!r}: {worst.sqnr_db:.1f} dB), e.g. weights near or below the float32 normal range; the "
              "output follows the recipe, check that it is what you want", file=sys.stderr)
    lost = [r for r in reports if r.action == "quantized" and r.lost_blocks]
    if lost:  # the recipe's rule, but values lost: fp4ref audit reports them (zero-scale-codes)
        worst = max(lost, key=lambda r: r.lost_blocks)
        print(f"fp4ref quantize: warning: {len(lost)} tensor(s) hold blocks whose block scale rounded to 0 over "
              f"non-zero codes, so their values decode to 0 (worst {worst.name!r}: {worst.lost_blocks} block(s)); "
              "fp4ref audit reports them as zero-scale-codes. The recipe does this to blocks far below the tensor "
              "amax; recipes modelopt / torchao clamp the block scale instead", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    """Standalone entry point (``python -m fp4ref.quantize_file ...``); returns the exit status."""
    p = argparse.ArgumentParser(prog="fp4ref quantize", description=_DESCRIPTION)
    _add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
