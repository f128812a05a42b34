"""The built-in demo agent: rule-based and deterministic (no model, no API keys)."""

from __future__ import annotations

from .agent import DemoAgent, serve_demo_agent
from .instructions import Instruction, apply_edit, parse_instructions

__all__ = ["DemoAgent", "Instruction", "apply_edit", "parse_instructions", "serve_demo_agent"]
