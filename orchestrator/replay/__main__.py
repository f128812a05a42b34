"""``python -m orchestrator.replay RECORD.json --agent LABEL``: the replay agent on stdio."""

from __future__ import annotations

from .agent import main

if __name__ == "__main__":
    main()
