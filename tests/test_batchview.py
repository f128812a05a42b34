"""Batch runs on the read side, without the console script: the batch table and summary line,
the batch report, the store's children and top-level listing, and a batch's object as seen."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from batch_records import batch_object, entry, make_batch

from orchestrator.cli.batchview import batch_summary_line, batch_table, cell_text
from orchestrator.cli.output import SCHEMA_VERSION, output_schema
from orchestrator.errors import RunNotFound, StoreError, UsageError
from orchestrator.report import ReportError, render_batch_report
from orchestrator.runs import diff_run, get_run_json, list_runs
from orchestrator.runs._lock import hold_run_lock
from orchestrator.runs.recorded import batch_diffs, list_run_groups, write_batch_report
from orchestrator.store import RunRecord, open_run_store

PIPE = Path("/p/fix.py")


def sample() -> dict[str, Any]:
    """A finished batch of five repositories, one of each outcome."""
    repos = [
        entry("svc-a", runId="0123456789aa", status="succeeded", exitCode=0, files=3, added=10,
              removed=2, verify="passed", branch="agent/fix", pushed="origin", tokens=1234,
              seconds=3.2),
        entry("svc-b", runId="0123456789bb", status="failed", exitCode=1, files=0, added=0,
              removed=0, verify="failed", error="step verify failed: exit 1", seconds=65.0),
        entry("svc-c", status="failed", error="clone failed: fatal: repository not found"),
        entry("svc-d", status="skipped", skipped="budget", error="the batch budget was spent"),
        entry("svc-e", runId="0123456789ee", status="succeeded", exitCode=0, applied=True),
    ]  # fmt: skip
    return batch_object("0123456789ab", PIPE, repos, "failed")


def test_the_table_has_a_row_per_repository_with_its_outcome() -> None:
    """Each repository's outcome, files, lines, verify, branch with its remote, tokens, time."""
    lines = batch_table(sample(), 200)
    assert lines[0].split() == [
        "REPOSITORY", "OUTCOME", "FILES", "+/-", "VERIFY", "BRANCH", "TOKENS", "TIME",
    ]  # fmt: skip
    a, b, c, d, e = lines[1:]
    assert a.split() == ["svc-a", "succeeded", "3", "+10", "-2", "passed", "agent/fix,",
                         "pushed", "to", "origin", "1,234", "3.2", "s"]  # fmt: skip
    assert "failed: step verify failed: exit 1" in b and "1 min 05 s" in b
    assert "failed: clone failed: fatal: repository not found" in c
    assert "skipped: budget" in d
    assert "succeeded, applied" in e
    assert len({len(line) for line in lines[:3]}) == 1  # the columns line up


def test_the_summary_line_names_what_did_not_succeed() -> None:
    """Successes of the total, then the failures with exit code or reason, then the skipped."""
    assert batch_summary_line(sample()) == (
        "2 of 5 repositories succeeded; failed: svc-b (exit 1), svc-c (clone failed); "
        "skipped: svc-d (budget)"
    )
    ok = batch_object("0123456789ab", PIPE, [entry("one", status="succeeded")], "succeeded")
    assert batch_summary_line(ok) == "1 of 1 repository succeeded"
    many = [entry(f"r{i}", status="failed", exitCode=1) for i in range(13)]
    said = batch_summary_line(batch_object("0123456789ab", PIPE, many, "failed"))
    assert said.endswith("r9 (exit 1) and 3 more")


def test_an_unfinished_batch_says_what_is_still_to_come() -> None:
    """A running batch: pending and running entries read so, and the count says "so far"."""
    repos = [entry("a", status="succeeded"), entry("b", status="running"), entry("c")]
    batch = batch_object("0123456789ab", PIPE, repos, "running")
    assert batch_summary_line(batch) == (
        "1 of 3 repositories succeeded so far; running: b; pending: c"
    )
    rows = batch_table(batch, 120)
    assert rows[2].split()[:2] == ["b", "running"] and rows[3].split()[:2] == ["c", "pending"]


@pytest.mark.parametrize("width", [200, 120, 80, 60, 40])
def test_a_wide_table_is_fitted_to_the_width(width: int) -> None:
    """Long names, errors and branches are cut with an ellipsis; the columns least useful go
    first, never the repository or its outcome; every line fits (down to a floor)."""
    batch = sample()
    batch["repos"][0]["name"] = "github.com/some-organisation/" + "x" * 80 + "/svc-a"
    batch["repos"][0]["branch"] = "agent/" + "long-branch-" * 10
    batch["repos"][1]["error"] = "step verify failed: " + "word " * 60
    lines = batch_table(batch, width)
    assert all(len(line) <= max(width, 40) for line in lines), lines
    head = lines[0].split()
    assert head[:2] == ["REPOSITORY", "OUTCOME"]
    if width >= 120:
        assert "BRANCH" in head and "+/-" in head
    # the name's head and tail, its middle cut
    name = lines[1].split()[0]
    assert name.startswith("github") and name.endswith("svc-a") and "\u2026" in name


