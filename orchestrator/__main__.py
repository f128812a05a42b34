"""``python -m orchestrator``: the command line."""

from orchestrator.cli import entry

entry()
