"""Replaying recorded runs: the record format and the agent that plays it."""

from __future__ import annotations

from .record import (
    BASE_UNKNOWN,
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
    "BASE_UNKNOWN",
    "FORMAT",
    "VERSION",
    "RecordedChange",
    "RecordedFrame",
    "RecordedSession",
    "RecordedTurn",
    "ReplayRecord",
    "load_record",
]
