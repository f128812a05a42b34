"""Agent quirks: what the client does differently for one agent, keyed by what it says it is.

An agent is recognised by the ``agentInfo`` it reports in ``initialize`` (its ``name``, and a
version range), never by the label or the command line it was started with: ``--agent gemini``
and ``--agent "node /opt/gemini/bundle/gemini.js --acp"`` get the same treatment. Every other
agent gets the protocol's own behaviour.

:data:`QUIRKS` is the one table of quirks that change what the client does;
:data:`HANDLED_GENERICALLY` lists the agents' peculiarities that the client's ordinary code
already copes with for every agent (so there is no quirk to match). :func:`quirks_for` gives
the quirks an agent's ``agentInfo`` matches, as an :class:`AppliedQuirks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from attrs import frozen

if TYPE_CHECKING:
    from ..protocol import types as t

__all__ = [
    "HANDLED_GENERICALLY",
    "QUIRKS",
    "AppliedQuirks",
    "Effect",
    "GenericCase",
    "Quirk",
    "known_agent_quirks",
    "quirks_for",
    "usage_from_quota",
]

#: What a quirk changes, as the client's code tests it:
#:
#: - ``missing-file-reads-empty``: ``fs/read_text_file`` of a missing file (a plain path in the
#:   session's directory that does not exist) is answered ``{"content": ""}`` instead of the
#:   error -32002; refused paths, directories and other errors stay errors;
#: - ``skip-stdin-grace``: on shutdown, SIGTERM follows the closing of stdin at once, without
#:   waiting for the agent to exit by itself;
#: - ``usage-from-meta-quota``: the turn's token counts are read from the prompt response's
#:   ``_meta.quota.token_count`` when it has no ``usage``;
#: - ``reject-continues``: a reject verdict answers with the agent's reject option that lets
#:   the turn go on, when it offers one besides the one that aborts the turn.
Effect = Literal[
    "missing-file-reads-empty", "skip-stdin-grace", "usage-from-meta-quota", "reject-continues"
]


@frozen
class Quirk:
    """One agent's departure from the protocol, and what the client does about it."""

    #: a stable id, recorded in runs (``gemini-missing-file-reads-empty``)
    id: str
    #: the ``agentInfo.name`` the agent reports in ``initialize``
    agent: str
    #: the versions it applies to, a PEP 440 specifier set (``>=0.61,<0.62``); "" for any
    versions: str
    #: the known agent it belongs to (``orchestrator agents``), for listing only: matching is
    #: on :attr:`agent` and :attr:`versions`, never on a label
    known_as: str
    #: what the agent does, one line
    description: str
    #: what the client does differently, one line
    change: str
    #: where the behaviour was seen (a release's source, a run)
    evidence: str
    #: what the client's code tests
    effect: Effect

    def matches(self, info: t.Implementation | None) -> bool:
        """Whether an agent that reported ``info`` in ``initialize`` has this quirk.

        A version that is not PEP 440 (or is missing) matches only a quirk for any version.
        """
        if info is None or info.name != self.agent:
            return False
        if not self.versions:
            return True
        from packaging.specifiers import SpecifierSet  # loaded only when an agent matches
        from packaging.version import InvalidVersion, Version

        try:
            version = Version(info.version or "")
        except InvalidVersion:
            return False
        return version in SpecifierSet(self.versions)


@frozen
class GenericCase:
    """An agent's peculiarity that the client handles for every agent: no quirk is needed."""

    #: the ``agentInfo.name`` of the agent it was seen with
    agent: str
    #: the known agent it belongs to
    known_as: str
    #: what the agent does
    description: str
    #: how the ordinary code copes with it
    handled_by: str


QUIRKS: tuple[Quirk, ...] = (
    Quirk(
        id="gemini-missing-file-reads-empty",
        agent="gemini-cli",
        versions=">=0.61,<0.62",
        known_as="gemini",
        description=(
            "creates a new file only if reading it first through fs/read_text_file succeeds; "
            "the error -32002 fails the write with 'Error checking existing file'"
        ),
        change="a read of a missing file in the session's directory answers empty content",
        evidence=(
            "@google/gemini-cli 0.61.0 bundle: AcpFileSystemService.normalizeFileSystemError "
            "tests the error's message, but the ACP SDK rejects with a plain object, so no "
            "error ever counts as ENOENT"
        ),
        effect="missing-file-reads-empty",
    ),
    Quirk(
        id="gemini-usage-from-meta-quota",
        agent="gemini-cli",
        versions=">=0.61,<0.62",
        known_as="gemini",
        description=(
            "reports token counts only in the prompt response's _meta.quota "
            "({token_count: {input_tokens, output_tokens}, model_usage}), not in usage"
        ),
        change="the turn's usage takes its token counts from _meta.quota.token_count",
        evidence="@google/gemini-cli 0.61.0 bundle: Session.prompt returns _meta.quota",
        effect="usage-from-meta-quota",
    ),
    Quirk(
        id="codex-acp-ignores-stdin-close",
        agent="codex-acp",
        versions=">=0.16,<0.17",
        known_as="codex",
        description="does not exit when its stdin closes, only on SIGTERM",
        change="shutdown sends SIGTERM right after closing stdin (no 2 s wait)",
        evidence="codex-acp 0.16: every run waited the full stdin grace before SIGTERM",
        effect="skip-stdin-grace",
    ),
    Quirk(
        id="codex-acp-reject-continues",
        agent="codex-acp",
        versions="",
        known_as="codex",
        description=(
            "offers two reject_once options for a command: 'denied' (go on without running "
            "it) and 'abort' (end the turn)"
        ),
        change="a reject verdict answers 'denied', so the turn goes on, as for other agents",
        evidence=(
            "codex-acp source (src/thread.rs): ReviewDecision::Denied is 'No, continue without "
            "running it', ReviewDecision::Abort 'No, and tell Codex what to do differently'"
        ),
        effect="reject-continues",
    ),
)

