"""The ``fp4ref`` command.

Subcommands:
    formats [NAME ...] [--markdown]   code tables and encode policies of the element formats
"""
from __future__ import annotations

import argparse
import sys

from .formats import FORMATS

__all__ = ["main", "build_parser"]


def _cmd_formats(args) -> int:
    from . import tables

    names = args.names or list(FORMATS)
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


def _format_name(text: str) -> str:
    name = text.lower()
    if name not in FORMATS:
        raise argparse.ArgumentTypeError(f"unknown format {text!r}; choose from {', '.join(FORMATS)}")
    return name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fp4ref",
        description="Reference codecs, exact GEMMs and error bounds for FP4/FP8 numerics.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("formats", help="print element formats' code tables and encode policies")
    p.add_argument("names", nargs="*", type=_format_name, metavar="NAME",
                   help=f"formats to print (default: all of {', '.join(FORMATS)})")
    p.add_argument("--markdown", action="store_true", help="print Markdown (docs/formats.md is this output)")
    p.set_defaults(func=_cmd_formats)
    return parser


def main(argv=None) -> int:
    """Entry point of the ``fp4ref`` console script. Returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
