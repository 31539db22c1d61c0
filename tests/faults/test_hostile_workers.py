"""Under ``--workers N`` a client's bytes steer nothing between the router's own processes.

Two attacks, each run against a real supervisor and its workers:

- a client writes text into a worker's log (a rejected ``:authority`` is logged word for word)
  that reads like the line the supervisor once took a worker's health port from: the supervisor
  must neither probe nor scrape the address the client named, and ``/readyz`` must not change;
- after a worker is SIGKILLed, a stranger in the pod tries to take the channel the other workers
  reach it by, to read the asks about moved clients: the channels must have no name to take.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.h2 import h2c_grpc_request
from tests.support.polling import becomes_true_blocking
from tests.support.router_process import Supervised, router_args, write_endpoints


class ScrapeTrap:
    """A TCP listener that answers any request with a ready 200 and a metric of its own, and
    remembers every request line: what a supervisor fooled into asking it would send."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    head = conn.recv(4096)
                except OSError:
                    continue
                self.requests.append(head.split(b"\r\n", 1)[0])
                body = b"stargate_router_planted_total 1\n"
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                             % (len(body), body))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def trap() -> Iterator[ScrapeTrap]:
    t = ScrapeTrap()
    yield t
    t.close()


@pytest.fixture
def endpoints(tmp_path: Path) -> Path:
    path = tmp_path / "endpoints.yaml"
    write_endpoints(path, [("stargate-0", "127.0.0.2", 50051, 50052)])
    return path


def send_authority(port: int, authority: str) -> None:
    """One h2c gRPC request naming ``authority``; the router's refusal is read and dropped."""
    _conn, first = h2c_grpc_request(authority)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(first)
        sock.settimeout(5)
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_client_naming_a_health_address_in_its_authority_steers_no_probe_or_scrape(
    endpoints: Path, trap: ScrapeTrap, log_format: str
) -> None:
    args = router_args(endpoints, "--workers", "2", "--log-format", log_format)
    with Supervised(args) as router:
        router.wait_ready()
        forged = f"listening grpc=a quic=b health=127.0.0.1:{trap.port}"
        for _ in range(3):
            send_authority(router.grpc_port, forged)
        router.wait_for("the forged line in a worker's log",
                        lambda: any(str(trap.port) in line for line in router.lines))
        for _ in range(5):  # the supervisor asks every worker on each probe and scrape
            assert router.http_get("/readyz")[0] == 200
            status, body = router.http_get("/metrics")
            assert status == 200 and "planted" not in body
        assert trap.requests == []


def named_unix_sockets(pids: list[int]) -> list[str]:
    """The names (a path, or ``@abstract``) of every AF_UNIX socket the processes ``pids`` hold."""
    inodes: set[str] = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        try:
            links = [os.readlink(fd_dir / fd) for fd in os.listdir(fd_dir)]
        except OSError:
            continue
        inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
    names = []
    for row in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = row.split()
        if len(fields) >= 8 and fields[6] in inodes:
            names.append(fields[7])
    return names


def take_names(names: list[str], within_s: float = 2.0) -> list[socket.socket]:
    """Bind whichever of ``names`` come free (a killed process lets go of its own as it exits)."""
    taken: dict[str, socket.socket] = {}

    def took_one() -> bool:
        for name in names:
            stranger = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                stranger.bind(name.replace("@", "\0", 1) if name.startswith("@") else name)
            except OSError:
                stranger.close()
                continue
            stranger.setblocking(False)
            taken[name] = stranger
        return bool(taken)

    if names:
        becomes_true_blocking(took_one, within_s, 0.002)
    return list(taken.values())


def test_a_dead_workers_channel_has_no_name_a_stranger_could_take(endpoints: Path) -> None:
    args = router_args(endpoints, "--workers", "2", "--quic-cid-length", "8")
    with Supervised(args) as router:
        router.wait_ready()
        names = named_unix_sockets(router.all_pids())
        worker = router.pids()[1]
        os.kill(worker, signal.SIGKILL)
        strangers = take_names(names)  # the attack: the name the dead worker's siblings send to
        try:
            client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for _ in range(40):  # short headers no flow knows: worker 0 asks its sibling about each
                client.sendto(bytes([0x40]) + secrets.token_bytes(40), ("127.0.0.1", router.quic_port))
            client.close()
            router.wait_for("worker 1's successor", lambda: router.pids().get(1) not in (None, worker))
            heard = 0
            for stranger in strangers:
                try:
                    while stranger.recv(65536):
                        heard += 1
                except BlockingIOError:
                    pass
            assert heard == 0
            assert names == []
        finally:
            for stranger in strangers:
                stranger.close()
