"""Agent quirks keyed by what ``initialize`` reports: the table, what each quirk changes (a read
of a missing file, the shutdown ladder, usage from ``_meta.quota``, the reject option), and how
runs record them, through the library and the console script."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from run_helpers import CLI, as_json, record_events, run_cli, workspace

from orchestrator.agent.launch import open_agent
from orchestrator.agent.quirks import (
    HANDLED_GENERICALLY,
    QUIRKS,
    known_agent_quirks,
    quirks_for,
    usage_from_quota,
)
from orchestrator.cli.output import output_schema
from orchestrator.protocol import types as t
from orchestrator.testing import (
    AgentScript,
    AskPermission,
    ReadFile,
    Replace,
    Turn,
    scripted_agent_command,
)
from orchestrator.testing.script import PermissionOption

README = Path(__file__).resolve().parent.parent / "README.md"
GEMINI_QUIRKS = ["gemini-missing-file-reads-empty", "gemini-usage-from-meta-quota"]
#: what Gemini CLI 0.61 sends as the prompt response's _meta
QUOTA = {
    "quota": {
        "token_count": {"input_tokens": 1200, "output_tokens": 34},
        "model_usage": [
            {"model": "gemini-2.5-pro", "token_count": {"input_tokens": 1200, "output_tokens": 34}}
        ],
    }
}


def info(name: str, version: str | None) -> t.Implementation:
    """An ``agentInfo`` as ``initialize`` reports it."""
    return t.Implementation(name=name, version=version or "")


# --------------------------------------------------------------------------- the table


def test_gemini_0_61_matches_its_quirks_by_reported_name_and_version() -> None:
    """gemini-cli 0.61.x matches both Gemini quirks; the name alone or another version does not."""
    assert list(quirks_for(info("gemini-cli", "0.61.0")).ids) == GEMINI_QUIRKS
    assert list(quirks_for(info("gemini-cli", "0.61.3")).ids) == GEMINI_QUIRKS
    for version in ("0.60.9", "0.62.0", "", "nightly"):
        assert quirks_for(info("gemini-cli", version)).ids == ()
    assert quirks_for(info("gemini", "0.61.0")).ids == ()  # the known agent's label is no match
    assert quirks_for(None).ids == ()


def test_codex_quirks_match_codex_acp() -> None:
    """codex-acp 0.16 skips the stdin grace; any codex-acp prefers the reject that goes on."""
    assert quirks_for(info("codex-acp", "0.16.0")).ids == (
        "codex-acp-ignores-stdin-close",
        "codex-acp-reject-continues",
    )
    assert quirks_for(info("codex-acp", "0.17.0")).ids == ("codex-acp-reject-continues",)


def test_every_quirk_has_a_unique_id_and_its_agents_name() -> None:
    """Ids are unique, and each quirk names the known agent it is listed under."""
    ids = [q.id for q in QUIRKS]
    assert len(ids) == len(set(ids))
    assert {q.known_as for q in QUIRKS} == {"gemini", "codex"}
    assert [q.id for q in known_agent_quirks("gemini")] == GEMINI_QUIRKS
    assert known_agent_quirks("demo") == ()


def test_the_readme_table_lists_every_quirk_and_generic_case() -> None:
    """The README's agent quirks table has a row per quirk id and per generically handled case."""
    text = README.read_text()
    section = text[text.index("#### Agent quirks") :]
    section = section[: section.index("\n### ")]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]
    listed = {m.group(1) for line in rows if (m := re.match(r"\| `([^`]+)`", line))}
    assert {q.id for q in QUIRKS} <= listed
    for case in HANDLED_GENERICALLY:
        assert any(case.agent in line and "generic" in line for line in rows), case


def test_usage_is_read_from_meta_quota() -> None:
    """_meta.quota.token_count becomes the turn's token counts; anything else gives none."""
    usage = usage_from_quota(QUOTA)
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (1200, 34, 1234)
    assert usage_from_quota(None) is None
    assert usage_from_quota({"quota": {"token_count": {"input_tokens": "1"}}}) is None
    assert (
        usage_from_quota({"quota": {"token_count": {"input_tokens": -1, "output_tokens": 0}}})
        is None
    )


