"""Printing fp4ref's rich tables so that numbers are never cut short.

A terminal narrower than a table makes rich shrink its columns; a number shrunk to "1.2…" is worse than no number.
``print_table`` keeps the numeric (and verdict) columns at the width of their widest cell (their headers may
wrap) and lets the text columns fold, and a console that is not a terminal (a pipe or a log) widens to the table's full width.
"""
from __future__ import annotations

__all__ = ["print_table"]

PIPED_MIN_WIDTH = 160  # columns of a console that is not a terminal, at least


def print_table(console, table, whole: tuple = ()) -> None:
    """Print ``table`` on ``console``. ``whole``: the headers of the columns whose cells must never be cut
    (numbers, verdicts). Not a terminal: the console widens to the table's measured width (at least
    ``PIPED_MIN_WIDTH``) so that no row folds. A terminal narrower than the table: the ``whole`` columns are
    pinned to their widest cell (their headers may be cut), the other columns fold, the cell padding goes if
    needed, and if the terminal is narrower still the rows run past its edge (the terminal wraps them): no cell
    is cut."""
    wide = console.options.update_width(10_000)
    if not console.is_terminal:
        console.width = max(PIPED_MIN_WIDTH, console.width, console.measure(table, options=wide).maximum)
        console.print(table)
        return
    if console.measure(table, options=wide).maximum <= console.width:
        console.print(table)
        return
    for col in table.columns:
        if col.header in whole:  # the rendered width: markup such as "[green]pass[/]" takes no columns
            col.width = max((console.measure(c, options=wide).maximum for c in col.cells), default=1)
    # rich folds no other column below ~3 cells; + the column rules
    least = sum(col.width or 3 for col in table.columns) + len(table.columns) + 1
    if least + 2 * len(table.columns) > console.width:
        table.padding = (0, 0)
    else:
        least += 2 * len(table.columns)
    if least <= console.width:
        console.print(table)
        return
    width = console.width  # rich clamps a print's width to the console's: widen the console for this table
    console.width = least
    try:
        console.print(table)
    finally:
        console.width = width
