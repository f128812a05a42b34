"""The run commands of the installed console script, against the built-in demo agent."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from orchestrator.cli.output import output_schema

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "sample-project"
DEMO_PIPELINE = ROOT / "examples" / "demo_pipeline.py"
CLI = Path(sys.executable).parent / "orchestrator"

pytestmark = pytest.mark.slow


def cli(*args: str, state: Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)}
    return subprocess.run(
        [str(CLI), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=180
    )


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the sample project."""
    target = tmp_path / "sample-project"
    shutil.copytree(SAMPLE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_run_demo_pipeline_then_show_diff_apply(
    project: Path, tmp_path: Path, state_dir: Path
) -> None:
    """run reports fan-out, merge conflict and report; runs/show/diff/apply work from the store."""
    before = snapshot(project)
    report = tmp_path / "report"
    done = cli(
        "run", str(DEMO_PIPELINE), "--cwd", str(project), "--policy", "trusted",
        "--json", "--report", str(report), state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = as_json(done)
    assert result["kind"] == "pipeline"
    assert result["status"] == "succeeded"
    assert list(result["steps"]) == ["files", "rename", "docs", "check"]
    assert set(result["steps"]["rename"]["instances"]) == {
        "shop/__init__.py",
        "shop/cart.py",
        "shop/pricing.py",
    }
    assert list(result["steps"]["docs"]["instances"]) == ["alice", "bob"]
    # an instance's own diff holds its own edits, not those it inherited from its parents
    alice = result["steps"]["docs"]["instances"]["alice"]["diff"]
    assert "README.md" in alice and "docs/pricing.md" in alice
    assert "shop/cart.py" not in alice
    [conflict] = result["conflicts"]
    assert conflict["path"] == "README.md"
    assert conflict["resolution"] == "ours"
    assert conflict["branches"] == ["docs[alice]", "docs[bob]"]
    assert "colour" in conflict["base"] and "color" in conflict["ours"]
    changed = {c["path"]: c["change"] for c in result["changes"]}
    assert changed["docs/pricing.md"] == "added"
    assert changed["shop/pricing.py"] == "modified"
    assert "+def compute_total" in result["diff"]
    assert result["applied"] is False
    assert snapshot(project) == before  # nothing written without --apply
    html = (report / "report.html").read_text()
    assert "README.md" in html and "rename" in html
    assert (report / "report.md").exists()
    run_id = result["runId"]

    listed = as_json(cli("runs", "--json", state=state_dir))
    assert run_id in [r["runId"] for r in listed["runs"]]
    shown = as_json(cli("show", run_id[:8], "--json", state=state_dir))
    assert shown["status"] == "succeeded"
    assert shown["steps"]["docs"]["status"] == "succeeded"
    diff = cli("diff", run_id, state=state_dir)
    assert diff.returncode == 0 and "+def compute_total" in diff.stdout
    step_diff = cli("diff", run_id, "--step", "docs[bob]", state=state_dir)
    assert "CHANGES.md" in step_diff.stdout

    applied = cli("apply", run_id, "--json", state=state_dir)
    assert applied.returncode == 0, applied.stderr
    assert as_json(applied)["applied"] is True
    assert "def compute_total" in (project / "shop" / "pricing.py").read_text()
    assert (project / "docs" / "pricing.md").exists()


FAN_IN = """\
from orchestrator import StepContext, step


@step(agent=["alice=demo", "bob=demo", "carol=demo"])
def notes(ctx: StepContext) -> str:
    return f'append "- {ctx.agent} was here.\\\\n" to CHANGES.md\\n'


@step()
def summary(notes: object) -> str:
    return "done"
"""


def test_fan_in_of_three_conflicting_branches_is_one_conflict(
    project: Path, tmp_path: Path, state_dir: Path
) -> None:
    """Three branches clashing on CHANGES.md: one conflict, labelled alike in JSON, text, report."""
    pipeline = tmp_path / "fan_in.py"
    pipeline.write_text(FAN_IN)
    report = tmp_path / "report"
    done = cli(
        "run", str(pipeline), "--cwd", str(project), "--policy", "trusted", "--json",
        "--no-progress", "--report", str(report), state=state_dir,
    )  # fmt: skip
    assert done.returncode == 4, done.stderr
    result = as_json(done)
    jsonschema.Draft202012Validator(output_schema()).validate(result)
    [conflict] = result["conflicts"]
    assert conflict["path"] == "CHANGES.md" and conflict["resolution"] == "fail"
    assert conflict["branches"] == ["notes[alice]", "notes[bob]", "notes[carol]"]
    assert (conflict["oursLabel"], conflict["theirsLabel"]) == ("notes[alice]", "notes[bob]")
    # ours is the merge so far (alice alone), theirs the branch merged into it (bob)
    assert "alice was here" in conflict["ours"] and "bob" not in conflict["ours"]
    assert "bob was here" in conflict["theirs"]
    [also] = conflict["alsoChanged"]
    assert also["label"] == "notes[carol]" and "carol was here" in also["content"]
    line = (
        "  conflict in CHANGES.md at summary (content): unresolved; ours notes[alice], "
        "theirs notes[bob]; also changed by notes[carol]"
    )
    shown = cli("show", result["runId"], state=state_dir)
    assert shown.stdout.splitlines().count(line) == 1, shown.stdout
    assert sum(x.startswith("  conflict in") for x in shown.stdout.splitlines()) == 1
    refused = cli("apply", result["runId"], state=state_dir)
    assert refused.returncode == 4
    assert refused.stderr.count("CHANGES.md") == 1, refused.stderr
    md = (report / "report.md").read_text()
    assert md.count("### 1. `CHANGES.md`") == 1 and "### 2." not in md
    ours_block = md.split("**Ours: notes[alice]**", 1)[1].split("**Theirs", 1)[0]
    assert "alice was here" in ours_block and "bob was here" not in ours_block
    assert "**Also changed by: notes[carol]**" in md
    html = (report / "report.html").read_text()
    assert html.count('class="conflict"') == 1
    assert "Ours: notes[alice]" in html and "Also: notes[carol]" in html


def test_apply_refused_when_workspace_changed(project: Path, state_dir: Path) -> None:
    """apply exits 3 and writes nothing when a file the run changed was edited meanwhile."""
    done = cli(
        "run", str(DEMO_PIPELINE), "--cwd", str(project), "--policy", "trusted", "--json",
        "--no-progress", state=state_dir,
    )  # fmt: skip
    run_id = as_json(done)["runId"]
    (project / "README.md").write_text("edited by hand\n")
    before = snapshot(project)
    refused = cli("apply", run_id, "--json", state=state_dir)
    assert refused.returncode == 3
    assert "README.md" in as_json(refused)["workspaceChanged"]
    assert snapshot(project) == before


def test_show_report_of_a_compare_names_the_applied_agent(
    project: Path, tmp_path: Path, state_dir: Path
) -> None:
    """compare --apply bob, then show --report: the report says bob's changes were applied."""
    done = cli(
        "compare", "--agent", "alice=demo", "--agent", "bob=demo", "--cwd", str(project),
        "--policy", "trusted", "--apply", "bob", "--json", "--no-progress",
        'replace "colour" with "color" in README.md', state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert as_json(done)["applied"] == "bob"
    report = tmp_path / "report"
    shown = cli("show", as_json(done)["runId"], "--report", str(report), state=state_dir)
    assert shown.returncode == 0, shown.stderr
    md = (report / "report.md").read_text()
    assert "| Applied | bob |" in md
    # the column heading tags the applied agent (and the winner, whichever won the race)
    assert re.search(r"\| bob \((winner, )?applied\) \|", md), md
    html = (report / "report.html").read_text()
    assert '<th scope="row">Applied</th><td>bob</td>' in html


def test_show_report_of_a_pipeline_names_the_step_instance_applied(
    project: Path, tmp_path: Path, state_dir: Path
) -> None:
    """apply RUN --step notes[bob], then show --report: Applied names notes[bob], not "yes"."""
    pipeline = tmp_path / "two.py"
    pipeline.write_text(
        "from orchestrator import StepContext, step\n"
        "@step(agent=['alice=demo', 'bob=demo'])\n"
        "def notes(ctx: StepContext) -> str:\n"
        "    return f'create {ctx.agent}.txt with \"hi\\\\n\"\\n'\n"
    )
    done = cli(
        "run", str(pipeline), "--cwd", str(project), "--policy", "trusted", "--json",
        "--no-progress", state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run_id = as_json(done)["runId"]
    applied = cli("apply", run_id, "--step", "notes[bob]", state=state_dir)
    assert applied.returncode == 0, applied.stderr
    assert (project / "bob.txt").exists() and not (project / "alice.txt").exists()
    report = tmp_path / "report"
    shown = cli("show", run_id, "--json", "--report", str(report), state=state_dir)
    assert as_json(shown)["appliedSteps"] == ["notes[bob]"]
    jsonschema.Draft202012Validator(output_schema()).validate(as_json(shown))
    assert "| Applied | notes[bob] |" in (report / "report.md").read_text()
    assert '<th scope="row">Applied</th><td>notes[bob]</td>' in (report / "report.html").read_text()


def test_run_refuses_bad_pipeline_with_exit_2(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """A cycle is refused before anything starts, with exit code 2 and a JSON error."""
    pipeline = tmp_path / "cycle.py"
    pipeline.write_text(
        "from orchestrator import step\n"
        "@step(agent='demo')\ndef a(b): return 'x'\n"
        "@step(agent='demo')\ndef b(a): return 'y'\n"
    )
    done = cli("run", str(pipeline), "--cwd", str(project), "--json", state=state_dir)
    assert done.returncode == 2
    assert "cycle" in as_json(done)["error"]["message"]


def test_run_refuses_a_bad_reuse_setting_with_exit_2(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """ORCHESTRATOR_REUSE_DIRS that is neither a yes nor a no: one line, exit 2, no run."""
    pipeline = tmp_path / "one.py"
    pipeline.write_text("from orchestrator import step\n@step()\ndef one() -> int: return 1\n")
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state_dir)}
    done = subprocess.run(
        [str(CLI), "run", str(pipeline), "--cwd", str(project)],
        capture_output=True,
        text=True,
        env={**env, "ORCHESTRATOR_REUSE_DIRS": "banana"},
        timeout=180,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert "ORCHESTRATOR_REUSE_DIRS='banana' is neither on" in done.stderr
    listed = cli("runs", "--json", state=state_dir)
    assert listed.returncode == 0 and as_json(listed)["runs"] == [], listed.stdout  # none recorded


def test_run_missing_input_exit_2(tmp_path: Path, project: Path, state_dir: Path) -> None:
    """A missing run input is named, exit 2; --set supplies it."""
    pipeline = tmp_path / "inputs.py"
    pipeline.write_text(
        "from orchestrator import step\n@step()\ndef twice(n: int) -> int: return n * 2\n"
    )
    missing = cli("run", str(pipeline), "--cwd", str(project), "--json", state=state_dir)
    assert missing.returncode == 2 and "n" in as_json(missing)["error"]["message"]
    done = cli(
        "run", str(pipeline), "--cwd", str(project), "--json", "--set", "n=21", state=state_dir
    )
    assert done.returncode == 0, done.stderr
    assert as_json(done)["steps"]["twice"]["instances"]["twice"]["value"] == 42


def test_failed_step_exit_1(tmp_path: Path, project: Path, state_dir: Path) -> None:
    """A failing step exits 1, and its dependent is skipped with the cause."""
    pipeline = tmp_path / "fail.py"
    pipeline.write_text(
        "from orchestrator import step\n"
        "@step()\ndef boom() -> int: raise ValueError('no')\n"
        "@step()\ndef after(boom) -> int: return 1\n"
        "@step()\ndef other() -> int: return 2\n"
    )
    done = cli("run", str(pipeline), "--cwd", str(project), "--json", state=state_dir)
    assert done.returncode == 1
    steps = as_json(done)["steps"]
    assert steps["boom"]["status"] == "failed"
    assert steps["after"]["status"] == "skipped" and "boom" in steps["after"]["cause"]
    assert steps["other"]["status"] == "succeeded"


def test_compare_two_demo_agents(project: Path, tmp_path: Path, state_dir: Path) -> None:
    """compare runs both agents, verifies each branch, and applies only the chosen one."""
    done = cli(
        "compare", "--agent", "a=demo", "--agent", "b=demo", "--cwd", str(project),
        "--policy", "edit", "--verify", "grep -q color README.md", "--json",
        "--report", str(tmp_path / "cmp"), "--apply", "a",
        'replace "colour" with "color" in README.md',
        state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = as_json(done)
    assert result["kind"] == "compare"
    names = [a["name"] for a in result["agents"]]
    assert names == ["a", "b"]
    for agent in result["agents"]:
        assert agent["status"] == "succeeded"
        assert agent["stopReason"] == "end_turn"
        assert agent["verify"]["exitCode"] == 0
        assert agent["changes"] == [{"path": "README.md", "change": "modified"}]
        assert agent["permissions"][0]["verdict"] == "allow"
    assert result["applied"] == "a"
    assert "color of the cart" in (project / "README.md").read_text()
    assert (tmp_path / "cmp" / "report.html").exists()


def test_show_keeps_a_python_failures_traceback_and_an_empty_fan_out(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """run, show and show --json give a Python step's traceback; a fan-out over [] succeeded."""
    pipeline = tmp_path / "tb.py"
    pipeline.write_text(
        "from orchestrator import step\n"
        "def parse(text):\n    return int(text)\n"
        "@step()\ndef boom() -> int:\n    return parse('not a number')\n"
        "@step()\ndef files() -> list:\n    return []\n"
        "@step(over='files')\ndef each(item):\n    return item\n"
        "@step()\ndef count(each) -> int:\n    return len(each)\n"
    )
    error = "ValueError: invalid literal for int() with base 10: 'not a number'"
    done = cli("run", str(pipeline), "--cwd", str(project), state=state_dir)
    assert done.returncode == 1, done.stderr
    assert f'      File "{pipeline}", line 6, in boom\n' in done.stdout
    run_id = as_json(cli("runs", "--json", state=state_dir))["runs"][0]["runId"]
    shown = cli("show", run_id, state=state_dir)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["boom", "failed"])
    assert lines[at].endswith(error)
    # the traceback follows, indented under its step (less the position markers, which
    # depend on the Python version)
    below = itertools.takewhile(lambda line: line.startswith("      "), lines[at + 1 :])
    trace = [line for line in below if set(line.strip()) - set("^~")]
    assert trace == [
        "      Traceback (most recent call last):",
        f'        File "{pipeline}", line 6, in boom',
        "          return parse('not a number')",
        f'        File "{pipeline}", line 3, in parse',
        "          return int(text)",
        f"      {error}",
    ]
    assert [line.split()[:2] for line in lines if line.split()[:1] in (["each"], ["count"])] == [
        ["each", "succeeded"],
        ["count", "succeeded"],
    ]
    steps = as_json(cli("show", run_id, "--json", state=state_dir))["steps"]
    boom = steps["boom"]["instances"]["boom"]
    assert (boom["status"], boom["error"], boom["attempt"]) == ("failed", error, 1)
    assert boom["traceback"].startswith("Traceback (most recent call last):\n")
    assert boom["traceback"].endswith(f"{error}\n")
    assert steps["boom"]["traceback"] == boom["traceback"]
    assert (steps["each"]["status"], steps["each"]["instances"]) == ("succeeded", {})
    assert steps["count"]["instances"]["count"]["value"] == 0
