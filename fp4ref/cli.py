"""The ``fp4ref`` command.

Subcommands:
    verify                            check kernels against the exact references on the three workloads
    quantize IN -o OUT --format F     quantize a safetensors file or checkpoint (NVFP4 / MXFP4 / MXFP8), or --dequantize
    audit PATH [--reference ORIG]     check a quantized checkpoint's scales, padding, layout and global scales
    formats [NAME ...] [--markdown]   code tables and encode policies of the element formats
"""
from __future__ import annotations

import argparse
import sys

from ._validate import STDOUT, OnceAction, path_option
from .formats import FORMATS, _name_hint

__all__ = ["main", "build_parser"]


def _cmd_formats(args) -> int:
    from . import tables

    names = list(dict.fromkeys(args.names)) or list(FORMATS)  # each named format once, in the order given
    if args.markdown:
        sys.stdout.write(tables.formats_markdown(names) + "\n")
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for name in names:
        t = Table(title=f"{name.upper()}", show_lines=False)
        t.add_column("property")
        t.add_column("value")
        for k, v in tables.properties(name) + tables.policies(name):
            t.add_row(k, v)
        console.print(t)
        codes = Table(title=f"{name.upper()} codes")
        for col in ("code", "bits", "value", "class"):
            codes.add_column(col)
        for row in tables.code_rows(name):
            codes.add_row(*row)
        console.print(codes)
    return 0


def _usage_error(command: str, message: str) -> int:
    """argparse's convention for bad arguments: the message on stderr, exit status 2."""
    sys.stderr.write(f"fp4ref {command}: error: {message}\n")
    return 2


#: One line under the verify table: which columns decide, which are shown for comparison.
TABLE_CAPTION = ("FIB and SOL: the FlashInfer-Bench and SOL-ExecBench checkers' verdicts on the same outputs, shown "
                 "for comparison only; the fp4ref column decides the exit status")


#: The files ``--repro DIR`` writes (fp4ref.repro.write_repro).
REPRO_FILES = ("repro.py", "inputs.npz")
_VERDICT_STYLE = {"pass": "[green]pass[/]", "FAIL": "[red]FAIL[/]", "not run": "[yellow]not run[/]"}  # Row.verdict


def _cmd_verify(args) -> int:
    import os

    from rich.console import Console

    from . import verify as V
    from ._validate import check_report_path, check_writable_dir, sigterm_as_interrupt

    # --json -: standard output holds the JSON alone; the progress, the table and the notes go to stderr
    to_stderr = args.json == STDOUT
    console = Console(stderr=to_stderr)
    if not console.is_terminal:
        console = Console(stderr=to_stderr, width=160)  # piped or logged: keep the table's columns readable
    workloads = args.workload
    try:
        if args.definition:
            name, _axes = V.workload_from_definition(args.definition)
            if workloads and set(workloads) != {name}:
                raise ValueError(f"--definition matches {name}, but --workload says {workloads}")
            workloads = [name]
        if args.kernel and not workloads:
            raise ValueError("--kernel needs --workload NAME (or --definition FILE.json)")
        if args.kernel:
            if args.kernel.count(":") != 1 or not all(args.kernel.split(":")):
                raise ValueError(f"--kernel {args.kernel!r} must look like 'package.module:function'")
        if args.sizes is not None:
            V.check_sizes(list(dict.fromkeys(workloads or V.WORKLOADS)), args.sizes, "--sizes")
        if args.json:
            check_report_path(args.json, "--json", force=args.force)
        if args.repro == STDOUT:  # two files: a directory, never standard output
            raise ValueError(f"--repro {STDOUT!r}: the reproducer is two files ({' and '.join(REPRO_FILES)}), "
                             f"written in a directory, not to standard output; give a directory (./{STDOUT} for "
                             f"one named {STDOUT!r})")
        if args.repro:  # never overwrite an earlier reproducer unasked; a folder that cannot be written fails now
            check_writable_dir(args.repro, "--repro", REPRO_FILES, force=args.force)
        if args.max_check_rows is not None and (args.max_check_rows < 0 or 0 < args.max_check_rows < 129):
            raise ValueError(f"--max-check-rows {args.max_check_rows}: expected 0 (all rows) or >= 129")
        # torch, triton, hypothesis: installed by the kernels extra, not by fp4ref itself
        V.check_dependencies(workloads, kernel=args.kernel, families=args.families)
    except (ValueError, V.MissingDependency) as exc:
        return _usage_error("verify", str(exc))
    if args.kernel:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the user's package in the current directory
    state = {"result": None, "json": False}
    with sigterm_as_interrupt() as stop:  # SIGTERM takes Ctrl-C's path, exit 143
        try:
            return _run_verify(args, workloads, console, state)
        except KeyboardInterrupt as exc:  # Ctrl-C: one line saying what is (not) on disk, no traceback
            return _interrupted(args, state, getattr(exc, "result", None), stop)


