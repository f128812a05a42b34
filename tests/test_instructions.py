"""Tests of the demo agent's instruction language."""

from __future__ import annotations

import pytest

from orchestrator.demo.instructions import (
    Instruction,
    NotUnderstood,
    apply_edit,
    parse_instructions,
    parse_line,
    parse_prompt,
)


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


def test_append_of_a_line_ending_in_a_newline_adds_no_blank_line() -> None:
    """TEXT ending in ``\\n`` is one line: append adds it once, with no empty line after."""
    [ins] = parse_instructions('append "- one\\n" to CHANGES.md')
    assert apply_edit(ins, "# Changes\n") == "# Changes\n- one\n"


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("rename a b to c in *.md", "expected 'to' after OLD, found 'b'"),
        ("rename badge_colour to 1abc in shop/*.py", "'1abc' is not an identifier"),
        ('append "oops to CHANGES.md', 'a " quote is not closed'),
        ("replace 'unclosed with 'x' in *.md", 'the quotes do not pair up: found "x\'" after OLD'),
        ("replace '' with 'x' in README.md", "the text to replace is empty"),
        ("replace colour with 'color' in *.md", "OLD must be in quotes, found 'colour'"),
        ('replace "a" with "b" in', "GLOB is missing after 'in'"),
        ("delete", "PATH is missing after 'delete'"),
        ("delete a.txt b.txt", "unexpected 'b.txt' after PATH"),
        ("run", "COMMAND is missing"),
        ("delete ../outside.txt", "PATH must be inside the session's directory, without '..'"),
        (
            'replace "a" with "b" in /etc/*',
            "GLOB must be inside the session's directory, without '..'",
        ),
        ('Create notes.md with "x" please', "unexpected 'please' after TEXT"),
    ],
)
def test_a_line_starting_with_an_instruction_word_is_answered_when_malformed(
    line: str, reason: str
) -> None:
    """A malformed instruction line is NotUnderstood, with the reason and the form expected."""
    parsed = parse_line(line)
    assert isinstance(parsed, NotUnderstood), parsed
    assert parsed.line == line
    assert parsed.reason.startswith(reason + "; the form is: "), parsed.reason
    assert parsed.describe() == f"not understood: {line} ({parsed.reason})"


def test_not_understood_lines_keep_their_place_and_prose_is_ignored() -> None:
    """parse_prompt gives instructions and malformed lines in order; other lines are ignored,
    and parse_instructions keeps only the instructions."""
    text = "Please:\ndelete a.txt\n  rename x y to z in *.py\nRenamed files are fine.\nrun ls\n"
    parsed = parse_prompt(text)
    assert [type(p).__name__ for p in parsed] == ["Instruction", "NotUnderstood", "Instruction"]
    assert parse_instructions(text) == [
        Instruction("delete", "a.txt"),
        Instruction("run", "", "", "ls"),
    ]
