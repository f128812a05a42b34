"""The ``--json`` objects carry ``schemaVersion`` and match the JSON Schema shipped in the package.

Each command runs as a subprocess (the console script) against the demo agent or a scripted one;
every object it prints is validated against ``orchestrator/schemas/output.schema.json``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from run_helpers import CLI, agent_command, as_json, run_cli, write_script

from orchestrator.cli.output import SCHEMA_VERSION, output_schema
from orchestrator.testing import Say, Turn, WriteFile

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

DEMO_EDIT = 'replace "colour" with "color" in README.md'

PIPELINE = """\
from orchestrator import step


@step(agent="demo")
def edit(task: str) -> str:
    return task


@step()
def count(edit: object) -> int:
    return 1
"""


def check(document: Any) -> None:
    """``document`` is a versioned object valid under the shipped schema."""
    assert document["schemaVersion"] == SCHEMA_VERSION
    jsonschema.Draft202012Validator(output_schema()).validate(document)


def test_the_shipped_schema_is_a_valid_json_schema() -> None:
    """The schema file is valid draft 2020-12 and rejects an object without schemaVersion."""
    schema = output_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate({"runs": []})


async def test_every_json_object_matches_the_schema(tmp_path: Path, state_dir: Path) -> None:
    """prompt, run, compare, show, runs, diff, apply, agents and an error all validate."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("The colour of money.\n")
    pipeline = tmp_path / "edit.py"
    pipeline.write_text(PIPELINE)
    script = write_script(
        tmp_path / "writer.json",
        Turn(steps=(WriteFile(path="NOTES.md", content="notes\n"), Say(text="done"))),
    )
    writer = f"writer={shlex.join(agent_command(script))}"
    cwd = ["--cwd", str(project)]

    async def cli(*argv: str) -> Any:
        done = await run_cli(*argv, "--json", cwd=tmp_path, state=state_dir)
        document = as_json(done)
        check(document)
        return document

    prompted = await cli("prompt", "--agent", "demo", "--policy", "edit", *cwd, DEMO_EDIT)
    assert prompted["kind"] == "prompt"
    ran = await cli("run", str(pipeline), "--set", f"task={DEMO_EDIT}", "--policy", "edit", *cwd)
    assert ran["kind"] == "pipeline"
    compared = await cli("compare", "--agent", "demo", "--agent", writer, "--policy", "edit",
                         *cwd, DEMO_EDIT)  # fmt: skip
    assert compared["kind"] == "compare"
    for run_id in (prompted["runId"], ran["runId"], compared["runId"]):
        await cli("show", run_id)
        await cli("diff", run_id)
    listed = await cli("runs")
    assert len(listed["runs"]) == 3
    applied = await cli("apply", ran["runId"])
    assert applied["runId"] == ran["runId"]
    await cli("agents", "demo")
    failed = await cli("prompt", "--agent", "demo", "--cwd", str(tmp_path / "missing"), "hi")
    assert failed["exitCode"] == 2