def _interrupted(args, state, result, stop) -> int:
    """The one line of an interrupted ``fp4ref verify`` (what is and is not on disk); its exit status."""
    result = result or state["result"]
    said = []
    if args.json:
        where = "the --json report on stdout" if args.json == STDOUT else args.json
        said.append(f"{where} is complete" if state["json"] else "no --json report written")
    if args.repro:
        wrote = result is not None and str(result.settings.get("repro") or "").startswith("wrote ")
        said.append(f"the reproducer in {args.repro} is complete" if wrote else "no --repro reproducer written")
    sys.stderr.write(f"fp4ref verify: {stop.word}; {'; '.join(said) or 'nothing written'}\n")
    return stop.status


def _run_verify(args, workloads, console, state) -> int:
    """The run, the table and the reports of ``fp4ref verify`` after its argument checks; ``state`` records what
    is done (the result, the JSON report written) for the Ctrl-C message."""
    import contextlib
    import json
    import time

    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from . import verify as V
    from ._validate import emit_report

    device = args.device
    if device is None:
        import torch  # installed: _cmd_verify checked

        device = "cuda" if torch.cuda.is_available() else "cpu"
    kw = dict(kernel=args.kernel, device=device, sizes=args.sizes, families=args.families, examples=args.examples,
              seed=args.seed, model=args.model, output_rounding=args.output_rounding,
              max_check_rows=args.max_check_rows or None, shapes=args.shapes, integrity=not args.no_integrity,
              repro=args.repro)
    # --json -: while the kernels run, whatever they (or anything else) write to sys.stdout goes to stderr, so
    # stdout holds the JSON alone; the redirect ends with the run, also on an error or a Ctrl-C
    kernel_stdout = contextlib.redirect_stdout(sys.stderr) if args.json == STDOUT else contextlib.nullcontext()
    try:
        with kernel_stdout:
            total = V.plan_size(workloads, device=device, sizes=args.sizes, families=args.families,
                                shapes=args.shapes, integrity=not args.no_integrity)
            if console.is_terminal:
                with Progress(TextColumn("{task.description}"), BarColumn(),
                              TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=console,
                              transient=True) as bar:
                    task = bar.add_task("verify", total=total)
                    result = V.verify(workloads, progress=lambda n, d: bar.update(task, advance=n, description=d), **kw)
            else:  # piped or logged: one plain line per row, flushed, so a log shows where the run is
                done = [0]
                t0 = time.perf_counter()

                def line(n, d):  # (with --json -, sys.stdout is stderr here: the redirect above)
                    done[0] += n
                    sys.stdout.write(f"[{done[0]}/{total} {time.perf_counter() - t0:.0f} s] {d}\n")
                    sys.stdout.flush()

                result = V.verify(workloads, progress=line, **kw)
    except (ValueError, V.MissingDependency) as exc:  # checks inside verify() run before any kernel
        return _usage_error("verify", str(exc))
    except MemoryError as exc:  # the operands or the reference of one M do not fit: a usage error, not a trace
        return _usage_error("verify", f"--sizes: {exc}; give a smaller M")
    state["result"] = result
    s = result.settings
    title = f"fp4ref verify on {s['gpu'] or s['device']} (examples={s['examples']}, seed={s['seed']})"
    table = Table(title=title)
    for col in ("workload", "M", "N", "K", "family", "ex", "rows", "max err/bound", "max ulps", "bitwise =",
                "SQNR dB", "FIB", "SOL", "fp4ref"):
        # names fold over lines in a narrow terminal instead of being cut short ("sp…"); print_table pins the
        # other columns to their widest cell
        table.add_column(col, justify="left" if col in ("workload", "family") else "right", overflow="fold")
    verdict = lambda ok: _VERDICT_STYLE["pass" if ok else "FAIL"]  # FIB and SOL: pass or FAIL
    num = lambda x, f: "-" if x != x else format(x, f)  # NaN: no example completed
    for r in result.rows:
        integrity = r.kind == "integrity"  # no metrics, no public-checker verdicts: fp4ref's own check
        table.add_row(r.workload, str(r.m), str(r.n), str(r.k), r.family, str(r.examples),
                      "-" if integrity else str(r.checked_rows),
                      num(r.max_err_over_bound, ".3g"), num(r.max_ulps, ".3g"),
                      "-" if r.bitwise_equal_pct != r.bitwise_equal_pct else f"{r.bitwise_equal_pct:.2f}%",
                      num(r.sqnr_db, ".1f"), "-" if integrity else verdict(r.fib_ok),
                      "-" if integrity else verdict(r.sol_ok),
                      _VERDICT_STYLE[r.verdict])
    # numbers stay whole in a narrow terminal; piped or logged, the table is as wide as it needs
    from ._tables_rich import print_table

    print_table(console, table, whole=("M", "N", "K", "ex", "rows", "max err/bound", "max ulps", "bitwise =",
                                       "SQNR dB", "FIB", "SOL", "fp4ref"))
    console.print(TABLE_CAPTION, soft_wrap=not console.is_terminal, markup=False)  # a log keeps it on one line
    for r in result.rows:
        if r.note:
            console.print(f"[yellow]{escape(f'{r.workload} M={r.m} N={r.n} K={r.k} {r.family}')}:[/] "
                          f"{escape(r.note)}")
    for name, why in result.missing:
        console.print(f"[red]{escape(name)}: no kernel to verify[/] ({escape(why)})")
    for name, why in result.skipped:
        console.print(f"[yellow]{escape(name)}: skipped, not verified[/] ({escape(why)})")
    if s.get("repro"):
        console.print(f"--repro: {escape(s['repro'])}")
    if args.json:
        try:  # a file whole or not at all: a Ctrl-C or a full disk leaves no partial report
            emit_report(args.json, json.dumps(result.to_json(), indent=2, allow_nan=False) + "\n")
        except OSError as exc:
            return _usage_error("verify", f"--json {args.json!r}: cannot write it ({exc.strerror or exc})")
        state["json"] = True
    skipped = f" ({len(result.skipped)} workload(s) skipped: see above)" if result.skipped else ""
    console.print(f"[green]all verdicts pass{skipped}[/]" if result.ok else "[red]verification FAILED[/]")
    return 0 if result.ok else 1


