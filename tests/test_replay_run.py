"""replay_run and the testing helpers: a run recorded with real demo agent subprocesses, played
again with its agents served by replay agents (in this process, or as subprocesses)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator.errors import UsageError
from orchestrator.replay import ReplayRecord, load_record
from orchestrator.runs import prompt, replay_run, run_pipeline
from orchestrator.runs.replay_record import replay_record
from orchestrator.store import open_run_store
from orchestrator.testing import assert_replays, replay_connector

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "examples" / "demo_pipeline.py"
SAMPLE = ROOT / "examples" / "sample-project"
RENAMES = ["rename[shop/__init__.py]", "rename[shop/cart.py]", "rename[shop/pricing.py]"]

pytestmark = pytest.mark.slow


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    """A copy of the sample project."""
    root = tmp_path / "sample-project"
    shutil.copytree(SAMPLE, root)
    return root


@pytest.fixture
def pipeline(tmp_path: Path) -> Path:
    """A copy of the demo pipeline (a test edits it)."""
    path = tmp_path / "pipelines" / "demo_pipeline.py"
    path.parent.mkdir()
    shutil.copyfile(PIPELINE, path)
    return path


def edit_prompt(path: Path) -> None:
    """Change the rename step's prompt in the pipeline file ``path``."""
    text = path.read_text()
    old = 'return f"rename calc_total to compute_total in {item}\\n"'
    assert old in text
    path.write_text(text.replace(old, 'return f"rename calc_total to total_of in {item}\\n"'))


async def recorded_run(pipeline: Path, sample: Path) -> Any:
    """The demo pipeline run on ``sample`` with policy edit, by real demo agent processes."""
    run = await run_pipeline(pipeline, cwd=sample, policy="edit")
    assert run.status == "succeeded"
    return run


async def test_a_replay_in_process_matches_and_reads_the_recorded_pipeline_text(
    pipeline: Path, sample: Path, state_dir: Path
) -> None:
    """The file edited since the run: the replay runs the text the run recorded, no divergence."""
    recorded = await recorded_run(pipeline, sample)
    edit_prompt(pipeline)  # after the run: the record keeps what it ran
    replayed = await replay_run(recorded.run_id, in_process=True)
    assert replayed.status == "succeeded"
    assert replayed.result["replay"]["pipeline"] == "recorded"
    assert replayed.result["replay"]["divergences"] == []
    assert replayed.diff == recorded.diff != ""
    # the new run names the recorded file, as the run it replays did
    async with open_run_store(state_dir) as store:
        run = await store.get_run(replayed.run_id)
    assert run.pipeline == str(pipeline)
    assert (state_dir / "runs" / replayed.run_id / "replay-record.json").is_file()


async def test_apply_writes_the_replayed_changes_to_the_workspace(
    pipeline: Path, sample: Path, tmp_path: Path
) -> None:
    """apply=True on another copy of the project: its files end as the recorded run's would."""
    recorded = await recorded_run(pipeline, sample)
    other = tmp_path / "other"
    shutil.copytree(SAMPLE, other)
    replayed = await replay_run(recorded.run_id, cwd=other, apply=True)
    assert replayed.result["replay"]["divergences"] == []
    assert "compute_total" in (other / "shop" / "cart.py").read_text()
    assert (other / "docs" / "pricing.md").is_file()
    assert "calc_total" in (sample / "shop" / "cart.py").read_text()  # the recorded one: not


async def test_a_replay_of_a_prompt_reads_like_a_prompt(sample: Path) -> None:
    """A prompt run replayed: a prompt's result again, the same diff, no divergence."""
    ran = await prompt(
        "demo", 'replace "colour" with "color" in README.md', cwd=sample, policy="edit"
    )
    assert ran.exit_code == 0
    replayed = await replay_run(ran.run_id)
    result = replayed.result
    assert (result["kind"], result["stopReason"]) == ("prompt", "end_turn")
    assert result["replay"]["divergences"] == []
    assert replayed.diff == ran.to_json()["diff"] != ""


