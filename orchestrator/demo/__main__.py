"""``python -m orchestrator.demo``: the demo agent over stdin/stdout."""

from __future__ import annotations

from .agent import main

if __name__ == "__main__":
    main()
