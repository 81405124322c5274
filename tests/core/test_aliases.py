"""The in-memory AliasTable against the shared alias table (tests/support/alias_cases.py)."""

from __future__ import annotations

import pytest

from router import AliasTable, InvalidAliasError, RouterError
from tests.support.alias_cases import ALIAS_CASES, Step


def run_steps(table: AliasTable, steps: list[Step]) -> None:
    for step in steps:
        op, *args = step
        if op == "bind":
            table.bind(*args)
        elif op == "bind!":
            with pytest.raises(RouterError):
                table.bind(*args)
        elif op == "maximum":
            table.set_maximum(*args)
        elif op == "topic":
            *query, expected = args
            assert table.topic(*query) == expected, step
        elif op == "alias":
            *query, expected = args
            assert table.alias(*query) == expected, step
        elif op == "remove_client":
            client_id, expected = args
            assert table.remove_client(client_id) == expected, step
        else:
            raise AssertionError(f"unknown step {step}")


@pytest.mark.parametrize("name", sorted(ALIAS_CASES))
def test_alias_case(name: str) -> None:
    run_steps(AliasTable(), ALIAS_CASES[name])


def test_lowering_the_maximum_drops_aliases_above_it() -> None:
    table = AliasTable()
    table.bind("c", "client", 5, "five")
    table.bind("c", "client", 2, "two")
    table.set_maximum("c", "client", 3)
    assert table.aliases("c", "client") == {2: "two"}
    assert table.alias("c", "client", "five") is None


def test_bad_alias_error_carries_the_value() -> None:
    with pytest.raises(InvalidAliasError) as info:
        AliasTable().bind("c", "client", 0, "t")
    assert info.value.alias == 0
    assert isinstance(info.value, ValueError)
