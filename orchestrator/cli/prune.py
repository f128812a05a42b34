"""``orchestrator prune``: delete recorded runs and what they left in the state directory."""

from __future__ import annotations

import argparse
import datetime
import re
from typing import TYPE_CHECKING, Any

from .output import emit_json, say

if TYPE_CHECKING:
    from ..runs.prune import PruneOutcome, StoreUsage

PRUNE_EXAMPLES = """\
examples:
  orchestrator prune --older-than 7d --dry-run   # what would go, and the room it frees
  orchestrator prune --older-than 2026-11-01
  orchestrator prune --keep 50                   # all but the 50 newest runs
  orchestrator prune 3f2a 9c1e                   # these runs (unique id prefixes)

A run that is running, being resumed or applied is never deleted. A batch run goes with the
runs of its repositories (--keep and --older-than count batches, not their runs), never one of
those runs alone.
"""

_AGE = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def older_than(text: str) -> datetime.datetime | datetime.timedelta:
    """An age (``7d``, ``12h``, ``30m``, ``2w``, ``45s``) or a local date or time
    (``2026-11-01``, ``2026-11-01T12:00``)."""
    age = _AGE.fullmatch(text.strip())
    if age is not None:
        return datetime.timedelta(**{_UNITS[age[2]]: int(age[1])})
    try:
        return datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a date or an age: {text!r} (a date such as 2026-11-01, or an age such as 7d, "
            "12h, 30m, 2w)"
        ) from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be below 0, got {value}")
    return value


def add_parser(sub: Any) -> None:
    """Add ``prune`` to the ``orchestrator`` parser's subcommands."""
    p = sub.add_parser(
        "prune",
        help="delete old runs and what they left in the state directory",
        description="Delete recorded runs with their transcripts, run directories and the "
        "stored file contents no remaining run uses. Choose them by id, by age, or by how many "
        "of the newest to keep.",
        epilog=PRUNE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", nargs="*", help="run ids (a unique prefix is enough)")
    p.add_argument(
        "--older-than",
        type=older_than,
        metavar="DATE|AGE",
        help="runs started before this date (2026-11-01, local time) or longer ago than this "
        "age (7d, 12h, 30m, 2w)",
    )
    p.add_argument(
        "--keep", type=_count, metavar="N", help="keep the N newest runs (with --older-than: "
        "of the runs older than it, delete only those beyond the N newest runs)"
    )  # fmt: skip
    p.add_argument(
        "--dry-run", action="store_true", help="say what would be deleted; delete nothing"
    )
    p.add_argument(
        "--state-dir",
        help="where runs and branches live (default: $ORCHESTRATOR_STATE_DIR or "
        "~/.local/state/acp-orchestrator)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def size(n: int) -> str:
    """Bytes for people."""
    from .._sizes import format_size

    return format_size(n)


def usage_line(usage: StoreUsage) -> str:
    """The one line ``runs`` ends with: the room the run store takes."""
    return (
        f"store: {size(usage.total_bytes)} (database {size(usage.database_bytes)}, "
        f"run directories {size(usage.file_bytes)})"
    )


def usage_json(usage: StoreUsage) -> dict[str, int]:
    """The room the run store takes, as ``runs --json`` gives it under ``store``."""
    return {
        "bytes": usage.total_bytes,
        "databaseBytes": usage.database_bytes,
        "fileBytes": usage.file_bytes,
    }


async def cmd_prune(args: argparse.Namespace) -> int:
    """``orchestrator prune``."""
    from ..errors import UsageError
    from ..runs import prune

    if args.run and (args.older_than is not None or args.keep is not None):
        raise UsageError("give run ids, or --older-than and --keep, not both")
    if not args.run and args.older_than is None and args.keep is None:
        raise UsageError("nothing chosen to prune: give run ids, --older-than DATE|AGE or --keep N")
    outcome = await prune(
        args.run,
        older_than=args.older_than,
        keep=args.keep,
        dry_run=args.dry_run,
        state_dir=args.state_dir,
    )
    if args.json:
        emit_json(outcome.to_json())
    else:
        _say(outcome)
    return 0


def _say(outcome: PruneOutcome) -> None:
    import datetime as dt

    verb = "would delete" if outcome.dry_run else "deleted"
    for run in outcome.deleted:
        when = dt.datetime.fromtimestamp(run.created).strftime("%Y-%m-%d %H:%M:%S")
        if run.parent is None:
            say(f"{verb} {run.run_id}  {when}  {run.kind:<8} {run.status}")
        else:  # with its batch, the line above
            pad = " " * (len(verb) - 1)
            say(f"{pad}\u21b3 {run.run_id}  {when}  {run.kind:<8} {run.status}")
    for skipped in outcome.skipped:
        say(f"kept {skipped.run_id}: {skipped.reason}")
    n = len(outcome.deleted)
    runs = f"{n} run{'' if n == 1 else 's'}"
    children = sum(run.parent is not None for run in outcome.deleted)
    if children:
        batches = len({run.parent for run in outcome.deleted if run.parent is not None})
        runs += f" ({children} of them with their batch{'' if batches == 1 else 'es'})"
    left = ""
    if outcome.leftovers:
        left = f" and {outcome.leftovers} director{'y' if outcome.leftovers == 1 else 'ies'} "
        left += "left by a crash"
    freed = (
        f"{size(outcome.bytes_freed)} (database {size(outcome.database_bytes)}, files "
        f"{size(outcome.file_bytes)})"
    )
    if outcome.dry_run:
        say(f"would delete {runs}{left}, freeing {freed}; nothing was deleted (--dry-run)")
    else:
        say(f"deleted {runs}{left}, freed {freed}")
