"""Real runs of every kind with the demo agent, and their ``--json`` objects.

Used by ``tests/test_outcomes.py`` (a round trip over live runs) and to write the recorded
fixtures in ``tests/outcomes/`` that its unit tests read::

    ORCHESTRATOR_STATE_DIR=$(mktemp -d) PYTHONPATH=. python tests/outcome_runs.py tests/outcomes

Each run gives its :class:`~orchestrator.runs.RunOutcome` ``result`` (the live object) and the
object ``get_run_json`` rebuilds from the run store; the state directory is the caller's
(``ORCHESTRATOR_STATE_DIR``).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import orjson
import trio

from orchestrator.agent.permissions import Escalation
from orchestrator.pipeline import Pipeline, step
from orchestrator.policy import Answer, Policy, PolicySet, Rule
from orchestrator.runs import compare, get_run_json, prompt, resume_run, run_pipeline

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "sample-project"
#: the JSON objects of one run: (name, the live result or None, the stored one)
Made = list[tuple[str, dict[str, Any] | None, dict[str, Any]]]

FLAKY = """\
from pathlib import Path

from orchestrator.pipeline import step


@step(agent="demo")
def edit(task: str) -> str:
    return 'create notes.txt with "first\\\\n"'


@step
def build(edit: object, marker: str) -> str:
    if not Path(marker).exists():
        raise RuntimeError("the marker is missing")
    return "built"


@step(agent="demo")
def after(build: str) -> str:
    return 'append "after" to notes.txt'


@step
def side(task: str) -> int:
    return 7
"""


def _project(base: Path, name: str) -> Path:
    """A fresh copy of the sample project."""
    target = base / name
    shutil.copytree(SAMPLE, target)
    return target


async def make_runs(base: Path) -> Made:
    """Every kind of run, once each, in directories under ``base``."""
    made: Made = []

    async def stored(run_id: str) -> dict[str, Any]:
        return dict(await get_run_json(run_id))

    one = await prompt(
        "demo",
        'replace "colour" with "color" in README.md',
        cwd=_project(base, "prompt"),
        policy="edit",
    )
    made.append(("prompt", one.to_json(), await stored(one.run_id)))

    fanned = await run_pipeline(
        ROOT / "examples" / "demo_pipeline.py", cwd=_project(base, "demo"), policy="trusted"
    )
    made.append(("pipeline", dict(fanned.result), await stored(fanned.run_id)))

    side = await compare(
        ["a=demo", "b=demo"],
        'replace "colour" with "color" in README.md',
        cwd=_project(base, "compare"),
        policy="edit",
        verify="grep -q color README.md",
        apply="a",
    )
    made.append(("compare", dict(side.result), await stored(side.run_id)))

    unverified = await compare(
        ["a=demo", "b=demo"],
        'append "more" to CHANGES.md',
        cwd=_project(base, "compare-failed"),
        verify="false",
    )
    made.append(("compare-failed", dict(unverified.result), await stored(unverified.run_id)))

    clashing = base / "conflicts"
    clashing.mkdir()
    (clashing / "README.md").write_text("hello\n")
    clash = await run_pipeline(
        ROOT / "tests" / "pipelines" / "fan_in_conflict.py", cwd=clashing, policy="edit"
    )
    made.append(("conflicts", dict(clash.result), await stored(clash.run_id)))

    flaky = base / "flaky.py"
    flaky.write_text(FLAKY)
    marker = base / "marker"
    project = _project(base, "resume")
    failed = await run_pipeline(
        flaky, {"task": "t", "marker": str(marker)}, cwd=project, policy="edit"
    )
    made.append(("failed", dict(failed.result), await stored(failed.run_id)))
    marker.write_text("")
    resumed = await resume_run(failed.run_id)
    made.append(("resumed", dict(resumed.result), await stored(resumed.run_id)))

    made.append(("interrupted", None, await _interrupted(_project(base, "interrupted"))))
    return made


async def _interrupted(project: Path) -> dict[str, Any]:
    """A run cancelled while its second step's agent waits for a permission answer."""

    @step(agent="demo")
    def write(task: str) -> str:
        return 'create draft.txt with "draft\\n"'

    @step(agent="demo")
    def check(write: object) -> str:
        return 'create checked.txt with "checked\\n"'

    policy = PolicySet(
        run=Policy(
            [
                Rule("allow", name="drafts", kinds="edit", steps="write"),
                Rule("ask", name="ask", kinds="edit"),
            ]
        )
    )
    ids: list[str] = []
    with trio.CancelScope() as scope:

        async def escalate(escalation: Escalation) -> Answer | None:
            scope.cancel()  # as Ctrl-C would, while the question is asked
            await trio.sleep_forever()

        await run_pipeline(
            Pipeline.from_steps([write, check], name="interrupted"),
            {"task": "t"},
            cwd=project,
            policy=policy,
            escalate=escalate,
            on_event=lambda event: ids.append(event.run_id),
        )
    assert scope.cancelled_caught and ids
    return dict(await get_run_json(ids[0]))


def write_fixtures(out: Path, base: Path) -> None:
    """The stored object of each run as ``out/NAME.json``."""

    async def main() -> Made:
        return await make_runs(base)

    out.mkdir(parents=True, exist_ok=True)
    for name, _, shown in trio.run(main):
        path = out / f"{name}.json"
        path.write_bytes(orjson.dumps(shown, option=orjson.OPT_INDENT_2) + b"\n")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        write_fixtures(Path(sys.argv[1]), Path(scratch))