HANDLED_GENERICALLY: tuple[GenericCase, ...] = (
    GenericCase(
        agent="@zed-industries/claude-code-acp",
        known_as="claude",
        description="leaves the tool's kind and title out of session/request_permission",
        handled_by="the request is completed from the tool call the turn announced before it",
    ),
    GenericCase(
        agent="qwen-code",
        known_as="qwen",
        description="sends undeclared requests mid-turn (craft/drainMidTurnQueue)",
        handled_by="an unknown request is answered -32601 and the turn goes on",
    ),
    GenericCase(
        agent="qwen-code",
        known_as="qwen",
        description="sends lines of about 570 KB (its first available_commands_update)",
        handled_by="messages of up to 64 MiB are read",
    ),
)

#: the ids of the reject options of ``codex-acp`` that end the turn, and those that go on
_ABORTING_REJECTS = frozenset({"abort"})
_CONTINUING_REJECTS = frozenset({"denied"})


@frozen
class AppliedQuirks:
    """The quirks an agent's ``initialize`` matched (none for most agents)."""

    quirks: tuple[Quirk, ...] = ()

    @property
    def ids(self) -> tuple[str, ...]:
        """Their ids, as recorded in runs."""
        return tuple(q.id for q in self.quirks)

    def has(self, effect: Effect) -> bool:
        """Whether one of them has ``effect``."""
        return any(q.effect == effect for q in self.quirks)

    def ordered_options(self, options: list[t.PermissionOption]) -> list[t.PermissionOption]:
        """``options`` in the order the permission service should see them: with a
        ``reject-continues`` quirk, the reject that lets the turn go on comes before the one
        that aborts it (services take the first option of the kind they want). ``options``
        itself when nothing moves."""
        if not self.has("reject-continues"):
            return options
        ids = [o.option_id for o in options]
        aborting = [i for i, option_id in enumerate(ids) if option_id in _ABORTING_REJECTS]
        going_on = [i for i, option_id in enumerate(ids) if option_id in _CONTINUING_REJECTS]
        if not aborting or not going_on or going_on[0] < aborting[0]:
            return options
        moved = [options[i] for i in going_on]
        rest = [o for i, o in enumerate(options) if i not in going_on]
        at = rest.index(options[aborting[0]])
        return rest[:at] + moved + rest[at:]


NO_QUIRKS = AppliedQuirks()


def quirks_for(info: t.Implementation | None) -> AppliedQuirks:
    """The quirks of the agent that reported ``info`` in ``initialize``."""
    if info is None:
        return NO_QUIRKS
    matched = tuple(q for q in QUIRKS if q.matches(info))
    return AppliedQuirks(matched) if matched else NO_QUIRKS


def known_agent_quirks(name: str) -> tuple[Quirk, ...]:
    """The quirks of the known agent ``name`` (``gemini``), for listings."""
    return tuple(q for q in QUIRKS if q.known_as == name)


def usage_from_quota(meta: Mapping[str, Any] | None) -> t.Usage | None:
    """The token counts of a prompt response's ``_meta.quota.token_count``, or None when it
    holds none (or not as integers)."""
    quota = meta.get("quota") if isinstance(meta, Mapping) else None
    counts = quota.get("token_count") if isinstance(quota, Mapping) else None
    if not isinstance(counts, Mapping):
        return None
    tokens_in, tokens_out = counts.get("input_tokens"), counts.get("output_tokens")
    if not all(type(n) is int and n >= 0 for n in (tokens_in, tokens_out)):
        return None
    from ..protocol.types import Usage  # heavy module: loaded on first use

    assert isinstance(tokens_in, int) and isinstance(tokens_out, int)
    return Usage(
        total_tokens=tokens_in + tokens_out, input_tokens=tokens_in, output_tokens=tokens_out
    )
