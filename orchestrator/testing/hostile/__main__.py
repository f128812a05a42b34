"""``python -m orchestrator.testing.hostile ATTACK``: play an attack on stdin/stdout."""

from __future__ import annotations

import sys

from orchestrator.testing.hostile._agent import main

if __name__ == "__main__":
    sys.exit(main())
