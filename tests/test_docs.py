"""docs/design.md stays true to the code: the vocabulary, the commands and the audit codes it names."""

from __future__ import annotations

import re
from pathlib import Path

import click

from collectors.commands import checkpoint_group, probe_group
from ledger._cli import LAZY_COMMANDS
from ledger._vocabulary import ENUMS, KINDS, OPTIONAL_ENUMS, Types
from reports._audit import SEVERITY

DESIGN = (Path(__file__).parents[1] / "docs" / "design.md").read_text(encoding="utf-8")
_TYPE_NAMES: dict[type | None, str] = {
    str: "str",
    int: "int",
    float: "num",
    bool: "bool",
    dict: "obj",
    list: "list",
    None: "null",
}


def _section(title: str) -> str:
    """The text of one ``## title`` section."""
    start = DESIGN.index(f"\n## {title}\n")
    end = DESIGN.find("\n## ", start + 1)
    return DESIGN[start : end if end >= 0 else None]


def _rows(section: str) -> dict[str, list[str]]:
    """Table rows keyed by the backticked name in their first cell (``\\|`` is a literal bar)."""
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        match = re.match(r"\| `([^`]+)` \|", line)
        if match:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            assert match.group(1) not in rows, f"{match.group(1)} is listed twice"
            rows[match.group(1)] = cells
    return rows


def _type_text(types: Types) -> str:
    if set(types) == {str, int, float, bool, dict, list, None}:
        return "any"
    if int in types and float in types:  # a number: int or float
        types = tuple(t for t in types if t is not int)
    return "/".join(_TYPE_NAMES[t] for t in types)


def test_every_kind_is_in_the_design_with_its_required_fields_and_types() -> None:
    rows = _rows(_section("The vocabulary"))
    assert set(rows) == set(KINDS), "docs/design.md's vocabulary table differs from ledger/_vocabulary.py"
    for kind, fields in KINDS.items():
        named = dict(re.findall(r"`([a-z0-9_]+)` ([a-z/]+)", rows[kind][1]))
        assert named == {name: _type_text(types) for name, types in fields.items()}, kind


def test_every_checked_value_is_in_its_kinds_row() -> None:
    rows = _rows(_section("The vocabulary"))
    checked = [(kind, field, values) for (kind, field), values in ENUMS.items()]
    checked += [(kind, field, values) for kind, pairs in OPTIONAL_ENUMS.items() for field, values in pairs]
    for kind, field, values in checked:
        notes = rows[kind][2]
        assert f"`{field}`" in notes, (kind, field)
        for value in values:
            assert f"`{value}`" in notes, (kind, field, value)


def test_every_audit_code_is_in_the_design_with_its_severity() -> None:
    rows = _rows(_section("Audit findings (contract)"))
    assert {code: cells[1] for code, cells in rows.items()} == SEVERITY


def test_every_command_is_in_the_design() -> None:
    table = _section("The command line (contract)")
    named = set(re.findall(r"`ledger ([a-z-]+)", table))
    assert named == set(LAZY_COMMANDS)
    for group in (probe_group, checkpoint_group):
        assert isinstance(group, click.Group)
        assert group.name is not None
        for sub in group.commands:
            assert f"`ledger {group.name} {sub}" in table, f"ledger {group.name} {sub}"
