"""Replaying recorded runs: the record format and the agent that plays it."""

from __future__ import annotations

from .record import (
    FORMAT,
    VERSION,
    RecordedChange,
    RecordedFrame,
    RecordedSession,
    RecordedTurn,
    ReplayRecord,
    load_record,
)

__all__ = [
    "FORMAT",
    "VERSION",
    "RecordedChange",
    "RecordedFrame",
    "RecordedSession",
    "RecordedTurn",
    "ReplayRecord",
    "load_record",
]