def test_assert_replays_passes_and_fails_with_every_divergence(
    pipeline: Path, sample: Path, tmp_path: Path
) -> None:
    """assert_replays from a saved record file: passes as recorded; with the prompt edited,
    fails naming each rename instance."""

    async def record() -> ReplayRecord:
        run = await recorded_run(pipeline, sample)
        return await replay_record(run.run_id)

    saved = tmp_path / "records" / "demo.json"
    saved.parent.mkdir()
    trio.run(record).dump(saved)
    project = tmp_path / "fixture"
    shutil.copytree(SAMPLE, project)  # the workspace as the run found it

    run = assert_replays(saved, pipeline, cwd=project)
    assert "compute_total" in run.diff
    edit_prompt(pipeline)
    with pytest.raises(AssertionError) as failed:
        assert_replays(saved, pipeline, cwd=project)
    text = str(failed.value)
    for key in RENAMES:
        assert f"{key} (attempt 1, turn 0) prompt: " in text, text


async def test_replay_connector_serves_run_pipeline_and_collects_divergences(
    pipeline: Path, sample: Path
) -> None:
    """replay_connector as run_pipeline's connector, lenient: the edited prompt diverges once
    per rename instance; strict fails those instances."""
    recorded = await recorded_run(pipeline, sample)
    record = await replay_record(recorded.run_id)
    edit_prompt(pipeline)
    agents = replay_connector(record, strict=False)
    run = await run_pipeline(pipeline, cwd=sample, policy="edit", connector=agents)
    assert run.status == "succeeded"
    assert agents.started >= 3
    assert sorted(d["step"] for d in agents.divergences if d["kind"] == "prompt") == RENAMES

    strict = replay_connector(record)
    run = await run_pipeline(pipeline, cwd=sample, policy="edit", connector=strict)
    assert run.status == "failed"
    assert {k: s.status for k, s in run.steps["rename"].instances.items()} == dict.fromkeys(
        ["shop/__init__.py", "shop/cart.py", "shop/pricing.py"], "failed"
    )


async def test_a_record_with_no_run_and_an_unknown_agent_are_refused(
    pipeline: Path, sample: Path, tmp_path: Path
) -> None:
    """A record from a transcript holds no run: replay_run refuses it in one line; an agent
    the record lacks fails its step, named."""
    recorded = await recorded_run(pipeline, sample)
    record = await replay_record(recorded.run_id)
    bare = ReplayRecord({}, record.agents, record.steps)
    with pytest.raises(UsageError, match="holds no run"):
        await replay_run(bare)
    saved = tmp_path / "bare.json"
    bare.dump(saved)
    assert load_record(saved) == bare
    with pytest.raises(UsageError, match="holds no run"):
        await replay_run(saved)

    only_demo = ReplayRecord(record.run, {"demo": record.agents["demo"]}, record.steps)
    run = await replay_run(only_demo, in_process=True)
    assert run.status == "failed"
    docs = run.steps["docs"].instances
    assert "agent alice is not in the replay record" in str(docs["alice"].error)


async def test_a_pipeline_in_latin_1_replays_from_its_recorded_text(
    tmp_path: Path, sample: Path, state_dir: Path
) -> None:
    """A pipeline file with a latin-1 coding declaration, deleted after its run: its recorded
    text is loaded as the file was (the same digest), and the replay does what the run did."""
    path = tmp_path / "latin.py"
    path.write_bytes(
        "# -*- coding: latin-1 -*-\n"
        "from orchestrator import step\n\n\n"
        "@step(agent='demo')\n"
        "def fix() -> str:\n"
        '    return \'replace "colour" with "colôr" in README.md\\n\'\n'.encode("latin-1")
    )
    recorded = await run_pipeline(path, cwd=sample, policy="edit")
    assert recorded.status == "succeeded" and "colôr" in recorded.diff
    path.unlink()
    replayed = await replay_run(recorded.run_id, in_process=True)
    assert replayed.result["replay"]["divergences"] == []
    assert replayed.diff == recorded.diff
    async with open_run_store(state_dir) as store:
        was = await store.get_run(recorded.run_id)
        now = await store.get_run(replayed.run_id)
    assert now.pipeline_digest == was.pipeline_digest