def test_codex_reject_options_put_denied_before_abort() -> None:
    """For codex-acp a reject sees 'denied' (the turn goes on) before 'abort' (it ends)."""
    options = [
        t.PermissionOption(option_id="approved", name="Yes", kind="allow_once"),
        t.PermissionOption(option_id="abort", name="No, and tell Codex", kind="reject_once"),
        t.PermissionOption(option_id="denied", name="No, continue", kind="reject_once"),
    ]
    codex = quirks_for(info("codex-acp", "0.16.0"))
    assert [o.option_id for o in codex.ordered_options(options)] == ["approved", "denied", "abort"]
    other = quirks_for(info("other-agent", "0.16.0"))
    assert other.ordered_options(options) is options
    only_abort = options[:2]
    assert codex.ordered_options(only_abort) is only_abort


# --------------------------------------------------------------------------- the shutdown ladder


async def test_codex_acp_gets_sigterm_right_after_stdin_closes(tmp_path: Path) -> None:
    """An agent reporting codex-acp 0.16, started by any command, is not given the stdin grace."""
    script = AgentScript(name="codex-acp", version="0.16.0", ignore_stdin_close=True)
    async with open_agent(scripted_agent_command(script, tmp_path), name="whatever") as conn:
        process = conn.process
        assert process is not None
        assert "codex-acp-ignores-stdin-close" in conn.quirks.ids
    assert process.shutdown_steps[:3] == ["close-stdin", "sigterm", "wait-term-grace"]
    assert "wait-stdin-grace" not in process.shutdown_steps


async def test_another_agent_that_ignores_stdin_close_waits_the_grace(tmp_path: Path) -> None:
    """The same agent under another name gets the whole ladder: the stdin grace, then SIGTERM."""
    script = AgentScript(name="codex-like", version="0.16.0", ignore_stdin_close=True)
    command = scripted_agent_command(script, tmp_path)
    async with open_agent(command, name="codex", term_grace=0.2) as conn:
        process = conn.process
        assert process is not None
        assert conn.quirks.ids == ()
    assert process.shutdown_steps[:3] == ["close-stdin", "wait-stdin-grace", "sigterm"]


# --------------------------------------------------------------------------- through the CLI


def gemini_like(directory: Path, name: str, version: str) -> tuple[str, Path]:
    """An ``--agent`` command line (no label) for a scripted agent that reports ``name`` and
    ``version`` and creates ``new.txt`` the way Gemini CLI does: it reads the missing file
    through the client first and writes it only if that read answered content; and the file
    its record goes to."""
    record = directory / f"{name}-{version}.jsonl"
    script = AgentScript(
        name=name,
        version=version,
        turns=[
            Turn(
                steps=[ReadFile(path="new.txt", then_write=Replace(old="", new="made\n"))],
                response_meta=QUOTA,
            )
        ],
        record_path=str(record),
    )
    folder = directory / f"agent-{name}-{version}"
    folder.mkdir()
    return shlex.join(scripted_agent_command(script, folder)), record