def _format_name(text: str) -> str:
    name = text.lower()
    if name not in FORMATS:
        raise argparse.ArgumentTypeError(f"unknown format {text!r}{_name_hint(name)}; choose from "
                                         f"{', '.join(FORMATS)}")
    return name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fp4ref",
        description="Reference codecs, exact GEMMs and error bounds for FP4/FP8 numerics.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"fp4ref {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "verify",
        help="verify kernels against fp4ref's exact references (GPU if present, else the Triton interpreter)",
        description="Verify the project's kernels (or --kernel) on the workloads: exact reference, K-aware bound, "
        "and the public benchmarks' checkers. Exit status 0 iff every fp4ref verdict passes, 1 otherwise (a kernel "
        "that cannot be imported or called counts as failed and is named in the report), 2 for bad arguments or a "
        "missing torch / triton / hypothesis (pip install 'fp4ref[kernels]'), 130 on Ctrl-C and 143 on SIGTERM (no "
        "partial --json / --repro output is left).",
    )
    from .workloads import WORKLOADS

    p.add_argument("--workload", action="append", choices=list(WORKLOADS), type=str.lower,
                   help="workload to verify (repeatable, each counts once; default all)")
    p.add_argument("--kernel", metavar="MODULE:FUNCTION", action=OnceAction,
                   help="your kernel, taking the workload's signature (needs --workload or --definition)")
    p.add_argument("--definition", metavar="FILE.json", action=OnceAction,
                   help="FlashInfer-Bench definition file naming the workload")
    p.add_argument("--examples", action=OnceAction, type=int, default=1,
                   help="seeds per workload, size and input family (default 1)")
    p.add_argument("--seed", action=OnceAction, type=int, default=0)
    p.add_argument("--device", action=OnceAction, choices=("cpu", "cuda"), type=str.lower,
                   help="default: cuda if available, else cpu (interpreter)")
    p.add_argument("--sizes", type=int, nargs="+", action="extend", metavar="M",
                   help="M values (default: per device; repeatable, the values combine); a repeated M counts once; "
                        "each at most (2**31 - 1) // max(N, K) of the workload (699050 for gemm_n3072_k2048), so no "
                        "operand or output reaches 2**31 elements")
    p.add_argument("--families", nargs="+", action="extend", metavar="FAMILY", type=str.lower,
                   help="input families (default: all; repeatable, the names combine); a repeated name counts once; "
                        "a workload with none of them is skipped, with a note naming it")
    p.add_argument("--model", action=OnceAction,
                   help="accumulation model (default: the kernel's declared model, else the universal "
                        "fp32-accumulating tensor-core model)")
    p.add_argument("--output-rounding", action=OnceAction, choices=("rne", "faithful"), type=str.lower,
                   help="default: the kernel's declared rounding (rne on GPU)")
    p.add_argument("--max-check-rows", action=OnceAction, type=int, default=256,
                   help="check at most this many rows of a large-M output: 0 (all rows) or >= 129, so that the "
                        "first and last 64 rows and one between are always in (default 256)")
    p.add_argument("--shapes", action=OnceAction, choices=("fixed", "sweep"), type=str.lower, default="fixed",
                   help="fixed: the workload's N and K (default); sweep: N and K around tile boundaries (K not a "
                        "multiple of 64/128, N tails, below one tile), for a kernel that claims general shapes")
    p.add_argument("--no-integrity", action="store_true",
                   help="skip the integrity verdicts (no mutation or aliasing, fresh inputs in the same buffers, "
                        "repeatable, mid-run output kept, plain dense output)")
    p.add_argument("--repro", metavar="DIR", type=path_option, action=OnceAction,
                   help="on the first failing row, shrink the case and write DIR/inputs.npz + DIR/repro.py (exits "
                        "non-zero while the bug is there); DIR is checked before the run, and existing files there "
                        "are kept unless --force; '-' is refused (two files go in a directory, not to stdout)")
    p.add_argument("--json", metavar="PATH", type=path_option, action=OnceAction,
                   help="write the full report as JSON to PATH ('-' for stdout, which then holds the JSON alone: "
                        "the progress, the table, the notes and the kernels' own prints during the run go to stderr; "
                        "an existing file only with --force)")
    p.add_argument("--force", action="store_true", help="replace an existing --json / --repro output")
    p.set_defaults(func=_cmd_verify)

    from . import quantize_file

    quantize_file.add_parser(sub)

    from . import audit

    audit.add_parser(sub)

    p = sub.add_parser("formats", help="print element formats' code tables and encode policies")
    p.add_argument("names", nargs="*", type=_format_name, metavar="NAME",
                   help=f"formats to print (default: all of {', '.join(FORMATS)})")
    p.add_argument("--markdown", action="store_true", help="print Markdown (docs/formats.md is this output)")
    p.set_defaults(func=_cmd_formats)
    for p in sub.choices.values():  # an unknown option is reported with its subcommand's usage (main)
        p.set_defaults(subparser=p)
    return parser


def main(argv=None) -> int:
    """Entry point of the ``fp4ref`` console script. Returns the process exit status (130 on a Ctrl-C)."""
    args = None
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:
            args.subparser.error(f"unrecognized arguments: {' '.join(extra)}")  # exits with status 2
        return args.func(args)
    except KeyboardInterrupt:
        # a Ctrl-C outside a command's own handlers (they say what is on disk): while Python imports the
        # command's modules, while its arguments are checked; one line, no traceback
        prog = args.subparser.prog if args is not None else "fp4ref"
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