def test_hostile_names_and_errors_are_escaped_and_stay_one_line() -> None:
    """Control characters, newlines and tabs in any value come out escaped, a row per line."""
    batch = sample()
    batch["repos"][0]["name"] = "evil\x1b[2J\nname\tx"
    batch["repos"][1]["error"] = "boom\r\n\x07second line"
    batch["repos"][0]["branch"] = "br\x9banch"
    lines = batch_table(batch, 200)
    assert len(lines) == 6
    text = "\n".join(lines) + batch_summary_line(batch)
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text and "\t" not in text
    assert "evil\\x1b[2J\\nname\\tx" in lines[1]
    assert "br\\u009banch" in lines[1]
    assert cell_text("a\r\nb") == "a\\r\\nb"


@pytest.mark.parametrize(
    "batch",
    [
        {},
        {"repos": None},
        {"repos": "nope"},
        {"repos": [None, 3, {}]},
        {"repos": [dict.fromkeys(entry("x"))]},
        {"repos": [{"name": 5, "status": 7, "files": "many", "added": True, "tokens": "x"}]},
    ],
)
def test_any_field_may_be_null_or_wrong(batch: dict[str, Any]) -> None:
    """Missing, null and mistyped fields read as unknown (``-``), never an exception."""
    lines = batch_table(batch, 100)
    assert lines[0].startswith("REPOSITORY")
    assert isinstance(batch_summary_line(batch), str)


def test_the_report_has_the_table_and_each_diff_escaped(tmp_path: Path) -> None:
    """report.html and report.md hold every repository, its outcome and its diff; text from a
    repository is escaped in HTML and inert in Markdown."""
    batch = sample()
    batch["repos"][1]["name"] = "<script>alert(1)</script>"
    diffs = {
        "svc-a": "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-colour\n+color\n",
        "<script>alert(1)</script>": "",
    }
    paths = render_batch_report(batch, diffs, tmp_path / "out")
    html = paths.html.read_text()
    md = paths.markdown.read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'id="summary"' in html and 'id="diffs"' in html and 'id="repo-5"' in html
    assert (
        'class="l-add"' in html
        and "colour" in html
        and "clone failed" in html
        and "pushed to origin" in html
    )
    assert "2 of 5 repositories succeeded" in md
    assert "| svc-a | succeeded | 3 | +10 -2 | passed | agent/fix, pushed to origin |" in md
    assert "```diff" in md and "+color" in md
    assert "\\<script>" in md  # no tag in Markdown
    with pytest.raises(ReportError):
        render_batch_report([], {}, tmp_path / "bad")  # type: ignore[arg-type]
    (tmp_path / "file").write_text("")
    with pytest.raises(ReportError, match="not a directory"):
        render_batch_report(batch, diffs, tmp_path / "file")


