"""The built-in demo agent: rule-based and deterministic (no model, no API keys)."""

from __future__ import annotations

from .agent import DemoAgent, serve_demo_agent
from .instructions import Instruction, NotUnderstood, apply_edit, parse_instructions, parse_prompt

__all__ = [
    "DemoAgent",
    "Instruction",
    "NotUnderstood",
    "apply_edit",
    "parse_instructions",
    "parse_prompt",
    "serve_demo_agent",
]