def valid(done: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    """The command's --json output, valid under the shipped schema."""
    assert done.returncode == 0, done.stderr.decode()
    document: dict[str, Any] = as_json(done)
    jsonschema.Draft202012Validator(output_schema()).validate(document)
    return document


def fs_reads(record: Path) -> list[dict[str, Any]]:
    """The agent's fs/read_text_file outcomes, from its record."""
    return [e for e in record_events(record) if e["event"] == "fs_read"]


pytestmark_cli = pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")


@pytestmark_cli
async def test_gemini_by_its_command_line_creates_a_file_and_records_its_quirks(
    tmp_path: Path,
) -> None:
    """gemini-cli 0.61.0 started by a bare command line reads a missing file as empty, so its
    new file is made; the run's JSON, and show, name the quirks and carry _meta.quota's tokens."""
    root = workspace(tmp_path)
    agent, record = gemini_like(tmp_path, "gemini-cli", "0.61.0")
    state = tmp_path / "state"
    done = await run_cli(
        "prompt", "--agent", agent, "--cwd", str(root), "--json", "make it", cwd=root, state=state
    )
    result = valid(done)
    assert result["agent"]["reportedName"] == "gemini-cli"
    assert result["agent"]["quirks"] == GEMINI_QUIRKS
    assert [e.get("content") for e in fs_reads(record)] == [""]
    assert [c["path"] for c in result["changes"]] == ["new.txt"]
    assert result["usage"]["tokens"] == {
        "inputTokens": 1200,
        "outputTokens": 34,
        "totalTokens": 1234,
    }
    shown = valid(await run_cli("show", result["runId"], "--json", cwd=root, state=state))
    assert shown["agent"]["quirks"] == GEMINI_QUIRKS
    text = await run_cli("show", result["runId"], cwd=root, state=state)
    assert "quirks gemini-missing-file-reads-empty, gemini-usage-from-meta-quota" in (
        text.stdout.decode()
    )


@pytest.mark.parametrize(("name", "version"), [("other-agent", "0.61.0"), ("gemini-cli", "0.62.0")])
@pytestmark_cli
async def test_other_agents_get_the_spec_error_for_a_missing_file(
    tmp_path: Path, name: str, version: str
) -> None:
    """Another agent name, or a Gemini version outside the range, gets -32002 for the read:
    no file is made, no quirk is recorded and _meta.quota is not read."""
    root = workspace(tmp_path)
    agent, record = gemini_like(tmp_path, name, version)
    done = await run_cli(
        "prompt",
        "--agent",
        agent,
        "--cwd",
        str(root),
        "--json",
        "make it",
        cwd=root,
        state=tmp_path / "state",
    )
    result = valid(done)
    assert result["agent"]["quirks"] == []
    [read] = fs_reads(record)
    assert read["error"]["code"] == -32002
    assert result["changes"] == []
    assert result["usage"] is None


@pytestmark_cli
async def test_quirks_stay_errors_outside_the_workspace_and_for_directories(
    tmp_path: Path,
) -> None:
    """Even for Gemini a path outside the session's directory, or a directory, stays an error."""
    root = workspace(tmp_path)
    (root / "sub").mkdir()
    (root / "sub" / "kept.txt").write_text("kept\n")
    outside = tmp_path / "elsewhere.txt"
    record = tmp_path / "gem.jsonl"
    script = AgentScript(
        name="gemini-cli",
        version="0.61.0",
        turns=[Turn(steps=[ReadFile(path=str(outside)), ReadFile(path="sub")])],
        record_path=str(record),
    )
    agent = shlex.join(scripted_agent_command(script, tmp_path))
    done = await run_cli(
        "prompt",
        "--agent",
        agent,
        "--cwd",
        str(root),
        "--json",
        "go",
        cwd=root,
        state=tmp_path / "s",
    )
    valid(done)
    assert [r["error"]["code"] for r in fs_reads(record)] == [-32602, -32602]


@pytestmark_cli
async def test_compare_records_each_agents_quirks(tmp_path: Path) -> None:
    """In a comparison each agent's entry names the quirks its own initialize matched."""
    root = workspace(tmp_path)
    gemini, _ = gemini_like(tmp_path, "gemini-cli", "0.61.0")
    other, _ = gemini_like(tmp_path, "other-agent", "0.61.0")
    done = await run_cli(
        "compare",
        "--agent",
        f"g={gemini}",
        "--agent",
        f"o={other}",
        "--cwd",
        str(root),
        "--json",
        "make it",
        cwd=root,
        state=tmp_path / "state",
    )
    result = valid(done)
    quirks = {a["name"]: a["agent"]["quirks"] for a in result["agents"]}
    assert quirks == {"g": GEMINI_QUIRKS, "o": []}


@pytestmark_cli
async def test_agents_lists_known_quirks_and_check_shows_the_matched_ones(tmp_path: Path) -> None:
    """The listing says which quirks gemini and codex may show; --check of an agent reporting
    gemini-cli 0.61.0 under any label names the quirks it matched."""
    listing = await run_cli("agents", "--json", cwd=tmp_path, state=tmp_path / "s")
    rows = {r["name"]: r for r in valid(listing)["agents"]}
    assert rows["gemini"]["knownQuirks"] == GEMINI_QUIRKS
    assert rows["demo"]["knownQuirks"] == []
    table = await run_cli("agents", cwd=tmp_path, state=tmp_path / "s")
    assert "gemini-missing-file-reads-empty" in table.stdout.decode()
    script = AgentScript(name="gemini-cli", version="0.61.0")
    agent = "mine=" + shlex.join(scripted_agent_command(script, tmp_path))
    checked = await run_cli(
        "agents", "--check", "--json", agent, cwd=tmp_path, state=tmp_path / "s"
    )
    [row] = valid(checked)["agents"]
    assert row["quirks"] == GEMINI_QUIRKS
    text = await run_cli("agents", "--check", agent, cwd=tmp_path, state=tmp_path / "s")
    assert re.search(r"quirks +gemini-missing-file-reads-empty, gemini-usage", text.stdout.decode())


# --------------------------------------------------------------------------- the reject option


@pytestmark_cli
async def test_a_reject_lets_codex_go_on_instead_of_aborting(tmp_path: Path) -> None:
    """codex-acp offering 'abort' before 'denied' gets 'denied' for a reject: the turn goes on."""
    record = tmp_path / "codex.jsonl"
    options = [
        PermissionOption(option_id="approved", name="Yes", kind="allow_once"),
        PermissionOption(option_id="abort", name="No, and tell Codex", kind="reject_once"),
        PermissionOption(option_id="denied", name="No, continue", kind="reject_once"),
    ]
    script = AgentScript(
        name="codex-acp",
        version="0.16.0",
        turns=[Turn(steps=[AskPermission(options=options, on_reject="continue")])],
        record_path=str(record),
    )
    agent = shlex.join(scripted_agent_command(script, tmp_path))
    root = workspace(tmp_path)
    done = await run_cli(
        "prompt",
        "--agent",
        agent,
        "--cwd",
        str(root),
        "--json",
        "go",
        cwd=root,
        state=tmp_path / "s",
    )
    result = valid(done)
    assert [p["optionId"] for p in result["permissions"]] == ["denied"]
    answers = [e for e in record_events(record) if e["event"] == "permission"]
    assert [(a["decision"], a["optionId"]) for a in answers] == [("reject", "denied")]


@pytestmark_cli
async def test_a_pipeline_step_instance_records_its_quirks(tmp_path: Path) -> None:
    """A step run by an agent reporting gemini-cli 0.61.0 keeps its quirks beside agentInfo, in
    run --json and in the store (show names them)."""
    root = workspace(tmp_path)
    agent, _ = gemini_like(tmp_path, "gemini-cli", "0.61.0")
    pipeline = tmp_path / "make.py"
    pipeline.write_text(
        "from orchestrator import step\n\n\n"
        f"@step(agent={('g=' + agent)!r})\n"
        "def make() -> str:\n"
        "    return 'make new.txt'\n"
    )
    state = tmp_path / "state"
    done = await run_cli("run", str(pipeline), "--cwd", str(root), "--json", cwd=root, state=state)
    result = valid(done)
    instance = result["steps"]["make"]["instances"]["make"]
    assert (instance["agentInfo"]["name"], instance["quirks"]) == ("gemini-cli", GEMINI_QUIRKS)
    shown = await run_cli("show", result["runId"], cwd=root, state=state)
    assert "quirks: gemini-missing-file-reads-empty, gemini-usage-from-meta-quota" in (
        shown.stdout.decode()
    )