def test_the_batch_object_matches_the_schema() -> None:
    """The format's batch object validates under the shipped schema's batch definition."""
    document = {"schemaVersion": SCHEMA_VERSION, **sample(), "statusReason": None}
    jsonschema.Draft202012Validator(output_schema()).validate(document)
    batch_def = {**output_schema(), "anyOf": [{"$ref": "#/$defs/batch"}]}
    broken = {**document, "repos": [{**document["repos"][0], "status": "weird"}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(batch_def).validate(broken)


async def test_the_store_lists_children_and_top_level_runs(state_dir: Path) -> None:
    """set_parent makes a child of a batch (only of a batch, never of a batch); children lists
    them oldest first; list_runs(top_level=True) leaves them out, unless their batch is gone."""
    now = time.time()
    async with open_run_store(state_dir) as store:
        await store.create_run(RunRecord("b00000000001", "batch", "running", now, "/b"))
        for i in range(3):
            await store.create_run(RunRecord(f"c0000000000{i}", "pipeline", "succeeded",
                                             now + 1 + i, "/c"))  # fmt: skip
        await store.create_run(RunRecord("p00000000001", "pipeline", "failed", now + 9, "/p"))
        for i in (2, 0, 1):
            await store.set_parent(f"c0000000000{i}", "b00000000001")
        with pytest.raises(StoreError, match="not a batch run"):
            await store.set_parent("c00000000000", "p00000000001")
        with pytest.raises(StoreError, match="cannot belong"):
            await store.set_parent("b00000000001", "b00000000001")
        with pytest.raises(RunNotFound):
            await store.set_parent("c00000000000", "ffffffffffff")
        kids = await store.children("b00000000001")
        assert [k.run_id for k in kids] == ["c00000000000", "c00000000001", "c00000000002"]
        assert {k.parent for k in kids} == {"b00000000001"}
        top = await store.list_runs(top_level=True, limit=1)
        assert [r.run_id for r in top] == ["p00000000001"]
        every = await store.list_runs(limit=None)
        assert len(every) == 5
        unparented = await store.set_parent("c00000000002", None)
        assert unparented.parent is None
        await store.delete_run("b00000000001")
        top = await store.list_runs(top_level=True, limit=None)
        # the batch gone, its runs are runs of their own
        assert [r.run_id for r in top] == ["p00000000001", "c00000000002", "c00000000001",
                                           "c00000000000"]  # fmt: skip
    assert len(await list_runs(state_dir=state_dir, limit=None)) == 4


async def test_a_batch_whose_process_is_gone_reads_interrupted(state_dir: Path) -> None:
    """A batch recorded running whose process died: it and its unfinished repositories read
    interrupted, with the reason; while its process holds the lock, it reads running."""
    repos = [entry("a", status="succeeded"), entry("b", status="running"), entry("c")]
    now = time.time()
    async with open_run_store(state_dir) as store:
        await store.create_run(
            RunRecord("b00000000002", "batch", "running", now, "/b", pipeline=str(PIPE),
                      result=batch_object("b00000000002", PIPE, repos, "running"))
        )  # fmt: skip
    run_dir = state_dir / "runs" / "b00000000002"
    with hold_run_lock(run_dir, "b00000000002", doing="batch"):
        live = await get_run_json("b00000000002", state_dir=state_dir)
        assert live["status"] == "running" and live["statusReason"] is None
        assert [r["status"] for r in live["repos"]] == ["succeeded", "running", "pending"]
    # the lock file says this process: made to say one that is gone
    lock = run_dir / "lock"
    lock.write_text(lock.read_text().replace(f'"pid":{__import__("os").getpid()}', '"pid":4194305'))
    seen = await get_run_json("b00000000002", state_dir=state_dir)
    assert (seen["status"], seen["statusReason"]) == ("interrupted", "its process is gone")
    assert [r["status"] for r in seen["repos"]] == ["succeeded", "interrupted", "interrupted"]
    assert seen["counts"] == {"succeeded": 1, "failed": 0, "skipped": 0, "interrupted": 2}
    assert "interrupted: b, c" in batch_summary_line(seen)
    [(top, kids)] = await list_run_groups(state_dir=state_dir)
    assert (top.status, kids) == ("interrupted", [])


async def test_a_batch_that_kept_no_object_yet_is_read_from_its_options(state_dir: Path) -> None:
    """A batch just started (no result recorded): its repositories from its options, pending."""
    specs = [{"name": "a", "source": "../a"}, {"source": "git@host:org/b.git"}, "../c/"]
    async with open_run_store(state_dir) as store:
        await store.create_run(
            RunRecord("b00000000003", "batch", "running", time.time(), "/b",
                      options={"repos": specs, "maxRepos": 3, "maxSessions": 6,
                               "budget": {"maxTokens": 5, "onSpent": "cancel"}})
        )  # fmt: skip
    with hold_run_lock(state_dir / "runs" / "b00000000003", "b00000000003", doing="batch"):
        shown = await get_run_json("b00000000003", state_dir=state_dir)
    assert [r["name"] for r in shown["repos"]] == ["a", "b.git", "c"]
    assert {r["status"] for r in shown["repos"]} == {"pending"}
    assert (shown["maxRepos"], shown["budget"]["maxTokens"], shown["budget"]["onSpent"]) == (
        3,
        5,
        "cancel",
    )
    jsonschema.Draft202012Validator(output_schema()).validate(
        {"schemaVersion": SCHEMA_VERSION, **shown}
    )


async def test_diffs_and_report_of_a_recorded_batch(tmp_path: Path, state_dir: Path) -> None:
    """Real child runs: each repository's diff by name (a child's as diff_run gives it), the
    store-reading report, a child's object naming its batch, diff_run refusing the batch."""
    batch_id, kids = await make_batch(tmp_path, state_dir, {"svc-a": False, "svc-b": True})
    async with open_run_store(state_dir) as store:
        diffs = await batch_diffs(batch_id, store=store)
        with pytest.raises(UsageError, match="not a batch run"):
            await batch_diffs(kids["svc-a"], store=store)
    assert list(diffs) == ["svc-a", "svc-b", "clone-x", "skip-x"]
    assert diffs["svc-a"] == await diff_run(kids["svc-a"], state_dir=state_dir)
    assert "+The color of money." in diffs["svc-a"] and diffs["clone-x"] == ""
    with pytest.raises(UsageError, match="is a batch run"):
        await diff_run(batch_id, state_dir=state_dir)
    child = await get_run_json(kids["svc-b"], state_dir=state_dir)
    assert (child["parent"], child["status"]) == (batch_id, "failed")
    batch, paths = await write_batch_report(batch_id, tmp_path / "report", state_dir=state_dir)
    assert batch["runId"] == batch_id
    md = paths.markdown.read_text()
    assert md.count("+The color of money.") == 2 and "### clone-x" in md
