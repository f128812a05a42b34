"""``orchestrator trust``, and the note a command gives when a project file is not trusted."""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .output import emit_json

if TYPE_CHECKING:
    from ..config import Config

TRUST_EXAMPLES = """\
examples:
  orchestrator trust              # the .orchestrator.toml of this directory
  orchestrator trust ../service   # another project's
  orchestrator trust --list
  orchestrator trust --remove
"""


def add_parser(sub: Any) -> None:
    """Add ``trust`` to the ``orchestrator`` parser's subcommands."""
    p = sub.add_parser(
        "trust",
        help="let a project's .orchestrator.toml start programs",
        description="Trust DIR/.orchestrator.toml as it is now: its agent commands, environment, "
        "working directories and policies are used. Until then they are ignored. Editing the "
        "file takes the trust back.",
        epilog=TRUST_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", nargs="?", default=".", help="the project directory (default: .)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--remove", action="store_true", help="take the trust back")
    what.add_argument("--list", action="store_true", help="list the trusted files")
    p.add_argument(
        "--state-dir",
        help="where runs and the trust record live (default: $ORCHESTRATOR_STATE_DIR or "
        "~/.local/state/acp-orchestrator)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


async def cmd_trust(args: argparse.Namespace) -> int:
    """``orchestrator trust``."""
    import trio

    return await trio.to_thread.run_sync(_trust, args)


def _trust(args: argparse.Namespace) -> int:
    from ..config import PROJECT_FILE, Config
    from ..errors import UsageError
    from ..trust import TrustStore

    store = TrustStore.at(args.state_dir)
    if args.list:
        rows = []
        for entry in store.entries():
            try:
                data = Path(entry.path).read_bytes()
            except OSError:
                state = "missing"
            else:
                state = store.status(entry.path, data)
            rows.append({**entry.to_json(), "status": state})
        if args.json:
            emit_json({"trusted": rows})
        else:
            for row in rows:
                print(f"{row['status']:<8} {row['path']}  ({row['trustedAt']})")
        return 0
    path = Path(args.dir) / PROJECT_FILE
    if args.remove:
        removed = store.revoke(path)
        if args.json:
            emit_json({"path": os.path.realpath(path), "removed": removed})
        else:
            print(f"{'no longer trusted' if removed else 'was not trusted'}: {path}")
        return 0
    if not path.is_file():
        raise UsageError(f"no {PROJECT_FILE} in {args.dir}")
    # check it whole before trusting it: a file that cannot be used is not worth a trust
    untrusted = Config.from_file(path, trusted=False)
    entry = store.trust(path)
    if args.json:
        emit_json({**entry.to_json(), "allows": list(_keys(untrusted))})
    else:
        print(f"trusted: {entry.path} ({entry.digest[:19]}...)")
        for key in _keys(untrusted):
            print(f"  now used: {key}")
    return 0


def _keys(config: Config) -> list[str]:
    return [item.rpartition(": ")[2] for item in config.ignored]


async def project_config(cwd: str, state_dir: str | None) -> Config:
    """The layered config for a command on ``cwd``; says on stderr what was not trusted."""
    import trio

    from ..config import Config

    config = await trio.to_thread.run_sync(functools.partial(Config.load, cwd, state_dir=state_dir))
    if config.ignored:
        changed = await trio.to_thread.run_sync(_changed, config, state_dir)
        from .logs import note

        note(
            untrusted_note(config, cwd, changed=changed),
            level="warning",
            event="untrusted_config",
            prefix="orchestrator: note: ",
        )
    return config


def _changed(config: Config, state_dir: str | None) -> bool:
    from ..trust import TrustStore

    store = TrustStore.at(state_dir)
    for file in _files(config):
        try:
            if store.status(file, Path(file).read_bytes()) == "changed":
                return True
        except OSError:
            pass
    return False


def untrusted_note(config: Config, cwd: str, *, changed: bool = False) -> str:
    """One line (after ``orchestrator: note: ``): which file was not trusted, what of it was
    ignored, how to trust it."""
    keys = ", ".join(_keys(config))
    where = "" if os.path.abspath(cwd) == os.getcwd() else f" {cwd}"
    why = "changed since it was trusted" if changed else "not trusted to start programs"
    return (
        f"{', '.join(_files(config))} is {why}, so "
        f"{keys} {'was' if len(config.ignored) == 1 else 'were'} ignored; "
        f"`orchestrator trust{where}` trusts it as it is now"
    )


def _files(config: Config) -> list[str]:
    return sorted({item.rpartition(": ")[0] for item in config.ignored})
