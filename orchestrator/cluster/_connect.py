"""Which cluster a run uses, and connecting the driver to it.

A run on one machine is the default; a cluster is asked for with an address (the ``cluster``
option, or the :data:`CLUSTER_ENV` environment variable): ``ray:ADDRESS`` or ``ADDRESS``, where
``ADDRESS`` is ``auto`` (the cluster this machine belongs to), ``HOST:PORT`` (a head node's GCS)
or ``ray://HOST:PORT`` (Ray Client). :func:`cluster_spec` reads it; :func:`connect` joins the
cluster and finds its nodes that offer agent slots.

Importing this module imports no Ray: :func:`import_ray` does, when a run asks for a cluster.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import re
import signal
import socket
import threading
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

from attrs import field, frozen

from ..errors import ClusterError, UsageError
from ._coordinator import Rate, parse_rate

__all__ = [
    "AGENT_SLOTS",
    "CLUSTER_ENV",
    "CONNECT_TIMEOUT",
    "NAMESPACE",
    "AgentNode",
    "ClusterSpec",
    "cluster_spec",
    "connect",
    "import_ray",
]

#: the environment variable that names a cluster when the option does not
CLUSTER_ENV = "ORCHESTRATOR_CLUSTER"
#: the custom resource a node offers agents with (``--resources '{"agent_slots": N}'``)
AGENT_SLOTS = "agent_slots"
#: the Ray namespace of the orchestrator's actors
NAMESPACE = "acp-orchestrator"
#: seconds to reach a cluster's address before saying it cannot be reached: Ray itself retries
#: a closed port for minutes (20 attempts of over 30 s each with Ray 2.60)
CONNECT_TIMEOUT = 10.0

#: the values that mean "no cluster: this machine"
_LOCAL = ("", "local", "none")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#: a host name, an IPv4 address or an IPv6 address in brackets
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])"
_ADDRESS = re.compile(rf"(?:ray://)?({_HOST}):(\d{{1,5}})")


def _check_address(address: str, value: object) -> None:
    """Raise :class:`UsageError` naming ``value`` unless ``address`` is one Ray takes."""
    if address == "auto":
        return
    match = _ADDRESS.fullmatch(address)
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        raise UsageError(
            f"not a cluster address: {value!r} (write auto, HOST:PORT or ray://HOST:PORT, "
            "optionally after ray:; or local for this machine)"
        )


def _unprefixed(address: str) -> str:
    """``address`` without a ``ray:`` prefix (``ray://`` is Ray Client's scheme: kept)."""
    if isinstance(address, str) and address.startswith("ray:") and not address.startswith("ray://"):
        return address[len("ray:") :]
    return address


def _rates(rates: Mapping[str, Rate | str]) -> dict[str, Rate]:
    """``rates`` with rate texts (``"30/m"``) parsed."""
    if not isinstance(rates, Mapping):
        raise UsageError(f"rates must be a mapping of agent to rate, not {rates!r}")
    return {k: parse_rate(v) if isinstance(v, str) else v for k, v in rates.items()}


@frozen
class ClusterSpec:
    """A cluster to run on: the address :func:`connect` gives Ray, and request-rate limits."""

    #: what ``ray.init`` gets: ``auto``, ``127.0.0.1:6379``, ``ray://host:10001`` (given as
    #: ``ray:127.0.0.1:6379``, the prefix is dropped)
    address: str = field(converter=_unprefixed)
    #: request-rate limits by agent (see :class:`~._coordinator.Coordinator.take`): a
    #: :class:`Rate` or its text (``"30/m"``)
    rates: Mapping[str, Rate] = field(factory=dict, hash=False, converter=_rates)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.address, str):
            raise UsageError(f"not a cluster address: {self.address!r}")
        if self.address.lower() in _LOCAL:
            raise UsageError(
                f"a ClusterSpec names a cluster, not {self.address!r}: for this machine give "
                "cluster='local' (or None)"
            )
        _check_address(self.address, self.address)
        for agent, rate in self.rates.items():
            if not isinstance(rate, Rate):
                raise UsageError(f"the rate of {agent!r} is not a rate: {rate!r}")


