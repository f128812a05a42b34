"""``python -m orchestrator.testing SCRIPT.json``: run the scripted agent on stdin/stdout."""

from __future__ import annotations

import sys

from orchestrator.testing.scripted_agent import main

if __name__ == "__main__":
    sys.exit(main())
