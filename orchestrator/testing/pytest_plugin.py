"""A pytest plugin to test pipelines, policies and automation built on acp-orchestrator.

Installed with the package (a ``pytest11`` entry point), so its fixtures are there in any
test suite of an environment that has acp-orchestrator. Their names start with
``orchestrator_``: pytest fixtures share one namespace, and a conftest's fixture silently
replaces a plugin's of the same name, so a generic name (``project``, ``state_dir``) would
be taken over by, or take over, fixtures that test suites commonly define themselves.

``orchestrator_state_dir``
    A fresh state directory for the test: ``ORCHESTRATOR_STATE_DIR`` points at it (and
    ``ORCHESTRATOR_CONFIG`` at an empty config file, so the user's own config does not change
    what a test does) until the test ends, when both are restored. Runs, branches and trust
    records of the test go there, never to the user's state directory.
``orchestrator_project``
    A :class:`~orchestrator.testing.project.TempProjects`: ``orchestrator_project({"a.py":
    "..."}, git=True)`` makes a project directory holding those files (a committed git
    repository with ``git=True``). It uses ``orchestrator_state_dir``.
``orchestrator_agents``
    A fresh :class:`~orchestrator.testing.connector.InProcessAgents`: the connector to pass
    as ``connector=`` so that the demo agent and the scripted agents given to it with
    ``add(name, script)`` run in the test's process, no agent process started. It uses
    ``orchestrator_state_dir``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from orchestrator.testing.connector import InProcessAgents
    from orchestrator.testing.project import TempProjects

__all__ = ["orchestrator_agents", "orchestrator_project", "orchestrator_state_dir"]


@pytest.fixture
def orchestrator_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A state directory of the test's own, in the environment until the test ends."""
    path = tmp_path_factory.mktemp("orchestrator-state")
    config = tmp_path_factory.mktemp("orchestrator-config") / "config.toml"
    config.write_text("", encoding="utf-8")
    # monkeypatch is function-scoped like this fixture; its own instance restores on exit
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORCHESTRATOR_STATE_DIR", str(path))
        patch.setenv("ORCHESTRATOR_CONFIG", str(config))
        yield path


@pytest.fixture
def orchestrator_project(
    tmp_path_factory: pytest.TempPathFactory, orchestrator_state_dir: Path
) -> TempProjects:
    """Makes temporary projects: call it with their files (and ``git=True`` for a repository)."""
    from orchestrator.testing.project import TempProjects

    # a directory of its own: the test's tmp_path stays the test's
    return TempProjects(tmp_path_factory.mktemp("orchestrator-projects"))


@pytest.fixture
def orchestrator_agents(orchestrator_state_dir: Path) -> InProcessAgents:
    """The demo agent and scripted agents served in the test's process: pass as ``connector=``."""
    from orchestrator.testing.connector import InProcessAgents

    return InProcessAgents()
