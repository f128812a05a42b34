"""The permission requests a run's default policy rejected because it was given no policy.

With no policy (none given to the run, none named by its steps or agents) every permission
request, and every terminal command the policy vets, is answered by the ``default`` rule:
rejected. An agent that asked to edit then changes nothing, and its run still succeeds. A run
counts those rejections (:class:`DefaultRejections`, the result's ``defaultRejections``), so
that whoever reads the result is told why nothing happened.

A policy that was given and whose rules decide nothing rejects under a rule named after it
(``run/rules.toml: default``): that policy says what it means, and is not counted. A resumed
run reuses the instances an earlier attempt finished, with their recorded decisions: their
rejections are counted apart, as a policy given to the resume cannot change them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .._rejections import DefaultRejections
from ..policy import DEFAULT_RULE

__all__ = ["DefaultRejections", "count_default_rejections"]


def count_default_rejections(
    records: Iterable[Mapping[str, Any]],
    options: Mapping[str, Any],
    started: Mapping[str, float] | None = None,
) -> DefaultRejections:
    """The rejections by the ``default`` rule among a run's audit ``records`` (as the run store
    keeps them, each with its ``stepKey``) that no policy was given for.

    ``options`` are the run's recorded options: ``policy`` is how the run's policy was given
    (None: not at all), ``attempt`` when its latest resume started and with which policy,
    ``graph`` names the policies its steps name and ``settings.agents`` those its agents name.
    ``started`` is when each instance (by step key) last started: an instance that started
    before the latest resume was reused by it, and the records of an instance older than its
    last start are of an attempt that was run again (not counted).
    """
    graph = options.get("graph") or {}
    steps = {n.get("name") for n in graph.get("nodes") or () if n.get("policy")}
    settings = options.get("settings") or {}
    agents = {k for k, spec in (settings.get("agents") or {}).items() if spec.get("policy")}
    attempt = options.get("attempt") or {}
    since = attempt.get("started")
    first_policy = options.get("policy")
    latest_policy = attempt.get("policy") if "started" in attempt else first_policy
    counts: dict[str, int] = {}
    reused = 0
    began = started or {}
    for r in records:
        if r.get("rule") != DEFAULT_RULE or r.get("verdict") != "reject":
            continue
        key = str(r.get("stepKey") or r.get("step") or "")
        when = float(r.get("time") or 0)
        last = began.get(key)
        if last is not None and when < last:
            continue
        # runs recorded before a given policy's own end had a name of its own said
        # ``default`` for it too: a request of a step, an agent or a run given a policy is
        # never counted
        if r.get("step") in steps or r.get("agent") in agents:
            continue
        earlier = isinstance(since, int | float) and when < since
        if (first_policy if earlier else latest_policy) is not None:
            continue
        counts[key] = counts.get(key, 0) + 1
        reused += earlier
    scoped = bool(counts) and bool(steps or agents)
    return DefaultRejections(sum(counts.values()), counts, reused, scoped)
