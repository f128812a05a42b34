"""Which cluster a run uses (the option, the environment) and connecting to a loopback one."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
from typing import Any

import pytest

from orchestrator.cluster import _connect
from orchestrator.cluster._connect import (
    CLUSTER_ENV,
    AgentNode,
    ClusterSpec,
    cluster_spec,
    connect,
    import_ray,
)
from orchestrator.cluster._coordinator import Rate
from orchestrator.errors import ClusterError, UsageError


@pytest.mark.parametrize(
    ("value", "address"),
    [
        ("auto", "auto"),
        ("ray:auto", "auto"),
        ("127.0.0.1:6379", "127.0.0.1:6379"),
        ("ray:127.0.0.1:6379", "127.0.0.1:6379"),
        ("head.example.org:6379", "head.example.org:6379"),
        ("ray://head:10001", "ray://head:10001"),
        ("ray:ray://head:10001", "ray://head:10001"),
        ("[::1]:6379", "[::1]:6379"),
    ],
)
def test_cluster_addresses(value: str, address: str) -> None:
    """An address, bare or after ray:, names that cluster."""
    assert cluster_spec(value, environ={}) == ClusterSpec(address)


@pytest.mark.parametrize("value", ["local", "none", "", "LOCAL"])
def test_local_means_no_cluster(value: str) -> None:
    """local, none and the empty value mean this machine."""
    assert cluster_spec(value, environ={CLUSTER_ENV: "auto"}) is None


@pytest.mark.parametrize(
    "value",
    [
        "ray:",
        "head",
        "head:",
        "head:0",
        "head:65536",
        "head:port",
        "head :6379",
        " 127.0.0.1:6379",
        "ray:local",
        "http://head:6379",
        "ray://head",
        "-head:6379",
        "head:6379\n",
    ],
)
def test_bad_addresses(value: str) -> None:
    """Anything else is a usage error of one line naming the value."""
    with pytest.raises(UsageError) as caught:
        cluster_spec(value, environ={})
    message = str(caught.value)
    assert "\n" not in message
    assert repr(value) in message
    assert "--" not in message


def test_environment_names_the_cluster() -> None:
    """No value: the environment variable says, when set and not empty."""
    assert cluster_spec(None, environ={CLUSTER_ENV: "ray:10.0.0.1:6379"}) == ClusterSpec(
        "10.0.0.1:6379"
    )
    assert cluster_spec(None, environ={CLUSTER_ENV: ""}) is None
    assert cluster_spec(None, environ={}) is None
    with pytest.raises(UsageError, match="'nowhere'"):
        cluster_spec(None, environ={CLUSTER_ENV: "nowhere"})


def test_option_wins_over_environment() -> None:
    """A value given is used even when the environment names another cluster."""
    assert cluster_spec("local", environ={CLUSTER_ENV: "auto"}) is None
    assert cluster_spec("h:1", environ={CLUSTER_ENV: "auto"}) == ClusterSpec("h:1")


def test_spec_passes_through_and_checks_itself() -> None:
    """A ClusterSpec given is returned as is; one built with a bad address or rate is refused."""
    spec = ClusterSpec("auto", rates={"claude": Rate(5, 1.0)})
    assert cluster_spec(spec, environ={}) is spec
    with pytest.raises(UsageError, match="not a cluster address"):
        ClusterSpec("no address")
    # a rate's text is parsed; anything else is refused
    assert ClusterSpec("auto", rates={"claude": "5/s"}).rates == {"claude": Rate(5, 1.0)}
    with pytest.raises(UsageError, match="not a rate"):
        ClusterSpec("auto", rates={"claude": 5})  # type: ignore[dict-item]
    assert ClusterSpec("ray:127.0.0.1:6379").address == "127.0.0.1:6379"
    with pytest.raises(UsageError, match="cluster='local'"):
        ClusterSpec("local")


def test_importing_the_module_imports_no_ray() -> None:
    """Importing the connect module (and the cluster package) leaves Ray unimported."""
    code = (
        "import sys, orchestrator.cluster._connect, orchestrator.cluster._coordinator; "
        "sys.exit('ray' in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ray_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Ray, a cluster is refused with how to install it, in one line."""
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ClusterError) as caught:
        import_ray()
    assert str(caught.value) == "Ray is not installed: pip install 'acp-orchestrator[ray]'"
    with pytest.raises(ClusterError, match="not installed"), connect(ClusterSpec("auto")):
        pass


def _connected() -> bool:
    import ray

    return bool(ray.is_initialized())


@pytest.mark.ray
def test_connect_finds_nodes_and_slots(ray_cluster: Any) -> None:
    """Both nodes of the loopback cluster are found with their slots; the end disconnects."""
    with connect(ClusterSpec(ray_cluster.address)) as nodes:
        assert _connected()
        assert nodes == sorted(nodes, key=lambda node: node.node_id)
        assert {node.node_id for node in nodes} == {n.node_id for n in ray_cluster.nodes}
        assert all(node == AgentNode(node.node_id, "127.0.0.1", 2) for node in nodes)
    assert not _connected()


@pytest.mark.ray
def test_second_connect_reuses(ray_cluster: Any) -> None:
    """A connect inside another reuses the connection and leaves it up at its end."""
    with connect(ClusterSpec(ray_cluster.address)) as outer:
        with connect(ClusterSpec(ray_cluster.address)) as inner:
            assert inner == outer
        assert _connected()
    assert not _connected()


