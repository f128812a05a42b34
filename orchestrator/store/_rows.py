"""How the run store's records become rows and JSON columns, and back.

Pure functions, no database: the column lists in table order, the JSON encoding of record fields
(a value JSON cannot hold is a :class:`TypeError` naming the field), and the ND-JSON lines of wire
transcripts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import orjson

from .records import RunRecord, StepRecord

__all__ = [
    "RUN_COLUMNS",
    "RUN_UPDATABLE",
    "STEP_COLUMNS",
    "dumps",
    "loads",
    "run_from_row",
    "run_values",
    "step_from_row",
    "step_values",
    "transcript_line",
    "transcript_lines",
    "transcript_rows",
]

#: the run fields :meth:`~orchestrator.store.RunStore.update_run` may change
RUN_UPDATABLE = frozenset(a.name for a in attrs.fields(RunRecord)) - {"run_id"}

#: the columns of the ``runs`` table, in the order of :func:`run_values`
RUN_COLUMNS = (
    "run_id, kind, status, created, finished, cwd, pipeline, pipeline_digest, inputs, options, "
    "result, error, applied, parent"
)
#: the columns of the ``steps`` table, in the order of :func:`step_values`
STEP_COLUMNS = (
    "run_id, key, step, instance, agent, status, attempt, started, finished, session_id, "
    "result, value, value_stored, error, cause, usage, traceback, error_kind"
)


def dumps(value: Any, what: str) -> str:
    """``value`` as JSON text; a :class:`TypeError` naming ``what`` if JSON cannot hold it."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as e:
        raise TypeError(f"{what} is not JSON-serializable: {e}") from e


def loads(text: str | bytes | None) -> Any:
    """The value of a JSON column (``None`` for SQL NULL)."""
    return None if text is None else orjson.loads(text)


def run_values(run: RunRecord) -> tuple[Any, ...]:
    """The row of ``run`` in ``RUN_COLUMNS`` order."""
    return (
        run.run_id,
        run.kind,
        run.status,
        run.created,
        run.finished,
        run.cwd,
        run.pipeline,
        run.pipeline_digest,
        dumps(dict(run.inputs), "run inputs"),
        dumps(dict(run.options), "run options"),
        None if run.result is None else dumps(dict(run.result), "run result"),
        run.error,
        run.applied,
        run.parent,
    )


def run_from_row(row: Sequence[Any]) -> RunRecord:
    """The record of a row selected in ``RUN_COLUMNS`` order."""
    (run_id, kind, status, created, finished, cwd, pipeline, digest) = row[:8]
    inputs, options, result, error, applied, parent = row[8:]
    return RunRecord(
        run_id=run_id,
        kind=kind,
        status=status,
        created=created,
        cwd=cwd,
        finished=finished,
        pipeline=pipeline,
        pipeline_digest=digest,
        inputs=loads(inputs),
        options=loads(options),
        result=loads(result),
        error=error,
        applied=applied,
        parent=parent,
    )


def step_values(step: StepRecord) -> tuple[Any, ...]:
    """The row of ``step`` in ``STEP_COLUMNS`` order."""
    what = f"step {step.key!r}"
    return (
        step.run_id,
        step.key,
        step.step,
        step.instance,
        step.agent,
        step.status,
        step.attempt,
        step.started,
        step.finished,
        step.session_id,
        None if step.result is None else dumps(dict(step.result), f"{what} result"),
        dumps(step.value, f"{what} value") if step.value_stored else None,
        int(step.value_stored),
        step.error,
        step.cause,
        None if step.usage is None else dumps(dict(step.usage), f"{what} usage"),
        step.traceback,
        step.error_kind,
    )


def step_from_row(row: Sequence[Any]) -> StepRecord:
    """The record of a row selected in ``STEP_COLUMNS`` order."""
    (run_id, key, step, instance, agent, status, attempt, started, finished) = row[:9]
    session_id, result, value, value_stored, error, cause, usage, traceback, error_kind = row[9:]
    return StepRecord(
        run_id=run_id,
        key=key,
        step=step,
        instance=instance,
        agent=agent,
        status=status,
        attempt=attempt,
        started=started,
        finished=finished,
        session_id=session_id,
        result=loads(result),
        value=loads(value) if value_stored else None,
        value_stored=bool(value_stored),
        error=error,
        cause=cause,
        usage=loads(usage),
        traceback=traceback,
        error_kind=error_kind,
    )


#: about how many bytes of ND-JSON one stored transcript row holds
TRANSCRIPT_CHUNK = 1 << 20


def transcript_lines(lines: Sequence[bytes | Mapping[str, Any]]) -> list[bytes]:
    """ND-JSON as stored: rows of whole lines, about :data:`TRANSCRIPT_CHUNK` bytes each.

    A flood of a few hundred thousand frames is a few dozen rows, not a row per frame (an
    insert per line cost more than the run it recorded); readers split rows at newlines.
    Bytes items are cut at line ends only; mappings are encoded one per line.
    """
    out: list[bytes] = []
    for item in lines:
        if not isinstance(item, bytes | bytearray | memoryview):
            out.append(orjson.dumps(dict(item)))
            continue
        data = bytes(item)
        start = 0
        while start < len(data):
            end = data.find(b"\n", start + TRANSCRIPT_CHUNK)
            end = len(data) if end < 0 else end
            chunk = data[start:end].strip(b"\n")
            if chunk.strip():
                out.append(chunk)
            start = end + 1
    return out


def transcript_rows(rows: Sequence[bytes]) -> list[dict[str, Any]]:
    """The lines of stored transcript rows, decoded (blank lines skipped)."""
    return [
        transcript_line(line) for row in rows for line in bytes(row).split(b"\n") if line.strip()
    ]


def transcript_line(line: bytes) -> dict[str, Any]:
    """A stored line decoded; a line that is not a JSON object is kept as ``{"raw": text}``."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        value = None
    if isinstance(value, dict):
        return value
    return {"raw": bytes(line).decode("utf-8", "replace")}
