"""Tests of the pytest plugin (orchestrator.testing.pytest_plugin) and the in-process agents."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from orchestrator import prompt, run_pipeline
from orchestrator.errors import AgentStartError, UsageError
from orchestrator.testing import AgentScript, InProcessAgents, Say, TempProjects, Turn
from orchestrator.testing.connector import is_demo_agent

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "orchestrator.testing.pytest_plugin"


def test_the_plugin_is_declared_as_a_pytest11_entry_point_named_as_its_module() -> None:
    """pyproject.toml registers the plugin for pytest under its module's name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    assert project["entry-points"]["pytest11"] == {PLUGIN: PLUGIN}


def test_our_suite_runs_with_the_plugin_loaded(request: pytest.FixtureRequest) -> None:
    """This suite loads the plugin (as an installed package does) next to its own fixtures."""
    assert request.config.pluginmanager.get_plugin(PLUGIN) is not None
    names = request.fixturenames
    assert "state_dir" in names  # tests/conftest.py's, autouse: unchanged by the plugin


def test_the_state_directory_fixture_points_the_library_there_and_restores_it(
    pytester: pytest.Pytester,
) -> None:
    """During a test the state directory (and an empty user config) are the fixture's; after
    it, the variables are what they were."""
    before = os.environ.get("ORCHESTRATOR_STATE_DIR")
    config = os.environ.get("ORCHESTRATOR_CONFIG")
    pytester.makepyfile(
        f"""
        import os
        from pathlib import Path

        from orchestrator.config import user_config_path
        from orchestrator.state import state_directory

        def test_inside(orchestrator_state_dir: Path) -> None:
            assert os.environ["ORCHESTRATOR_STATE_DIR"] == str(orchestrator_state_dir)
            assert state_directory() == orchestrator_state_dir
            assert user_config_path().read_text() == ""

        def test_after() -> None:
            assert os.environ.get("ORCHESTRATOR_STATE_DIR") == {before!r}
            assert os.environ.get("ORCHESTRATOR_CONFIG") == {config!r}
        """
    )
    pytester.runpytest("-p", PLUGIN, "-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_fixture_names_do_not_clash_with_a_suites_own(pytester: pytest.Pytester) -> None:
    """A conftest's own ``state_dir``, ``project`` and ``agents`` fixtures live alongside the
    plugin's ``orchestrator_*`` ones, each test getting what it asked for."""
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def state_dir() -> str:
            return "mine"

        @pytest.fixture
        def project() -> str:
            return "my project"

        @pytest.fixture
        def agents() -> list[str]:
            return ["mine"]
        """
    )
    pytester.makepyfile(
        """
        from orchestrator.testing import InProcessAgents, TempProjects

        def test_both(state_dir, project, agents, orchestrator_state_dir, orchestrator_project,
                      orchestrator_agents) -> None:
            assert (state_dir, project, agents) == ("mine", "my project", ["mine"])
            assert orchestrator_state_dir.is_dir()
            assert isinstance(orchestrator_project, TempProjects)
            assert isinstance(orchestrator_agents, InProcessAgents)
        """
    )
    pytester.runpytest("-p", PLUGIN, "-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_project_fixture_writes_the_files_given(orchestrator_project: TempProjects) -> None:
    """Text and bytes, in subdirectories; each call a new directory."""
    first = orchestrator_project({"README.md": "hi\n", "src/pkg/a.bin": b"\x00\xff"})
    second = orchestrator_project()
    assert (first / "README.md").read_text() == "hi\n"
    assert (first / "src/pkg/a.bin").read_bytes() == b"\x00\xff"
    assert first != second
    assert list(second.iterdir()) == []


def test_the_project_fixture_makes_a_git_repository_on_request(
    orchestrator_project: TempProjects,
) -> None:
    """With ``git=True`` the files are committed, the tree clean."""
    project = orchestrator_project({"a.txt": "a\n"}, git=True)

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=project, capture_output=True, text=True, check=True
        ).stdout

    assert git("ls-files").splitlines() == ["a.txt"]
    assert git("status", "--porcelain") == ""
    assert git("log", "--format=%s").splitlines() == ["the project"]


@pytest.mark.parametrize("name", ["/etc/passwd", "../out.txt", "a/../../b", "", "."])
def test_the_project_fixture_refuses_paths_outside_the_project(
    orchestrator_project: TempProjects, name: str
) -> None:
    """A file name that is absolute, empty or climbs out is refused."""
    with pytest.raises(UsageError, match="relative path inside it"):
        orchestrator_project({name: "x"})


async def test_the_demo_agent_runs_in_process_through_prompt(
    orchestrator_project: TempProjects,
    orchestrator_agents: InProcessAgents,
    orchestrator_state_dir: Path,
) -> None:
    """``prompt`` with the connector: the demo agent follows its instructions in this process
    (no agent process started), the run kept in the test's state directory."""
    project = orchestrator_project({"notes.md": "The colour.\n"})
    children_before = _children()
    run = await prompt(
        "demo",
        'replace "colour" with "color" in *.md\nappend "done" to notes.md',
        cwd=project,
        policy="edit",
        apply=True,
        connector=orchestrator_agents,
    )
    assert run.status == "succeeded"
    assert (project / "notes.md").read_text() == "The color.\ndone\n"
    assert orchestrator_agents.demo_started == 1
    assert _children() == children_before
    assert (orchestrator_state_dir / "runs" / run.run_id).is_dir()


async def test_a_pipeline_runs_the_demo_agent_under_labels_and_scripted_agents_by_name(
    orchestrator_project: TempProjects, orchestrator_agents: InProcessAgents
) -> None:
    """Labels of the demo agent (``a=demo``) are the demo agent; a name given a script is that
    scripted agent, its record kept."""
    project = orchestrator_project({"x.txt": "one\n"})
    pipeline = project.parent / "pipeline.py"
    pipeline.write_text(
        "from orchestrator import step\n\n"
        '@step(agent="a=demo")\n'
        "def edit() -> str:\n"
        '    return \'replace "one" with "two" in x.txt\'\n\n'
        '@step(agent="checker")\n'
        "def check(edit: object) -> str:\n"
        '    return "check x.txt"\n'
    )
    orchestrator_agents.add(
        "checker", AgentScript(turns=(Turn((Say("fine"),), when_prompt_matches=r"^check "),))
    )
    run = await run_pipeline(
        pipeline, cwd=project, policy="edit", apply=True, connector=orchestrator_agents
    )
    assert run.status == "succeeded"
    assert (project / "x.txt").read_text() == "two\n"
    [record] = orchestrator_agents.records["checker"]
    assert record.first("prompt")["text"] == "check x.txt"
    assert record.first("prompt")["turn"] == 0


async def test_an_agent_not_served_in_process_is_refused(
    orchestrator_project: TempProjects, orchestrator_agents: InProcessAgents
) -> None:
    """An agent that is neither the demo agent nor given a script is not started at all: the
    run fails as one whose agent could not start."""
    project = orchestrator_project({"x.txt": "one\n"})
    run = await prompt("stranger", "hi", cwd=project, connector=orchestrator_agents)
    assert (run.status, run.error_kind) == ("failed", "agent-start")
    assert isinstance(run.exception, AgentStartError)
    assert "agent stranger is not served in this process" in str(run.error)


async def test_a_scripted_agent_is_served_under_a_label_too(
    orchestrator_project: TempProjects, orchestrator_agents: InProcessAgents
) -> None:
    """``y=refuser`` in a comparison is the scripted agent ``refuser`` labelled ``y``; its record
    is kept under its own name."""
    from orchestrator import compare

    project = orchestrator_project({"x.txt": "one\n"})
    orchestrator_agents.add("refuser", AgentScript(turns=(Turn(stop_reason="refusal"),)))
    side = await compare(
        ["x=demo", "y=refuser"],
        'replace "one" with "two" in x.txt',
        cwd=project,
        policy="edit",
        connector=orchestrator_agents,
    )
    by_name = {a.name: a for a in side.agents}
    assert (by_name["x"].status, by_name["y"].status) == ("succeeded", "failed")
    assert by_name["y"].error_kind == "stopped"
    assert len(orchestrator_agents.records["refuser"]) == 1


def test_is_demo_agent_knows_the_demo_agent_under_any_label() -> None:
    """``demo``, a label of it and the demo on a model are the demo agent; others are not."""
    from orchestrator.agents import resolve_agent

    assert is_demo_agent(resolve_agent("demo"))
    assert is_demo_agent(resolve_agent("alice=demo"))
    assert is_demo_agent(resolve_agent("demo:demo-slow"))
    assert not is_demo_agent(resolve_agent("python -m orchestrator.testing.scripted_agent x"))


def _children() -> set[int]:
    """This process's live children (the process watchdog aside: it comes and stays)."""
    from conftest import is_process_watchdog, pid_gone

    path = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    pids = {int(p) for p in path.read_text().split()}
    return {p for p in pids if not pid_gone(p) and not is_process_watchdog(p)}