def cluster_spec(
    value: str | ClusterSpec | None, *, environ: Mapping[str, str] = os.environ
) -> ClusterSpec | None:
    """The cluster ``value`` names, or None for this machine.

    None: the value of :data:`CLUSTER_ENV` in ``environ`` if it is set and not empty, else
    this machine. ``ray:ADDRESS`` or ``ADDRESS`` (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``):
    that cluster. ``local``, ``none`` or empty: this machine. Anything else: :class:`UsageError`
    naming the value."""
    if isinstance(value, ClusterSpec):
        return value
    if value is None:
        value = environ.get(CLUSTER_ENV) or None
        if value is None:
            return None
    if not isinstance(value, str):
        raise UsageError(f"not a cluster address: {value!r}")
    if value.lower() in _LOCAL:
        return None
    ray_client = value.startswith("ray://")
    address = value[len("ray:") :] if value.startswith("ray:") and not ray_client else value
    if not address:
        raise UsageError(f"not a cluster address: {value!r} (nothing after ray:)")
    _check_address(address, value)
    return ClusterSpec(address)


def import_ray() -> ModuleType:
    """The ``ray`` module, imported now; :class:`ClusterError` when it is not installed."""
    try:
        import ray
    except ImportError as e:
        raise ClusterError("Ray is not installed: pip install 'acp-orchestrator[ray]'") from e
    return ray


@frozen
class AgentNode:
    """A node of the cluster that offers agent slots."""

    #: Ray's node id (hex)
    node_id: str
    #: the node's IP address
    address: str
    #: how many agents it runs at once (its ``agent_slots`` resource)
    slots: int


def _bootstrap(ray: ModuleType, address: str) -> tuple[str, int] | None:
    """The host and port Ray will dial for ``address`` (``auto`` is looked up as Ray does:
    ``RAY_ADDRESS``, a GCS running on this machine, the cluster it last started); None when Ray's
    lookup fails (``ray.init`` then says why). :class:`ClusterError` when ``auto`` finds none."""
    if address == "auto":
        try:
            from ray._private import services

            found = services.canonicalize_bootstrap_address(address)
        except Exception:  # Ray's own lookup failing: ray.init reports it
            return None
        if not found:
            raise ClusterError(
                "no Ray cluster found for address auto: none runs on this machine "
                "(ray start) and RAY_ADDRESS is not set"
            )
        address = found
    address = address.removeprefix("ray://")
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


#: what an HTTP/2 client sends first (RFC 9113 3.4), then an empty SETTINGS frame
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
#: the type of a SETTINGS frame, the first frame a server sends
_SETTINGS = 4


