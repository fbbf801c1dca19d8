"""ops/tables.py: the CLI's plain-text tables."""

from __future__ import annotations

from keylane.ops.tables import render_table


def test_columns_are_padded_to_their_widest_cell_and_headers_are_upper_case() -> None:
    text = render_table(["key", "n"], [["contact:1", 3], ["c:2", 1234]])
    assert text.splitlines() == [
        "KEY        N",
        "contact:1  3",
        "c:2        1234",
    ]


def test_none_shows_as_a_dash_and_lines_have_no_trailing_spaces() -> None:
    lines = render_table(["a", "b"], [[None, None], ["x", "y"]]).splitlines()
    assert lines[1] == "-  -"
    assert all(line == line.rstrip() for line in lines)


def test_a_long_cell_is_cut_to_sixty_characters_with_an_ellipsis() -> None:
    long = "x" * 61
    row = render_table(["v"], [[long], ["y" * 60]]).splitlines()
    assert row[1] == "x" * 57 + "..."
    assert row[2] == "y" * 60


def test_no_rows_is_the_header_line_alone() -> None:
    assert render_table(["shard", "state"], []) == "SHARD  STATE"
