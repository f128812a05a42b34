"""``orchestrator replay`` through the console script: a recorded run of the demo pipeline
played again offline, its agents served by replay agents (real subprocesses).

Each test records a run of ``examples/demo_pipeline.py`` on a copy of
``examples/sample-project`` (policy ``edit``; real demo agent subprocesses), then replays it.
The replays run with a config that points the demo agent at a program that does not exist:
a replay that started it would fail.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from conftest import pid_gone
from run_helpers import CLI, CLI_LIMIT, as_json, landlock_missing, one_line_error, run_cli, snapshot
from test_cli_interrupt import descendants, last_line

from orchestrator.store import RunRecord, open_run_store

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "examples" / "demo_pipeline.py"
SAMPLE = ROOT / "examples" / "sample-project"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
#: the step instances the demo pipeline's agents serve
AGENT_KEYS = {
    "rename[shop/__init__.py]",
    "rename[shop/cart.py]",
    "rename[shop/pricing.py]",
    "docs[alice]",
    "docs[bob]",
}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    """A copy of the sample project."""
    root = tmp_path / "sample-project"
    shutil.copytree(SAMPLE, root)
    return root


@pytest.fixture
def no_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """From here on the demo agent cannot start: the user config points it at nothing."""
    config = tmp_path / "no-demo.toml"
    config.write_text(f'[agents.demo]\ncommand = ["{tmp_path}/no-such-demo-agent"]\n')
    return config


async def record(sample: Path, tmp_path: Path, state: Path) -> dict[str, Any]:
    """Run the demo pipeline on ``sample`` with policy edit; its result object."""
    done = await run_cli(
        "run", str(PIPELINE), "--cwd", str(sample), "--policy", "edit", "--json",
        cwd=tmp_path, state=state,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result: dict[str, Any] = as_json(done)
    assert result["status"] == "succeeded"
    return result


async def replay(*args: str, tmp_path: Path, state: Path, config: Path) -> Any:
    """Run ``orchestrator replay ARGS`` with ``config`` as the user config."""
    with trio.fail_after(CLI_LIMIT):
        return await trio.run_process(
            [str(CLI), "replay", *args],
            cwd=tmp_path,
            env={
                **os.environ,
                "ORCHESTRATOR_STATE_DIR": str(state),
                "ORCHESTRATOR_CONFIG": str(config),
            },
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


async def audit(state: Path, run_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """The run's audit records (permission decisions) per step instance, as the run store
    keeps them: (tool call, kind, verdict, option, rule)."""
    async with open_run_store(state) as store:
        records = await store.permissions(run_id)
    out: dict[str, list[tuple[Any, ...]]] = {}
    for entry in records:
        out.setdefault(entry["stepKey"], []).append(
            (entry["toolCallId"], entry["kind"], entry["verdict"], entry["optionId"], entry["rule"])
        )
    return {k: sorted(v) for k, v in out.items()}


def changed(result: dict[str, Any]) -> dict[str, Any]:
    """The run's final changes by path (kind and content digest)."""
    return {c["path"]: (c.get("kind"), c.get("sha256")) for c in result["changes"]}


# --------------------------------------------------------------------------- a replay as recorded