def _probe(host: str, port: int, address: str) -> None:
    """Raise :class:`ClusterError` unless ``host:port`` answers as a gRPC server does (a Ray
    GCS or Ray Client server) within :data:`CONNECT_TIMEOUT`: given a closed port, or one
    where something else listens (a dashboard's address, say), Ray retries for minutes.

    The check is HTTP/2's: a server answers a client's preface with a SETTINGS frame. It is
    skipped when Ray uses TLS (``RAY_USE_TLS``), where the handshake comes first."""
    tls = os.environ.get("RAY_USE_TLS", "0").lower() not in ("0", "false", "")
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT) as conn:
            if tls:
                return
            conn.settimeout(CONNECT_TIMEOUT)
            conn.sendall(_PREFACE)
            header = b""
            while len(header) < 9:
                chunk = conn.recv(9 - len(header))
                if not chunk:
                    break
                header += chunk
    except TimeoutError as e:
        raise ClusterError(
            f"cannot reach the Ray cluster at {address}: no answer in {CONNECT_TIMEOUT:g} s"
        ) from e
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {reason}") from e
    if len(header) < 9 or header[3] != _SETTINGS:
        raise ClusterError(
            f"no Ray cluster at {address}: what answers there does not speak gRPC "
            "(give the address of the head node's GCS, port 6379 unless changed)"
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _library_logging() -> None:
    """Send the ``ray`` logger's records to the application's logging, not to stderr:
    importing ray gives it a handler that prints to stderr, and a library prints nothing. Its
    records then propagate as any library's do; the NullHandler keeps Python's last-resort
    handler (which prints warnings to stderr) out when the application configured none."""
    logger = logging.getLogger("ray")
    for handler in list(logger.handlers):
        if isinstance(handler, logging.StreamHandler) and not isinstance(
            handler, logging.FileHandler
        ):
            logger.removeHandler(handler)
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
    logger.propagate = True


class _UnlessHandled(logging.Filter):
    """Drops a record when the application has no logging handler (as a NullHandler would)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return logging.getLogger().hasHandlers()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Ray's logging kept off stderr around ``ray.init``: it clears the ``ray`` logger's
    handlers (``configure_logging=False``) and then may warn (when called outside the main
    thread), which would reach the last-resort handler; the filter on the module that warns
    covers that span."""
    _library_logging()
    worker = logging.getLogger("ray._private.worker")
    unless = _UnlessHandled()
    worker.addFilter(unless)
    try:
        yield
    finally:
        worker.removeFilter(unless)
        _library_logging()


@contextlib.contextmanager
def _errors_to_logging() -> Iterator[None]:
    """The cluster's error messages (a node that died, a worker killed) go to the ``ray``
    logger, as warnings, while connected: a thread of Ray's driver prints them to stdout
    otherwise (even with ``log_to_driver=False``), into a CLI's ``--json`` output. The thread
    looks the printing function up at each message; a Ray without it is left as it is."""
    try:
        from ray._private import worker
    except ImportError:  # pragma: no cover - another Ray layout
        yield
        return
    original = getattr(worker, "print_to_stdstream", None)
    if original is None:  # pragma: no cover - another Ray layout
        yield
        return
    logger = logging.getLogger("ray")

    def to_logging(data: dict[str, Any], ignore_prefix: bool) -> None:
        for line in data.get("lines") or ():
            logger.warning("(%s) %s", data.get("pid"), line)

    worker.print_to_stdstream = to_logging
    try:
        yield
    finally:
        worker.print_to_stdstream = original


def _agent_nodes(ray: ModuleType) -> list[AgentNode]:
    nodes: list[AgentNode] = []
    for info in ray.nodes():
        resources: dict[str, Any] = info.get("Resources") or {}
        slots = int(resources.get(AGENT_SLOTS, 0))
        if info.get("Alive") and slots > 0:
            nodes.append(AgentNode(info["NodeID"], info.get("NodeManagerAddress", ""), slots))
    return sorted(nodes, key=lambda node: node.node_id)


@contextlib.contextmanager
def connect(spec: ClusterSpec) -> Iterator[list[AgentNode]]:
    """Join the cluster ``spec`` names, for the block: yields its live nodes that offer agent
    slots (sorted by node id).

    A driver already connected (``ray.is_initialized()``) is reused and left connected;
    otherwise this connects (namespace :data:`NAMESPACE`, nothing of the workers' output sent
    to this process) and disconnects at the end. :class:`ClusterError` (one line) when Ray is
    not installed, the address cannot be reached (within :data:`CONNECT_TIMEOUT` seconds, where
    Ray would retry for minutes) or no node offers ``agent_slots``.
    Blocks: call it from a thread in async code."""
    ray = import_ray()
    initialized = False
    if not ray.is_initialized():
        target = _bootstrap(ray, spec.address)
        if target is not None:
            _probe(*target, spec.address)
        main = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if main else None
        tracebacks = faulthandler.is_enabled()
        try:
            with _quiet():
                ray.init(
                    address=spec.address,
                    namespace=NAMESPACE,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                    configure_logging=False,
                )
        except BaseException as e:
            # whatever ray.init set up before failing (or being interrupted) is undone
            with contextlib.suppress(Exception):
                ray.shutdown()
            if not isinstance(e, Exception):
                raise
            raise ClusterError(
                f"cannot connect to the Ray cluster at {spec.address}: {_first_line(e)}"
            ) from e
        finally:
            # ray.init makes SIGTERM exit the process (sys.exit from any point of the main
            # thread, trio's loop included) and turns on faulthandler: the process's signals
            # are its own, so both go back as they were
            if sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)
            if not tracebacks and faulthandler.is_enabled():
                faulthandler.disable()
        initialized = True
    with contextlib.ExitStack() as stack:
        if initialized:  # shut down first, then the printing is Ray's again
            stack.enter_context(_errors_to_logging())
            stack.callback(ray.shutdown)
        nodes = _agent_nodes(ray)
        if not nodes:
            raise ClusterError(
                f"no node of the Ray cluster at {spec.address} offers agent slots: start "
                f"nodes with ray start --resources '{{\"{AGENT_SLOTS}\": N}}' (N agents at once)"
            )
        yield nodes
