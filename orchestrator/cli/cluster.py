"""The cluster options of ``run``, ``compare``, ``batch`` and ``resume``.

Imported by the parser: it must not import trio, attrs or Ray (see tests/test_startup.py); the
cluster's own modules are imported when a command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

CLUSTER_HELP = (
    "run the agent steps on a Ray cluster: ray:HOST:PORT, HOST:PORT, ray://HOST:PORT or auto "
    "(default: $ORCHESTRATOR_CLUSTER; 'local': this machine). Needs acp-orchestrator[ray]"
)
RATE_HELP = (
    "at most N prompts to AGENT per period across the cluster (N/s, N/m, N/h, N/10s); "
    "repeatable; needs a cluster"
)


def add_cluster_options(p: argparse.ArgumentParser | Any) -> None:
    """``--cluster ADDRESS`` and ``--rate AGENT=N/PERIOD``."""
    p.add_argument("--cluster", metavar="ADDRESS", help=CLUSTER_HELP)
    p.add_argument("--rate", action="append", default=[], metavar="AGENT=N/PERIOD", help=RATE_HELP)


def cluster_option(args: argparse.Namespace) -> Any:
    """The cluster the command's options (or ``$ORCHESTRATOR_CLUSTER``) name, with its rates:
    a :class:`~orchestrator.cluster.ClusterSpec`, or ``"local"`` for this machine."""
    import attrs

    from ..cluster._connect import cluster_spec
    from ..cluster._coordinator import parse_rate
    from ..errors import UsageError

    spec = cluster_spec(args.cluster)
    rates = {}
    for text in args.rate:
        agent, sep, rate = text.partition("=")
        if not sep or not agent.strip():
            raise UsageError(f"--rate {text!r}: expected AGENT=N/PERIOD, such as claude=30/m")
        try:
            rates[agent.strip()] = parse_rate(rate.strip())
        except UsageError as e:
            raise UsageError(f"--rate {text!r}: {e}") from None
    if rates:
        if spec is None:
            raise UsageError("--rate limits prompts across a cluster: it needs --cluster")
        spec = attrs.evolve(spec, rates={**spec.rates, **rates})
    # this machine, decided here (the environment variable read once): the library must not
    # read it again
    return spec if spec is not None else "local"