async def test_a_replay_makes_the_same_changes_and_decisions_without_starting_an_agent(
    sample: Path, tmp_path: Path, state_dir: Path, no_demo: Path
) -> None:
    """Replayed: exit 0, no divergence, the same diff, changes and permission decisions."""
    recorded = await record(sample, tmp_path, state_dir)
    before = snapshot(sample)
    done = await replay(
        recorded["runId"], "--json", tmp_path=tmp_path, state=state_dir, config=no_demo
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert result["runId"] != recorded["runId"]
    assert result["status"] == "succeeded"
    assert result["replay"] == {
        "of": recorded["runId"],
        "strict": False,
        "timing": "fast",
        "pipeline": "recorded",
        "divergences": [],
        "notReplayable": [],
    }
    assert result["diff"] == recorded["diff"] != ""
    assert changed(result) == changed(recorded)
    decided = await audit(state_dir, result["runId"])
    assert decided == await audit(state_dir, recorded["runId"])
    assert set(decided) == AGENT_KEYS
    assert snapshot(sample) == before  # no --apply: nothing written
    # recorded like any other run, marked as a replay, the record it played beside it
    async with open_run_store(state_dir) as store:
        run = await store.get_run(result["runId"])
    assert run.options["replay"] == {
        "of": recorded["runId"], "strict": False, "timing": "fast", "pipeline": "recorded",
    }  # fmt: skip
    kept = json.loads((state_dir / "runs" / run.run_id / "replay-record.json").read_text())
    assert kept["run"]["runId"] == recorded["runId"]
    # the human form ends with the replay's verdict
    done = await replay(
        recorded["runId"], "--no-progress", tmp_path=tmp_path, state=state_dir, config=no_demo
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert (
        last_line(done.stdout.decode())
        == f"replay of run {recorded['runId']}: as recorded, no divergence"
    )


async def test_with_deny_all_the_rejections_show_where_the_run_would_have_stopped(
    sample: Path, tmp_path: Path, state_dir: Path, no_demo: Path
) -> None:
    """--policy deny-all: every request rejected in the result, a permission divergence per
    request, nothing changed; with --strict each agent's turn stops at its rejection."""
    recorded = await record(sample, tmp_path, state_dir)
    done = await replay(
        recorded["runId"], "--policy", "deny-all", "--json",
        tmp_path=tmp_path, state=state_dir, config=no_demo,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    result = as_json(done)
    decided = await audit(state_dir, result["runId"])
    was = await audit(state_dir, recorded["runId"])
    assert set(decided) == AGENT_KEYS
    for key, entries in decided.items():
        # the same requests, each rejected by the deny-all policy now
        assert [e[:2] for e in entries] == [e[:2] for e in was[key]], key
        assert {e[2] for e in entries} == {"reject"}, key
        assert {e[2] for e in was[key]} == {"allow"}, key
    permission = [d for d in result["replay"]["divergences"] if d["kind"] == "permission"]
    assert {d["step"] for d in permission} == AGENT_KEYS
    assert len(permission) == sum(len(v) for v in was.values())
    assert all((d["recorded"], d["now"]) == ("allow_once", "reject_once") for d in permission)
    assert result["replay"]["notReplayable"] == []
    # the writes that needed the rejected permissions were not made: nothing changed
    assert result["changes"] == []
    done = await replay(
        recorded["runId"], "--policy", "deny-all", "--no-progress",
        tmp_path=tmp_path, state=state_dir, config=no_demo,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED
    out = done.stdout.decode()
    count = len(result["replay"]["divergences"])
    assert f"\nreplay of run {recorded['runId']}: {count} divergences\n" in out
    assert "\n  docs[alice]\n    permission (attempt 1, turn 0): the permission was answered" in out

    # strict: each agent's turn stops at its first rejection, as the run would have
    done = await replay(
        recorded["runId"], "--policy", "deny-all", "--strict", "--json",
        tmp_path=tmp_path, state=state_dir, config=no_demo,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    result = as_json(done)
    assert result["status"] == "failed"
    assert result["changes"] == []
    rename = result["steps"]["rename"]["instances"]
    assert {k: i["status"] for k, i in rename.items()} == dict.fromkeys(
        ["shop/__init__.py", "shop/cart.py", "shop/pricing.py"], "failed"
    )
    for instance in rename.values():  # stopped at its first request, rejected now
        assert instance["error"].startswith(
            "replay diverged: the permission was answered reject_once, the record has allow_once"
        ), instance["error"]
    assert sorted((d["step"], d["kind"]) for d in result["replay"]["divergences"]) == [
        (f"rename[{k}]", "permission") for k in sorted(rename)
    ]


# --------------------------------------------------------------------------- an edited pipeline


def edited_pipeline(tmp_path: Path) -> Path:
    """The demo pipeline with its rename step's prompt changed."""
    text = PIPELINE.read_text()
    old = 'return f"rename calc_total to compute_total in {item}\\n"'
    assert old in text
    path = tmp_path / "edited" / "demo_pipeline.py"
    path.parent.mkdir()
    path.write_text(text.replace(old, 'return f"rename calc_total to total_of in {item}\\n"'))
    return path


async def test_an_edited_prompt_step_is_reported_per_instance_and_strict_stops_it(
    sample: Path, tmp_path: Path, state_dir: Path, no_demo: Path
) -> None:
    """A pipeline file whose rename prompt changed: a prompt divergence per rename instance;
    lenient goes on to the end, --strict fails each rename instance at that point."""
    recorded = await record(sample, tmp_path, state_dir)
    edited = edited_pipeline(tmp_path)
    done = await replay(
        recorded["runId"], str(edited), "--json", tmp_path=tmp_path, state=state_dir, config=no_demo
    )
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    result = as_json(done)
    assert result["status"] == "succeeded"  # lenient: the run went on
    assert result["replay"]["pipeline"] == "given"
    prompts = [d for d in result["replay"]["divergences"] if d["kind"] == "prompt"]
    assert sorted(d["step"] for d in prompts) == sorted(
        k for k in AGENT_KEYS if k.startswith("rename")
    )
    assert all("total_of" in d["now"] and "compute_total" in d["recorded"] for d in prompts)
    # the agents' recorded work was played all the same
    assert result["diff"] == recorded["diff"]

    done = await replay(
        recorded["runId"], str(edited), "--strict", "--json",
        tmp_path=tmp_path, state=state_dir, config=no_demo,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    result = as_json(done)
    assert result["status"] == "failed"
    rename = result["steps"]["rename"]
    assert {k: i["status"] for k, i in rename["instances"].items()} == dict.fromkeys(
        ["shop/__init__.py", "shop/cart.py", "shop/pricing.py"], "failed"
    )
    for instance in rename["instances"].values():
        assert "replay diverged" in instance["error"]
        assert not instance.get("permissions")  # stopped before its first request
    # the steps after it never ran
    assert result["steps"]["docs"]["status"] != "succeeded"
    assert [d["kind"] for d in result["replay"]["divergences"]] == ["prompt"] * 3
    done = await replay(
        recorded["runId"], str(edited), "--strict", "--no-progress",
        tmp_path=tmp_path, state=state_dir, config=no_demo,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED
    out = done.stdout.decode()
    # a failed replay is replayed again, not resumed
    assert f"nothing was written to the workspace; orchestrator replay {recorded['runId']} " in out
    assert "orchestrator resume" not in out


@pytest.mark.skipif(landlock_missing() is not None, reason=str(landlock_missing()))
async def test_a_confined_run_is_replayed_confined(
    sample: Path, tmp_path: Path, state_dir: Path, no_demo: Path
) -> None:
    """A run recorded with --sandbox: its replay agents are confined as its agents were, and
    still read their record and report what differs (deny-all: the rejections)."""
    done = await run_cli(
        "run", str(PIPELINE), "--cwd", str(sample), "--policy", "edit", "--sandbox", "--json",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    recorded = as_json(done)
    done = await replay(
        recorded["runId"], "--json", tmp_path=tmp_path, state=state_dir, config=no_demo
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert set(result["sandbox"]["confined"]) == {"rename", "docs"}
    assert result["diff"] == recorded["diff"]
    done = await replay(
        recorded["runId"], "--policy", "deny-all", "--json",
        tmp_path=tmp_path, state=state_dir, config=no_demo,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    result = as_json(done)
    assert {d["step"] for d in result["replay"]["divergences"]} == AGENT_KEYS
    assert result["changes"] == []


# --------------------------------------------------------------------------- --save, refusals


async def test_save_writes_the_record_and_a_replay_of_the_file_matches(
    sample: Path, tmp_path: Path, state_dir: Path, no_demo: Path
) -> None:
    """--save FILE writes the record and runs nothing; replaying FILE gives the same diff."""
    recorded = await record(sample, tmp_path, state_dir)
    saved = tmp_path / "records" / "demo.json"
    saved.parent.mkdir()
    done = await replay(
        recorded["runId"][:6], "--save", str(saved), "--json",
        tmp_path=tmp_path, state=state_dir, config=no_demo,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    said = as_json(done)
    assert (said["runId"], said["saved"]) == (recorded["runId"], str(saved))
    async with open_run_store(state_dir) as store:
        assert len(await store.list_runs(limit=None)) == 1  # nothing ran
    data = orjson.loads(saved.read_bytes())
    assert data["format"] == "acp-orchestrator/replay-record"
    assert set(data["steps"]) == AGENT_KEYS
    assert said["steps"] == len(AGENT_KEYS)

    done = await replay(str(saved), "--json", tmp_path=tmp_path, state=state_dir, config=no_demo)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert result["replay"]["of"] == recorded["runId"]
    assert result["replay"]["divergences"] == []
    assert result["diff"] == recorded["diff"]


async def test_a_batch_run_is_refused(tmp_path: Path, state_dir: Path, no_demo: Path) -> None:
    """A batch run is refused in one line, exit 2, replayed or saved."""
    async with open_run_store(state_dir) as store:
        await store.create_run(RunRecord("b0a7c4", "batch", "succeeded", 1.0, str(tmp_path)))
    for extra in ([], ["--save", str(tmp_path / "x.json")]):
        done = await replay("b0a7c4", *extra, tmp_path=tmp_path, state=state_dir, config=no_demo)
        line = one_line_error(done)
        assert "b0a7c4" in line and "batch" in line, line
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["nosuchrun"], "no run 'nosuchrun'"),
        (["RUN", "--save", "x.json", "--policy", "edit"], "--policy is for a replay"),
        (["RUN", "--save", "x.json", "--strict"], "--strict is for a replay"),
        (["RUN", "--timing", "slow"], "invalid choice: 'slow'"),
        (["bad.json"], "is not JSON"),
        (["missing.json"], "cannot read the replay record missing.json"),
        (["RUN", "--cwd", "no-such-dir"], "no-such-dir, is not a directory"),
    ],
)
async def test_bad_usage_is_one_line_and_exit_2(
    args: list[str], says: str, tmp_path: Path, state_dir: Path, no_demo: Path
) -> None:
    """Bad usage: one line on stderr, nothing on stdout, exit 2, no run recorded."""
    async with open_run_store(state_dir) as store:
        await store.create_run(
            RunRecord("5a1e0f", "pipeline", "succeeded", 1.0, str(tmp_path), pipeline="p.py")
        )
    (tmp_path / "bad.json").write_text("{not json")
    args = [a.replace("RUN", "5a1e0f") for a in args]
    done = await replay(*args, tmp_path=tmp_path, state=state_dir, config=no_demo)
    line = one_line_error(done)
    assert says in line, line
    async with open_run_store(state_dir) as store:
        assert [r.run_id for r in await store.list_runs(limit=None)] == ["5a1e0f"]


@pytest.mark.parametrize("name", ["x.json", "x"])
async def test_a_missing_file_is_said_alike_by_both_entry_points(
    name: str, tmp_path: Path, state_dir: Path, no_demo: Path
) -> None:
    """A source naming a file that is not there (a path: never a run id) gets the same one
    line from orchestrator replay and from python -m orchestrator.replay."""
    missing = str(tmp_path / "nonexistent" / name)
    cli = one_line_error(await replay(missing, tmp_path=tmp_path, state=state_dir, config=no_demo))
    with trio.fail_after(CLI_LIMIT):
        agent = await trio.run_process(
            [sys.executable, "-m", "orchestrator.replay", missing, "--state-dir", str(state_dir)],
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    said = one_line_error(agent)
    # each says the error after its own program name
    assert cli == f"orchestrator: {said}", (cli, said)
    assert said == f"error: cannot read the replay record {missing}: No such file or directory"


async def test_a_replay_run_is_not_resumed(
    sample: Path, tmp_path: Path, state_dir: Path, no_demo: Path
) -> None:
    """orchestrator resume of a replay run is refused: it would start the real agents."""
    recorded = await record(sample, tmp_path, state_dir)
    done = await replay(
        recorded["runId"], "--json", tmp_path=tmp_path, state=state_dir, config=no_demo
    )
    replayed = as_json(done)["runId"]
    line = one_line_error(await run_cli("resume", replayed, cwd=tmp_path, state=state_dir))
    assert f"run {replayed} is a replay of run {recorded['runId']}" in line


# --------------------------------------------------------------------------- Ctrl-C


def slowed(record: Path) -> None:
    """Make every rename turn's frames come an hour after its prompt (timing recorded)."""
    data = orjson.loads(record.read_bytes())
    for key, sessions in data["steps"].items():
        if key.startswith("rename"):
            for session in sessions:
                for turn in session["turns"]:
                    for frame in turn["frames"]:
                        frame["t"] = 3600.0
    record.write_bytes(orjson.dumps(data))


async def test_ctrl_c_ends_the_replay_and_leaves_no_process(
    sample: Path, tmp_path: Path, state_dir: Path, no_demo: Path
) -> None:
    """SIGINT while the replay agents wait: exit 130, every replay agent gone, the run
    interrupted, and the last line says how to replay it again."""
    recorded = await record(sample, tmp_path, state_dir)
    saved = tmp_path / "slow.json"
    done = await replay(
        recorded["runId"], "--save", str(saved), tmp_path=tmp_path, state=state_dir, config=no_demo
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    slowed(saved)
    wire = tmp_path / "wire.ndjson"
    env = {
        **os.environ,
        "ORCHESTRATOR_STATE_DIR": str(state_dir),
        "ORCHESTRATOR_CONFIG": str(no_demo),
    }
    argv = [str(CLI), "replay", str(saved), "--timing", "recorded", "--transcript", str(wire)]
    with trio.fail_after(CLI_LIMIT), (tmp_path / "err.txt").open("wb") as err:
        cli = await trio.lowlevel.open_process(
            argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err
        )
        try:
            # every rename instance's prompt was sent: its replay agent waits for the hour
            while not wire.exists() or wire.read_bytes().count(b'"session/prompt"') < 3:
                assert cli.poll() is None, (tmp_path / "err.txt").read_text()
                await trio.sleep(0.05)
            pids = descendants(cli.pid)
            cli.send_signal(signal.SIGINT)
            code = await cli.wait()
        finally:
            if cli.returncode is None:
                cli.kill()
                with trio.CancelScope(shield=True):
                    await cli.wait()
    stderr = (tmp_path / "err.txt").read_text()
    assert code == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr
    assert pids, "no replay agent process was running"
    assert all(pid_gone(pid) for pid in pids), [p for p in pids if not pid_gone(p)]
    async with open_run_store(state_dir) as store:
        runs = await store.list_runs(limit=None)
    [interrupted] = [r for r in runs if r.run_id != recorded["runId"]]
    assert interrupted.status == "interrupted"
    assert last_line(stderr).endswith(
        f"run {interrupted.run_id} interrupted; orchestrator replay {saved} replays the run again"
    )


async def test_a_replay_that_failed_is_never_said_to_be_as_recorded(
    sample: Path, tmp_path: Path, state_dir: Path, no_demo: Path
) -> None:
    """A pipeline whose Python check now fails: no divergence, but the summary says the replay
    failed (not "as recorded"), exit 1."""
    recorded = await record(sample, tmp_path, state_dir)
    text = PIPELINE.read_text()
    old = '    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}\n'
    assert old in text
    broken = tmp_path / "broken" / "demo_pipeline.py"
    broken.parent.mkdir()
    broken.write_text(text.replace(old, '    raise RuntimeError("changed since")\n' + old))
    done = await replay(
        recorded["runId"], str(broken), "--no-progress",
        tmp_path=tmp_path, state=state_dir, config=no_demo,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    out = done.stdout.decode()
    assert (
        f"replay of run {recorded['runId']}: no divergence reported, but the replay failed" in out
    )
    assert "as recorded" not in out


async def test_show_says_a_run_is_a_replay(
    sample: Path, tmp_path: Path, state_dir: Path, no_demo: Path
) -> None:
    """``show`` of a replay run names the run it replays and how far it matched."""
    recorded = await record(sample, tmp_path, state_dir)
    done = await replay(
        recorded["runId"], "--json", tmp_path=tmp_path, state=state_dir, config=no_demo
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    new = as_json(done)["runId"]
    shown = await run_cli("show", new, cwd=tmp_path, state=state_dir)
    assert shown.returncode == EXIT_OK
    assert f"a replay of run {recorded['runId']}: no divergence" in shown.stdout.decode()


async def test_apply_of_a_replay_that_diverged_is_held_and_said(
    sample: Path, tmp_path: Path, state_dir: Path, no_demo: Path
) -> None:
    """--apply after the workspace changed in a file the agents read: nothing is written, the
    user's edit is kept, and the output says why and how to apply later."""
    recorded = await record(sample, tmp_path, state_dir)
    cart = sample / "shop" / "cart.py"
    cart.write_text(cart.read_text() + "# my own line\n")
    before = snapshot(sample)
    done = await replay(
        recorded["runId"], "--apply", "--no-progress",
        tmp_path=tmp_path, state=state_dir, config=no_demo,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    out = done.stdout.decode()
    assert "not applied: the replay differs from the record" in out
    assert "orchestrator apply " in out
    assert snapshot(sample) == before