async def test_an_instance_or_agent_the_record_lacks_is_never_passed_off_as_replayed(
    pipeline: Path, sample: Path, tmp_path: Path
) -> None:
    """A fan-out item added since the run (and an agent the record lacks) is reported
    not replayable and fails, never played from another instance's session."""
    recorded = await recorded_run(pipeline, sample)
    wider = tmp_path / "wider"
    shutil.copytree(SAMPLE, wider)
    (wider / "shop" / "extra.py").write_text("def calc_total2():\n    pass\n")
    replayed = await replay_run(recorded.run_id, cwd=wider, in_process=True)
    assert replayed.status == "failed"
    lacking = replayed.result["replay"]["notReplayable"]
    assert [d["step"] for d in lacking] == ["rename[shop/extra.py]"]
    assert "no session of agent 'demo'" in lacking[0]["detail"]
    instances = replayed.steps["rename"].instances
    assert instances["shop/extra.py"].status == "failed"
    assert all(instances[k].status == "succeeded" for k in ("shop/cart.py", "shop/pricing.py"))
    assert replayed.result["replay"]["divergences"] == []  # pricing's session played once

    record = await replay_record(recorded.run_id)
    only_demo = ReplayRecord(record.run, {"demo": record.agents["demo"]}, record.steps)
    run = await replay_run(only_demo, in_process=True)
    details = [d["detail"] for d in run.result["replay"]["notReplayable"]]
    assert any("agent alice is not in the replay record" in d for d in details), details


async def test_a_replay_that_diverged_is_not_applied(sample: Path, state_dir: Path) -> None:
    """--apply after the workspace changed in a file the agent rewrote: the read diverges, the
    changes are not applied (the user's line is kept), a warning says how to apply them."""
    task = 'replace "colour" with "color" in **/*.md'
    (sample / "NOTES.md").write_text("The colour.\n")
    recorded = await prompt("demo", task, cwd=sample, policy="edit")
    assert "NOTES.md" in recorded.diff
    with (sample / "NOTES.md").open("a") as notes:
        notes.write("A line of my own.\n")
    replayed = await replay_run(recorded.run_id, apply=True, in_process=True)
    kinds = {d["kind"] for d in replayed.result["replay"]["divergences"]}
    assert "fs-read" in kinds
    assert (sample / "NOTES.md").read_text() == "The colour.\nA line of my own.\n"
    assert replayed.result["applied"] is False
    assert any("not applied: the replay differs" in w for w in replayed.result["warnings"])


async def test_a_pipeline_for_a_prompt_run_is_refused(sample: Path, tmp_path: Path) -> None:
    """A prompt run has no pipeline file: giving one is a usage error, nothing run."""
    recorded = await prompt("demo", "hello", cwd=sample)
    with pytest.raises(UsageError, match="is a prompt run: it has no pipeline to replace"):
        await replay_run(recorded.run_id, tmp_path / "nothing.py")
    with pytest.raises(UsageError, match=r"the workspace to replay on, .* is not a directory"):
        await replay_run(recorded.run_id, cwd=tmp_path / "nope")


async def test_a_file_the_agent_made_on_disk_is_not_made_over_one_found_there_now(
    sample: Path,
) -> None:
    """The demo agent created a file behind the client's back; a file of the user's at that
    path now: the replay does not overwrite it (a disk divergence), and --apply applies
    nothing."""
    recorded = await prompt(
        "demo", 'create notes.txt with "agent notes"', cwd=sample, policy="edit"
    )
    assert "notes.txt" in recorded.diff
    record = await replay_record(recorded.run_id)
    [[session]] = record.steps.values()
    assert [(c.path, c.base) for c in session.changes] == [("notes.txt", None)]
    (sample / "notes.txt").write_text("USER NOTES\n")
    replayed = await replay_run(recorded.run_id, apply=True, in_process=True)
    [found] = replayed.result["replay"]["divergences"]
    assert found["kind"] == "disk"
    assert "notes.txt holds other content than the recording found there" in found["detail"]
    assert (sample / "notes.txt").read_text() == "USER NOTES\n"
    assert replayed.result["applied"] is False
