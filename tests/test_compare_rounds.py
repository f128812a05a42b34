"""``compare --verify CMD --rounds N``: each agent gets up to N rounds in its session against the
same verify command, told its output when it fails; the verdict prefers green in fewer rounds.

The agents are real subprocesses: scripted agents, and the demo agent, whose prompt lines are
instructions, so a verify command that prints one gets it carried out in the next round.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
from run_helpers import (
    CLI,
    agent_command,
    as_json,
    config,
    one_line_error,
    record_events,
    run_cli,
    spec_for,
    workspace,
    write_agent,
)

from orchestrator.cli.output import SCHEMA_VERSION, output_schema
from orchestrator.errors import UsageError
from orchestrator.report import render_html, render_markdown
from orchestrator.runs import compare, get_run_json, resume_run
from orchestrator.testing import AgentScript, Say, Turn, WriteDisk

LIMIT = 60.0  # seconds any one comparison here may take

#: passes once f.txt holds a line "ok"; else prints the fix, an instruction to the demo agent
VERIFY = "grep -qx ok f.txt || { echo 'append \"ok\" to f.txt'; exit 1; }"
FIX = 'append "ok" to f.txt'
#: what the demo agent does first: not enough for the verify command
TASK = 'append "one" to f.txt'


def alice_turns() -> tuple[Turn, ...]:
    """Passes in round 1, with more changed lines than bob's two rounds make."""
    return (Turn(steps=(WriteDisk("f.txt", "ok\na\nb\nc\n"), Say(text="done"))),)


def carol_turns() -> tuple[Turn, ...]:
    """Never passes: every round writes what the verify command refuses."""
    return tuple(Turn(steps=(WriteDisk("f.txt", f"bad {i}\n"), Say(text="done"))) for i in range(3))


