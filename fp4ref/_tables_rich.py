"""Printing fp4ref's rich tables so that numbers are never cut short.

A terminal narrower than a table makes rich shrink its columns; a number shrunk to "1.2…" is worse than no number.
``print_table`` keeps the numeric (and verdict) columns at the width of their widest cell (their headers may
fold) and lets the text columns fold, and a console that is not a terminal (a pipe or a log) widens to the table's
full width.
"""
from __future__ import annotations

__all__ = ["print_table"]

PIPED_MIN_WIDTH = 160  # columns of a console that is not a terminal, at least


def print_table(console, table, whole: tuple = ()) -> None:
    """Print ``table`` on ``console``. ``whole``: the headers of the columns whose cells must never be cut
    (numbers, verdicts). Not a terminal: the console widens to the table's measured width (at least
    ``PIPED_MIN_WIDTH``) so that no row folds. A terminal narrower than the table: the ``whole`` columns are
    pinned to their widest cell (or header word), the other columns fold, headers fold and the cell padding goes
    if needed, and if the terminal is narrower still the rows run past its edge (the terminal wraps them): no
    cell or header is cut."""
    wide = console.options.update_width(10_000)
    if not console.is_terminal:
        console.width = max(PIPED_MIN_WIDTH, console.width, console.measure(table, options=wide).maximum)
        console.print(table)
        return
    if console.measure(table, options=wide).maximum <= console.width:
        console.print(table)
        return
    pinned = [col for col in table.columns if col.header in whole]
    # the rendered width: markup such as "[green]pass[/]" takes no columns
    cells = {id(col): max((console.measure(c, options=wide).maximum for c in col.cells), default=1) for col in pinned}
    words = {id(col): max((len(w) for w in str(col.header).split()), default=1) for col in pinned}

    def least(header_words: bool, padding: int) -> int:
        # rich folds no other column below ~3 cells; + padding and the column rules
        return (sum(max(cells[id(c)], words[id(c)] if header_words else 0) for c in pinned)
                + 3 * (len(table.columns) - len(pinned)) + (padding + 1) * len(table.columns) + 1)

    # the first layout that fits: header words whole, then without cell padding, then headers folded too
    fit = next(((hw, pad) for hw, pad in ((True, 2), (True, 0), (False, 0))
                if least(hw, pad) <= console.width), (False, 0))
    for col in pinned:
        col.width = max(cells[id(col)], words[id(col)] if fit[0] else 0)
        col.overflow = "fold"  # a header wider than its column folds over lines, never cut to "…"
    if fit[1] == 0:
        table.padding = (0, 0)
    need = least(*fit)
    if need <= console.width:
        console.print(table)
        return
    width = console.width  # rich clamps a print's width to the console's: widen the console for this table
    console.width = need
    try:
        console.print(table)
    finally:
        console.width = width
