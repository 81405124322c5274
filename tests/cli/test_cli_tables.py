"""The CLI's tables (``cli/tables.py``): widths fitted to the terminal, one line a row."""

from __future__ import annotations

import pytest
from rich.cells import cell_len

from router.cli.tables import ELLIPSIS, Column, Layout, fit_widths, layout_of, render_table

# (natural widths, floors (None: fixed), available) -> widths
FITS = [
    ([10, 5], [4, None], 20, [10, 5]),  # fits: untouched
    ([30, 5, 30], [4, None, 4], 41, [18, 5, 18]),  # the elastic ones capped at one level
    ([30, 5, 10], [4, None, 4], 30, [15, 5, 10]),  # a short elastic one keeps its width
    ([30, 50], [4, None], 20, [4, 50]),  # fixed too wide: elastic at its floor, no less
    ([12, 12], [8, 8], 10, [8, 8]),  # never below the floor, even when it cannot fit
]


@pytest.mark.parametrize(("natural", "floors", "available", "expected"), FITS)
def test_fit_widths(
    natural: list[int], floors: list[int | None], available: int, expected: list[int]
) -> None:
    assert fit_widths(natural, floors, available) == expected


LONG = "sensor/" + "x" * 90
COLUMNS = (Column("client"), Column("state", fixed=True), Column("since", fixed=True, wide=True))
ROWS = [(LONG, "connected", "2025-05-01T10:00:00Z"), ("short", "away", "2025-05-01T10:00:01Z")]


def test_cut_keeps_one_line_a_row_within_the_width_and_fixed_columns_whole() -> None:
    lines = render_table(COLUMNS, ROWS, 40, Layout.CUT)
    assert len(lines) == 3 and all(cell_len(line) <= 40 for line in lines)
    assert lines[0].split() == ["client", "state"]  # (the wide-only column left out)
    assert lines[1].endswith(f"{ELLIPSIS}  connected") and lines[1].startswith("sensor/x")
    assert lines[2].split() == ["short", "away"]


def test_whole_prints_every_value_and_column() -> None:
    lines = render_table(COLUMNS, ROWS, 40, Layout.WHOLE)
    assert len(lines) == 3
    assert lines[1].split() == [LONG, "connected", "2025-05-01T10:00:00Z"]


def test_fold_loses_nothing_and_keeps_fixed_columns_on_the_first_line() -> None:
    lines = render_table(COLUMNS, ROWS, 60, Layout.FOLD)
    assert all(cell_len(line) <= 60 for line in lines)
    assert "connected" in lines[1] and "2025-05-01T10:00:00Z" in lines[1]
    width = lines[0].index("state") - 2
    pieces = [line[:width].rstrip() for line in lines[1:-1]]
    assert "".join(pieces) == LONG
    assert lines[-1].split() == ["short", "away", "2025-05-01T10:00:01Z"]


def test_a_control_character_never_breaks_a_row() -> None:
    lines = render_table(["client", "node"], [("a\nb\tc", None)], 80, Layout.CUT)
    assert lines == ["client   node", "a\\nb\\tc"]


def test_wide_characters_are_measured_in_cells() -> None:
    lines = render_table(["topic"], [("温度" * 30,)], 20, Layout.CUT)
    assert [cell_len(line) for line in lines[1:]] == [20]


@pytest.mark.parametrize(
    ("wide", "layout"), [(True, Layout.WHOLE), (False, Layout.CUT), (None, Layout.FOLD)]
)
def test_layout_of_the_wide_flag(wide: bool | None, layout: Layout) -> None:
    assert layout_of(wide) is layout
