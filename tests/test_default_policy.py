"""A run given no policy says how many permission requests its default rule rejected.

Without a policy every permission request is rejected (rule ``default``): an agent that asks
before it edits changes nothing, and the run still succeeds. The run counts those rejections
(``defaultRejections`` in every ``--json`` object, ``default_rejections`` on the library's
results), the human output ends with a line saying so, and a report shows a notice. None of it
when a policy was given, or when nothing was rejected by default.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from run_helpers import CLI, as_json, project_config, run_cli

from orchestrator.agents import resolve_agent
from orchestrator.cli.output import output_schema
from orchestrator.report import render_html, render_markdown
from orchestrator.sync import prompt_sync, run_pipeline_sync

#: a test through the console script: slow, and only where it is installed
through_cli = pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")

EDIT = 'replace "colour" with "color" in README.md'
ONE = (
    "1 permission request was rejected by the default policy (no policy was given); "
    "--policy edit allows edits"
)
#: the line of a run some of whose steps (or agents) name a policy of their own
SCOPED = ONE.replace("(no policy was given)", "(no policy was given to the run, nor to step edit)")
#: the line of a resumed run whose rejections are all in the instances it reused
REUSED = (
    "1 permission request was rejected by the default policy in steps reused from an earlier"
    " attempt of the run, which was given no policy; they keep their recorded result (a new run"
    " asks again)"
)
NONE = {"count": 0, "steps": {}, "reused": 0, "scoped": False}

PIPELINE = """\
from orchestrator import step


@step(agent="demo")
def edit(task: str) -> str:
    return task


@step(agent="demo", policy="read-only")
def check(edit: object, task: str) -> str:
    return task
"""

#: its last step fails until the file named by the input ``gate`` exists
GATED = """\
import os

from orchestrator import step


@step(agent="demo")
def edit(task: str) -> str:
    return task


@step()
def wait(edit: object, gate: str) -> int:
    if not os.path.exists(gate):
        raise RuntimeError("the gate is closed")
    return 1
"""


@pytest.fixture
def colour(tmp_path: Path) -> Path:
    """A project whose README the demo agent's edit changes."""
    root = tmp_path / "colour"
    root.mkdir()
    (root / "README.md").write_text("The colour of money.\n")
    return root


def ending(done: subprocess.CompletedProcess[bytes], marker: str) -> list[str]:
    """The lines of the stream that holds the result's ending (the line matching ``marker``),
    from that line on."""
    for stream in (done.stdout, done.stderr):
        lines = stream.decode().splitlines()
        found = [i for i, line in enumerate(lines) if re.fullmatch(marker, line)]
        if found:
            return lines[found[-1] :]
    raise AssertionError(f"no line {marker!r} in {done.stdout!r} or {done.stderr!r}")


def check(document: Any) -> None:
    """``document`` is valid under the shipped schema."""
    jsonschema.Draft202012Validator(output_schema()).validate(document)


@pytest.mark.slow
@through_cli
async def test_prompt_says_the_default_policy_rejected_requests(
    colour: Path, state_dir: Path
) -> None:
    """prompt without a policy ends with the count and the option; --json counts it."""
    done = await run_cli("prompt", "--agent", "demo", EDIT, cwd=colour, state=state_dir)
    assert done.returncode == 0, done.stderr
    assert ending(done, "no file changed") == ["no file changed", ONE]
    done = await run_cli("prompt", "--agent", "demo", "--json", EDIT, cwd=colour, state=state_dir)
    result = as_json(done)
    check(result)
    assert result["defaultRejections"] == {
        "count": 1,
        "steps": {"prompt": 1},
        "reused": 0,
        "scoped": False,
    }
    assert [p["rule"] for p in result["permissions"]] == ["default"]


@pytest.mark.slow
@through_cli
async def test_prompt_with_a_policy_says_nothing(colour: Path, state_dir: Path) -> None:
    """prompt --policy: no line and a count of 0, also when the policy rejected the edit."""
    for policy in ("edit", "read-only"):
        done = await run_cli(
            "prompt", "--agent", "demo", "--policy", policy, EDIT, cwd=colour, state=state_dir
        )
        assert done.returncode == 0, done.stderr
        assert "default policy" not in (done.stdout + done.stderr).decode()
        done = await run_cli(
            "prompt", "--agent", "demo", "--policy", policy, "--json", EDIT,
            cwd=colour, state=state_dir,
        )  # fmt: skip
        assert as_json(done)["defaultRejections"] == NONE


