"""Tables for people: one line a row, fitted to the terminal's width.

A table is a header line and one line a row, columns two spaces apart, no borders (so a
row stays one line through ``grep`` and ``cut``)::

    client            node  protocol  state      subs  queued  expires in
    sensor-kitchen-1  a     5.0       connected  2     0       -
    logger-with-a-l…  b     3.1.1     away       1     17      184

The width is the terminal's (``$COLUMNS`` first; 80 when the output is not a terminal).
When the rows are wider, the *elastic* columns (ids, filters, free text) give way: the
widest is narrowed first, down to the next widest, and so on, never below its header or
:data:`MIN_WIDTH`; *fixed* columns (counts, states, times) never are. How a narrowed
value shows depends on the command:

* ``Layout.CUT`` (a command with ``--wide``): cut with an ellipsis, ``--wide``
  (``Layout.WHOLE``) prints every value whole and every column, lines as long as they are;
* ``Layout.FOLD`` (a command without ``--wide``): the value goes on over more lines in
  its column, so nothing is lost.

Columns marked ``wide`` show only with ``--wide`` (and when folding). Control characters
in values are shown escaped (``\\n``), so a value never breaks its row.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import click
from rich.cells import cell_len, chop_cells, set_cell_size
from rich.console import Console

#: An elastic column is narrowed to no less than this (or its header, if wider).
MIN_WIDTH: Final = 8
#: Between two columns.
GAP: Final = "  "
ELLIPSIS: Final = "…"

_ESCAPES: Final = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F)},
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


class Layout(enum.Enum):
    """What a table does with values wider than their column (see the module docstring)."""

    CUT = "cut"
    FOLD = "fold"
    WHOLE = "whole"


@dataclass(frozen=True)
class Column:
    """A column: ``header``; a ``fixed`` one is never narrowed (short values: counts,
    states, times), a ``wide`` one shows only with ``--wide`` (and when folding)."""

    header: str
    fixed: bool = False
    wide: bool = False


def layout_of(wide: bool | None) -> Layout:
    """``--wide`` given (True), not given (False), or not offered (None)."""
    if wide is None:
        return Layout.FOLD
    return Layout.WHOLE if wide else Layout.CUT


def cell_text(value: Any) -> str:
    """A value as a cell shows it: None as "", control characters escaped."""
    return "" if value is None else str(value).translate(_ESCAPES)


def fit_widths(natural: Sequence[int], floors: Sequence[int | None], available: int) -> list[int]:
    """Column widths whose sum is at most ``available`` if it can be: each column with a
    floor (an elastic one) is capped at one level, the highest that fits, never below its
    floor; a column without one (``None``: fixed) keeps its ``natural`` width. Returns
    the natural widths when they fit, the floors when even those do not."""
    if sum(natural) <= available:
        return list(natural)

    def capped(level: int) -> list[int]:
        return [
            n if floor is None else min(n, max(floor, level))
            for n, floor in zip(natural, floors, strict=True)
        ]

    low, high = 0, max(natural)  # (capped(high) is natural, too wide; find the best level)
    while low < high:
        middle = (low + high + 1) // 2
        if sum(capped(middle)) <= available:
            low = middle
        else:
            high = middle - 1
    return capped(low)


def render_table(
    columns: Sequence[str | Column],
    rows: Sequence[Sequence[Any]],
    width: int,
    layout: Layout,
) -> list[str]:
    """The lines of a table (header first, trailing spaces stripped) for a terminal
    ``width`` columns wide; plain strings are elastic columns."""
    specs = [c if isinstance(c, Column) else Column(c) for c in columns]
    shown = [i for i, spec in enumerate(specs) if layout is not Layout.CUT or not spec.wide]
    header = [specs[i].header for i in shown]
    body = [[cell_text(row[i]) for i in shown] for row in rows]
    natural = [max(cell_len(text) for text in column) for column in zip(header, *body, strict=True)]
    if layout is Layout.WHOLE:
        widths = natural
    else:
        floors = [
            None if specs[i].fixed else min(n, max(MIN_WIDTH, cell_len(specs[i].header)))
            for i, n in zip(shown, natural, strict=True)
        ]
        widths = fit_widths(natural, floors, width - len(GAP) * (len(shown) - 1))
    lines: list[str] = []
    for cells in (header, *body):
        if layout is Layout.FOLD:
            pieces = [chop_cells(text, w) or [""] for text, w in zip(cells, widths, strict=True)]
        else:
            pieces = [[_cut(text, w)] for text, w in zip(cells, widths, strict=True)]
        for depth in range(max(len(piece) for piece in pieces)):
            parts = [
                set_cell_size(piece[depth] if depth < len(piece) else "", w)
                for piece, w in zip(pieces, widths, strict=True)
            ]
            lines.append(GAP.join(parts).rstrip())
    return lines


def _cut(text: str, width: int) -> str:
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, max(0, width - 1)) + ELLIPSIS


def print_table(
    title: str | None,
    columns: Sequence[str | Column],
    rows: Sequence[Sequence[Any]],
    wide: bool | None = None,
) -> None:
    """Print a title line and a table for people (see the module docstring); ``wide`` is
    the command's ``--wide`` (None: it has none, long values are folded). Values are
    shown with ``str``."""
    width = Console().width
    layout = layout_of(wide)
    if title:
        click.echo(title if layout is not Layout.CUT else _cut(cell_text(title), width))
    for line in render_table(columns, rows, width, layout):
        click.echo(line)