def by_name(result: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The agents of a comparison's object, by name."""
    return {a["name"]: a for a in result["agents"]}


def checks(agent: dict[str, Any]) -> list[bool]:
    """Whether each round's check passed."""
    return [r["check"]["passed"] for r in agent["rounds"]]


def valid(document: Mapping[str, Any]) -> None:
    """``document`` (a comparison's object) is valid under the shipped schema."""
    jsonschema.Draft202012Validator(output_schema()).validate(
        {"schemaVersion": SCHEMA_VERSION, **document}
    )


async def test_each_agent_gets_its_rounds_and_green_in_fewer_wins(
    tmp_path: Path, state_dir: Path
) -> None:
    """alice passes in round 1, bob (the demo agent) in round 2 after being told the verify
    output, carol never: each agent's rounds, its verify the last one, and alice wins though
    bob changed fewer lines."""
    ws = workspace(tmp_path, {"f.txt": "start\n"})
    record = tmp_path / "carol.jsonl"
    alice = spec_for(AgentScript(name="alice", turns=alice_turns()), tmp_path, "alice")
    carol = spec_for(
        AgentScript(name="carol", turns=carol_turns(), record_path=str(record)), tmp_path, "carol"
    )
    with trio.fail_after(LIMIT):
        outcome = await compare(
            [alice, "bob=demo", carol],
            TASK,
            cwd=ws,
            config=config(alice, carol),
            policy="edit",
            verify=VERIFY,
            rounds=3,
        )
    result = outcome.result
    valid(result)
    assert outcome.status == "succeeded"
    assert (result["succeeded"], result["winner"], result["maxRounds"]) == (
        ["alice", "bob"],
        "alice",
        3,
    )
    agents = by_name(result)
    assert [checks(agents[n]) for n in ("alice", "bob", "carol")] == [
        [True],
        [False, True],
        [False, False, False],
    ]
    # verify is the last round's check, not run again
    assert agents["bob"]["verify"] == {
        "command": VERIFY,
        "exitCode": 0,
        "output": "",
        "timedOut": False,
    }
    assert agents["carol"]["verify"] == {
        "command": VERIFY,
        "exitCode": 1,
        "output": FIX,
        "timedOut": False,
    }
    assert (agents["carol"]["status"], agents["carol"]["errorKind"]) == ("failed", "check")
    assert agents["carol"]["error"] == f"check failed (exit 1) after 3 rounds: {FIX}"
    # bob did what the first round's verify output told it, in the same session
    assert "+one\n+ok\n" in agents["bob"]["diff"]
    first, second = (r["diff"] for r in agents["bob"]["rounds"])
    assert "+one" in first and "ok" not in first
    assert "+ok" in second
    # carol was told the verify output in rounds 2 and 3, in one session
    prompts = [e for e in record_events(record) if e["event"] == "prompt"]
    assert [p["text"] for p in prompts[:1]] == [TASK]
    assert len(prompts) == 3 and len({p["sessionId"] for p in prompts}) == 1
    assert all(FIX in p["text"] and "exit status 1" in p["text"] for p in prompts[1:])
    # the recorded run gives the same object and verdict
    stored = await get_run_json(outcome.run_id, state_dir=state_dir)
    assert (stored["winner"], stored["maxRounds"]) == ("alice", 3)
    assert by_name(stored)["bob"]["rounds"] == agents["bob"]["rounds"]
    # the reports list each agent's rounds
    markdown = render_markdown(result)
    assert (
        f"- round 1: check failed (exit 1): {FIX}\n- round 2: check passed (exit 0)\n" in markdown
    )
    assert markdown.count("- round 3: check failed (exit 1)") == 1  # carol's
    assert render_html(result).count('class="rounds"') == 3


async def test_one_round_runs_the_verify_command_once_without_feedback(tmp_path: Path) -> None:
    """rounds=1 is the verify command run once after the turn: no rounds listed, no second
    prompt, the agent failed as with verify alone."""
    ws = workspace(tmp_path, {"f.txt": "start\n"})
    with trio.fail_after(LIMIT):
        outcome = await compare(["bob=demo"], TASK, cwd=ws, policy="edit", verify=VERIFY, rounds=1)
    assert outcome.status == "failed"
    bob = by_name(outcome.result)["bob"]
    assert (bob["rounds"], bob["error"], bob["errorKind"]) == (
        [],
        "verify failed: exit 1",
        "verify",
    )
    assert bob["verify"]["output"] == FIX
    assert "ok" not in bob["diff"]
    assert outcome.result["maxRounds"] == 1


async def test_the_verify_command_runs_once_a_round(tmp_path: Path) -> None:
    """With rounds, the verify command is each round's check and is not run again after the
    last: two rounds, two runs."""
    ws = workspace(tmp_path, {"f.txt": "start\n"})
    runs = tmp_path / "runs.log"
    verify = f"echo run >> {shlex.quote(str(runs))}; {VERIFY}"
    with trio.fail_after(LIMIT):
        outcome = await compare(["bob=demo"], TASK, cwd=ws, policy="edit", verify=verify, rounds=3)
    assert checks(by_name(outcome.result)["bob"]) == [False, True]
    assert runs.read_text() == "run\nrun\n"


async def test_rounds_are_checked(tmp_path: Path) -> None:
    """Rounds above 1 need a verify command; fewer than 1, or not an int, are refused."""
    ws = workspace(tmp_path)
    with pytest.raises(UsageError, match="rounds need a verify command"):
        await compare(["demo"], TASK, cwd=ws, rounds=2)
    with pytest.raises(UsageError, match="rounds must be 1 or more, not 0"):
        await compare(["demo"], TASK, cwd=ws, verify=VERIFY, rounds=0)
    with pytest.raises(TypeError, match="rounds must be an int"):
        await compare(["demo"], TASK, cwd=ws, verify=VERIFY, rounds=True)


async def test_resume_starts_a_new_loop_on_the_agents_branch(
    tmp_path: Path, state_dir: Path
) -> None:
    """An agent that failed its rounds goes on, on resume, from its kept branch: the first
    prompt is the task and the last verify output, and it reaches green."""
    ws = workspace(tmp_path, {"f.txt": "start\n"})
    allow = tmp_path / "allow"
    # passes only once allowed, so the first comparison fails after its two rounds
    verify = f"test -f {shlex.quote(str(allow))} && {VERIFY}"
    verify = f"{{ {verify}; }} || {{ echo '{FIX}'; exit 1; }}"
    with trio.fail_after(LIMIT):
        first = await compare(["bob=demo"], TASK, cwd=ws, policy="edit", verify=verify, rounds=2)
    assert first.status == "failed"
    assert checks(by_name(first.result)["bob"]) == [False, False]
    allow.touch()
    with trio.fail_after(LIMIT):
        second = await resume_run(first.run_id)
    assert second.status == "succeeded"
    bob = by_name(second.result)["bob"]
    assert checks(bob) == [True]
    assert second.result["winner"] == "bob"
    # the first loop's work (one, ok), then the new loop's (the task, then the fix)
    assert "+one\n+ok\n+one\n+ok\n" in bob["diff"]


# --------------------------------------------------------------------------- the console script

cli = pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")


@cli
async def test_cli_compare_rounds_json_exit_and_table(tmp_path: Path, state_dir: Path) -> None:
    """compare --verify --rounds 3 through the console script: exit 0, each agent's rounds in
    --json, and the table says who reached green in how many rounds."""
    ws = workspace(tmp_path, {"f.txt": "start\n"})
    alice = write_agent(tmp_path / "alice.json", *alice_turns())
    carol = write_agent(tmp_path / "carol.json", *carol_turns())
    done = await run_cli(
        "compare",
        "--cwd",
        str(ws),
        "--policy",
        "edit",
        "--no-progress",
        "--json",
        "--agent",
        f"alice={shlex.join(agent_command(alice))}",
        "--agent",
        "bob=demo",
        "--agent",
        f"carol={shlex.join(agent_command(carol))}",
        "--verify",
        VERIFY,
        "--rounds",
        "3",
        TASK,
        cwd=tmp_path,
        state=state_dir,
    )
    assert done.returncode == 0, done.stderr.decode()
    result = as_json(done)
    assert (result["winner"], result["succeeded"]) == ("alice", ["alice", "bob"])
    agents = by_name(result)
    assert [len(agents[n]["rounds"]) for n in ("alice", "bob", "carol")] == [1, 2, 3]
    shown = await run_cli("show", result["runId"], cwd=tmp_path, state=state_dir)
    text = shown.stdout.decode()
    assert shown.returncode == 0, shown.stderr.decode()
    rows = {
        name: next(r for r in text.splitlines() if r[2:].startswith(f"{name} "))
        for name in ("alice", "bob", "carol")
    }
    assert "green in 1/3 rounds" in rows["alice"] and rows["alice"].startswith("*")
    assert "green in 2/3 rounds" in rows["bob"]
    assert "red in 3/3 rounds" in rows["carol"]
    assert "winner: alice (verify passed in 1 round, 5 lines changed, " in text, text


@cli
@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--rounds", "2"), "--rounds needs --verify"),
        (("--verify", "true", "--rounds", "0"), "must be at least 1, got 0"),
        (("--verify", "true", "--rounds", "-1"), "must be at least 1, got -1"),
    ],
)
async def test_cli_rounds_usage_errors(
    tmp_path: Path, state_dir: Path, extra: tuple[str, ...], said: str
) -> None:
    """--rounds without --verify, or below 1, is a one-line usage error (exit 2)."""
    ws = workspace(tmp_path)
    done = await run_cli(
        "compare", "--cwd", str(ws), "--agent", "demo", *extra, TASK, cwd=tmp_path, state=state_dir
    )
    assert said in one_line_error(done)