@pytest.mark.ray
def test_connect_prints_nothing(ray_cluster: Any, capfd: pytest.CaptureFixture[str]) -> None:
    """Connecting and disconnecting, even from a thread, writes nothing to stdout or stderr."""

    def join() -> None:
        with connect(ClusterSpec(ray_cluster.address)):
            pass

    thread = threading.Thread(target=join)
    thread.start()
    thread.join()
    with connect(ClusterSpec(ray_cluster.address)):
        pass
    assert capfd.readouterr() == ("", "")


@pytest.mark.ray
def test_connect_keeps_signal_handlers(ray_cluster: Any) -> None:
    """ray.init's SIGTERM handler (sys.exit) is taken back: the process's signals stay its own."""
    import signal

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with connect(ClusterSpec(ray_cluster.address)):
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.ray
def test_closed_port_fails_at_once(ray_cluster: Any) -> None:
    """A closed port is one line naming the address, not Ray's minutes of retries."""
    address = f"127.0.0.1:{_closed_port()}"
    caught: list[BaseException] = []

    def join() -> None:
        try:
            with connect(ClusterSpec(address)):
                pass
        except BaseException as e:
            caught.append(e)

    # a thread, so that a regression (Ray retrying for about 14 minutes) fails here instead
    # of hanging the suite
    thread = threading.Thread(target=join, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "connect to a closed port did not fail"
    [error] = caught
    assert isinstance(error, ClusterError)
    assert str(error) == f"cannot reach the Ray cluster at {address}: Connection refused"
    assert not _connected()


@pytest.mark.ray
def test_no_agent_slots(ray_cluster: Any) -> None:
    """A cluster whose nodes offer no agent_slots is refused, saying how to start one."""
    from raycluster import start_cluster, survivors

    with start_cluster(nodes=1, slots=0) as bare:
        with pytest.raises(ClusterError) as caught, connect(ClusterSpec(bare.address)):
            pass
        message = str(caught.value)
        assert "\n" not in message
        assert f"no node of the Ray cluster at {bare.address} offers agent slots" in message
        assert """--resources '{"agent_slots": N}'""" in message
        assert not _connected()
    assert survivors(bare) == []


@pytest.mark.ray
def test_auto_finds_the_cluster(ray_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """auto finds the cluster RAY_ADDRESS names, as Ray does."""
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    with connect(ClusterSpec("auto")) as nodes:
        assert len(nodes) == 2


def _listener(answer: bytes | None) -> tuple[socket.socket, threading.Thread]:
    """A local server that accepts one connection and, unless ``answer`` is None (silent),
    reads a little, sends ``answer`` and closes."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            if answer is None:
                while conn.recv(1024):  # silent until the client gives up and closes
                    pass
                return
            conn.recv(1024)
            conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


@pytest.mark.ray
def test_not_grpc_fails_at_once(ray_cluster: Any) -> None:
    """A port where a web server answers (a dashboard's, say) is refused in one line."""
    server, thread = _listener(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
    address = f"127.0.0.1:{server.getsockname()[1]}"
    with server, pytest.raises(ClusterError) as caught, connect(ClusterSpec(address)):
        pass
    thread.join()
    assert str(caught.value) == (
        f"no Ray cluster at {address}: what answers there does not speak gRPC "
        "(give the address of the head node's GCS, port 6379 unless changed)"
    )
    assert not _connected()


@pytest.mark.ray
def test_silent_port_fails_after_the_timeout(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port that accepts and never answers is refused once the connect timeout passes."""
    monkeypatch.setattr(_connect, "CONNECT_TIMEOUT", 0.2)
    server, thread = _listener(None)
    address = f"127.0.0.1:{server.getsockname()[1]}"
    with server, pytest.raises(ClusterError) as caught, connect(ClusterSpec(address)):
        pass
    thread.join()
    assert str(caught.value) == f"cannot reach the Ray cluster at {address}: no answer in 0.2 s"
    assert not _connected()


class _Waiter(logging.Handler):
    """Notes the records that mention ``text``; ``seen`` is set at the first."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


@pytest.mark.ray
def test_lost_node_reported_to_logging_not_stdout(
    ray_cluster: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """A node lost while connected: Ray's news of it goes to logging, never to stdout or
    stderr; once it is marked dead, connect finds the nodes left."""
    node = ray_cluster.add_node(1)
    waiter = _Waiter(f"{node.node_id} and address")  # "The node with node id: ... marked dead"
    logger = logging.getLogger("ray")
    # ray.init clears the handlers of its logger: this one is added once connected
    with connect(ClusterSpec(ray_cluster.address)) as nodes:
        logger.addHandler(waiter)
        try:
            assert sorted(n.slots for n in nodes) == [1, 2, 2]
            ray_cluster.remove_node(node)
            assert waiter.seen.wait(120), "the node was never reported lost"
            with connect(ClusterSpec(ray_cluster.address)) as left:
                assert {n.node_id for n in left} == {n.node_id for n in ray_cluster.nodes}
                assert len(left) == 2
        finally:
            logger.removeHandler(waiter)
    assert capfd.readouterr() == ("", "")