@pytest.mark.slow
@through_cli
async def test_prompt_that_asked_nothing_says_nothing(colour: Path, state_dir: Path) -> None:
    """No request was rejected (the agent asked for none): no line, a count of 0."""
    quiet = 'replace "nothing here" with "x" in README.md'
    done = await run_cli("prompt", "--agent", "demo", quiet, cwd=colour, state=state_dir)
    assert done.returncode == 0, done.stderr
    assert ending(done, "no file changed") == ["no file changed"]
    done = await run_cli("prompt", "--agent", "demo", "--json", quiet, cwd=colour, state=state_dir)
    assert as_json(done)["defaultRejections"] == NONE


@pytest.mark.slow
@through_cli
async def test_compare_counts_per_agent_and_reports_it(
    colour: Path, tmp_path: Path, state_dir: Path
) -> None:
    """compare: the line, the count by agent (not for an agent whose config names a policy),
    and the notice in both reports."""
    demo = json.dumps(list(resolve_agent("demo").command))
    project_config(colour, f'[agents.editor]\ncommand = {demo}\npolicy = "edit"\n')
    agents = ["--agent", "demo", "--agent", "other=demo", "--agent", "editor"]
    report = tmp_path / "report"
    done = await run_cli(
        "compare", "--no-progress", *agents, "--report", str(report), EDIT,
        cwd=colour, state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert ending(done, r"run [0-9a-f]{12}: succeeded")[-1] == (
        "2 permission requests were rejected by the default policy (no policy was given to the"
        " run, nor to agents demo, other); --policy edit allows edits"
    )
    html, markdown = (report / "report.html").read_text(), (report / "report.md").read_text()
    notice = "2 permission requests were rejected by the default policy (no policy was given"
    assert f'<p class="notice" role="note">{notice}' in html
    assert markdown.splitlines()[2].startswith(f"> **Note:** {notice}")
    done = await run_cli("compare", "--json", *agents, EDIT, cwd=colour, state=state_dir)
    result = as_json(done)
    check(result)
    assert result["defaultRejections"] == {
        "count": 2,
        "steps": {"compare[demo]": 1, "compare[other]": 1},
        "reused": 0,
        "scoped": True,
    }
    shown = as_json(await run_cli("show", "--json", result["runId"], cwd=colour, state=state_dir))
    assert shown["defaultRejections"] == result["defaultRejections"]


@pytest.mark.slow
@through_cli
async def test_compare_with_a_policy_says_nothing(
    colour: Path, tmp_path: Path, state_dir: Path
) -> None:
    """compare --policy edit: no line, a count of 0, no notice in the report."""
    report = tmp_path / "report"
    agents = ["--agent", "demo", "--agent", "other=demo"]
    done = await run_cli(
        "compare", "--no-progress", "--policy", "edit", *agents, "--report", str(report), EDIT,
        cwd=colour, state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "default policy" not in (done.stdout + done.stderr).decode()
    assert "default policy" not in (report / "report.html").read_text()
    assert "default policy" not in (report / "report.md").read_text()
    done = await run_cli(
        "compare", "--json", "--policy", "edit", *agents, EDIT, cwd=colour, state=state_dir
    )
    assert as_json(done)["defaultRejections"] == NONE


@pytest.mark.slow
@through_cli
async def test_run_counts_only_the_steps_without_a_policy(colour: Path, state_dir: Path) -> None:
    """run: the step that names a policy is not counted; the line ends the output and names
    the step that had no policy."""
    pipeline = colour.parent / "pipe.py"
    pipeline.write_text(PIPELINE)
    args = ("run", str(pipeline), "--set", f"task={EDIT}")
    done = await run_cli(*args, "--no-progress", cwd=colour, state=state_dir)
    assert done.returncode == 0, done.stderr
    assert ending(done, r"run [0-9a-f]{12}: succeeded")[-1] == SCOPED
    result = as_json(await run_cli(*args, "--json", cwd=colour, state=state_dir))
    check(result)
    assert [p["rule"] for p in result["steps"]["check"]["instances"]["check"]["permissions"]] == [
        "step:check/read-only: everything else"
    ]
    assert result["defaultRejections"] == {
        "count": 1,
        "steps": {"edit": 1},
        "reused": 0,
        "scoped": True,
    }
    done = await run_cli(*args, "--policy", "edit", "--json", cwd=colour, state=state_dir)
    assert as_json(done)["defaultRejections"] == NONE


@pytest.mark.slow
@through_cli
async def test_resume_says_it_too(colour: Path, state_dir: Path) -> None:
    """resume: the rejections of the reused instance still count, in text and --json, as
    reused ones: no option is offered, as resuming reuses them again."""
    pipeline, gate = colour.parent / "gated.py", colour.parent / "gate"
    pipeline.write_text(GATED)
    done = await run_cli(
        "run", str(pipeline), "--json", "--set", f"task={EDIT}", "--set", f"gate={gate}",
        cwd=colour, state=state_dir,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    run_id = as_json(done)["runId"]
    gate.touch()
    done = await run_cli("resume", "--no-progress", run_id, cwd=colour, state=state_dir)
    assert done.returncode == 0, done.stderr
    assert ending(done, f"run {run_id}: succeeded")[-1] == REUSED
    result = as_json(await run_cli("resume", "--json", run_id, cwd=colour, state=state_dir))
    check(result)
    assert result["defaultRejections"] == {
        "count": 1,
        "steps": {"edit": 1},
        "reused": 1,
        "scoped": False,
    }


@pytest.mark.slow
@through_cli
async def test_resume_with_a_policy_offers_no_option_it_was_given(
    colour: Path, state_dir: Path
) -> None:
    """resume --policy edit of a prompt made without one: the reused turn's rejection is said
    to keep its recorded result, and --policy edit is not offered again."""
    done = await run_cli("prompt", "--agent", "demo", "--json", EDIT, cwd=colour, state=state_dir)
    run_id = as_json(done)["runId"]
    done = await run_cli(
        "resume", "--no-progress", run_id, "--policy", "edit", cwd=colour, state=state_dir
    )
    assert done.returncode == 0, done.stderr
    assert "replaced by this resume: policy" in done.stderr.decode()
    # the note ends the result, on stdout
    assert done.stdout.decode().splitlines()[-1] == REUSED
    assert "--policy edit" not in (done.stdout + done.stderr).decode()
    result = as_json(
        await run_cli("resume", "--json", run_id, "--policy", "edit", cwd=colour, state=state_dir)
    )
    check(result)
    assert result["defaultRejections"] == {
        "count": 1,
        "steps": {"prompt": 1},
        "reused": 1,
        "scoped": False,
    }


@pytest.mark.slow
@through_cli
async def test_resume_counts_the_latest_attempt_of_an_instance_run_again(
    colour: Path, state_dir: Path
) -> None:
    """An instance a resume runs again counts its new rejections, not its earlier attempt's,
    and with the option, since a policy given to a resume would decide them."""
    gate = colour.parent / "gate"
    done = await run_cli(
        "compare", "--json", "--agent", "demo", "--verify", f"test -e {gate}", EDIT,
        cwd=colour, state=state_dir,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    run_id = as_json(done)["runId"]
    gate.touch()
    done = await run_cli("resume", "--no-progress", run_id, cwd=colour, state=state_dir)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().splitlines()[-1] == ONE  # the result's last line
    result = as_json(await run_cli("show", "--json", run_id, cwd=colour, state=state_dir))
    assert result["defaultRejections"] == {
        "count": 1,
        "steps": {"compare[demo]": 1},
        "reused": 0,
        "scoped": False,
    }


@pytest.mark.slow
@through_cli
async def test_a_given_policy_that_decides_nothing_is_not_counted(
    colour: Path, state_dir: Path
) -> None:
    """A policy file whose rules match nothing rejects under a rule named after it, in the
    run's scope or a step's, and the default policy's notice says nothing of it."""
    nomatch = colour.parent / "nomatch.toml"
    nomatch.write_text('[[rules]]\nname = "docs"\nverdict = "allow"\npaths = ["docs/**"]\n')
    args = ("prompt", "--agent", "demo", "--policy", str(nomatch))
    done = await run_cli(*args, "--json", EDIT, cwd=colour, state=state_dir)
    result = as_json(done)
    assert [p["rule"] for p in result["permissions"]] == ["run/nomatch.toml: default"]
    assert result["defaultRejections"] == NONE
    done = await run_cli(*args, EDIT, cwd=colour, state=state_dir)
    assert done.returncode == 0, done.stderr
    assert "default policy" not in (done.stdout + done.stderr).decode()
    named = colour.parent / "named.toml"
    named.write_text(f'name = "docs only"\n{nomatch.read_text()}')
    done = await run_cli(
        "prompt", "--agent", "demo", "--policy", str(named), "--json", EDIT,
        cwd=colour, state=state_dir,
    )  # fmt: skip
    assert [p["rule"] for p in as_json(done)["permissions"]] == ["run/docs only: default"]
    pipeline = colour.parent / "pipe.py"
    pipeline.write_text(PIPELINE.replace('policy="read-only"', f"policy={str(nomatch)!r}"))
    done = await run_cli(
        "run", str(pipeline), "--json", "--set", f"task={EDIT}", cwd=colour, state=state_dir
    )
    result = as_json(done)
    rules = {
        name: [p["rule"] for i in step["instances"].values() for p in i["permissions"]]
        for name, step in result["steps"].items()
    }
    assert rules == {"edit": ["default"], "check": ["step:check/nomatch.toml: default"]}
    assert result["defaultRejections"] == {
        "count": 1,
        "steps": {"edit": 1},
        "reused": 0,
        "scoped": True,
    }


def test_library_results_count_default_rejections(colour: Path) -> None:
    """prompt_sync and run_pipeline_sync: default_rejections counts, its message names no
    command-line option; with a policy it is empty."""
    run = prompt_sync("demo", EDIT, cwd=colour)
    assert (run.default_rejections.count, dict(run.default_rejections.steps)) == (1, {"prompt": 1})
    assert run.default_rejections.message == (
        "1 permission request was rejected by the default policy (no policy was given)"
    )
    assert run.to_json()["defaultRejections"] == {
        "count": 1,
        "steps": {"prompt": 1},
        "reused": 0,
        "scoped": False,
    }
    edited = prompt_sync("demo", EDIT, cwd=colour, policy="edit")
    assert (edited.default_rejections.count, edited.default_rejections.message) == (0, None)
    pipeline = colour.parent / "pipe.py"
    pipeline.write_text(PIPELINE)
    outcome = run_pipeline_sync(pipeline, {"task": EDIT}, cwd=colour)
    assert outcome.default_rejections.count == 1
    assert dict(outcome.default_rejections.steps) == {"edit": 1}
    assert outcome.default_rejections.message == (
        "1 permission request was rejected by the default policy (no policy was given to the"
        " run, nor to step edit)"
    )
    assert outcome.result["defaultRejections"] == {
        "count": 1,
        "steps": {"edit": 1},
        "reused": 0,
        "scoped": True,
    }


def test_report_notice_only_when_requests_were_rejected_by_default() -> None:
    """A pipeline result with default rejections shows the notice; without them, none."""
    result: dict[str, Any] = {
        "kind": "pipeline",
        "runId": "ab12cd34ef56",
        "status": "succeeded",
        "graph": {"nodes": [{"name": "edit", "kind": "agent"}], "edges": []},
        "steps": {"edit": {"status": "succeeded", "instances": {}}},
        "defaultRejections": {"count": 3, "steps": {"edit": 3}},
    }
    notice = "3 permission requests were rejected by the default policy (no policy was given"
    assert f'<p class="notice" role="note">{notice}' in render_html(result)
    assert f"> **Note:** {notice}" in render_markdown(result)
    for quiet in ({"count": 0, "steps": {}}, None):
        result["defaultRejections"] = quiet
        assert 'class="notice"' not in render_html(result)
        assert "**Note:**" not in render_markdown(result)
