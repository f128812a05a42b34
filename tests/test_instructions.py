"""Tests of the demo agent's instruction language."""

from __future__ import annotations

import pytest

from orchestrator.demo.instructions import Instruction, apply_edit, parse_instructions


def test_parses_every_instruction_kind() -> None:
    """Each instruction form becomes one Instruction, in prompt order; other lines are ignored."""
    text = "\n".join(
        [
            "Please do this:",
            'replace "colour" with "color" in **/*.md',
            "rename calc_total to compute_total in shop/*.py",
            "append 'a line' to CHANGES.md",
            'create docs/new.md with "Title\\nBody"',
            "delete old.txt",
            "run python check.py",
        ]
    )
    assert parse_instructions(text) == [
        Instruction("replace", "**/*.md", "colour", "color"),
        Instruction("rename", "shop/*.py", "calc_total", "compute_total"),
        Instruction("append", "CHANGES.md", "", "a line"),
        Instruction("create", "docs/new.md", "", "Title\nBody"),
        Instruction("delete", "old.txt"),
        Instruction("run", "", "", "python check.py"),
    ]


def test_quotes_may_hold_escaped_quotes() -> None:
    """An escaped quote inside a quoted string is kept."""
    [ins] = parse_instructions(r'replace "say \"hi\"" with "say hello" in a.txt')
    assert ins.old == 'say "hi"'


def test_rename_is_whole_word() -> None:
    """Rename changes the identifier, not longer names that contain it."""
    ins = Instruction("rename", "*.py", "total", "sum_")
    assert apply_edit(ins, "total = subtotal + total_x + total\n") == (
        "sum_ = subtotal + total_x + sum_\n"
    )


def test_append_adds_a_newline_when_missing() -> None:
    """Append starts a new line even when the file does not end with one."""
    ins = Instruction("append", "f", "", "new")
    assert apply_edit(ins, "old") == "old\nnew\n"
    assert apply_edit(ins, "") == "new\n"


def test_non_edits_refuse_apply_edit() -> None:
    """create, delete and run are not text edits."""
    with pytest.raises(ValueError, match="not an edit"):
        apply_edit(Instruction("delete", "x"), "")


def test_describe_names_the_target() -> None:
    """Descriptions, used for plan entries and tool titles, name what changes."""
    assert Instruction("create", "a.md", "", "x").describe() == "Create a.md"
    assert "check.py" in Instruction("run", "", "", "python check.py").describe()
