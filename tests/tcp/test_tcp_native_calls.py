"""The fast path's accept and dial in C (``router.tcp._relay``) on real loopback sockets.

``dial`` must hand back what ``router.tcp.dial.start_dial`` gives (a non-blocking, TCP_NODELAY
socket connecting to the pod, and whether the handshake is done already) as a bare fd; ``accept``
what the acceptor's ``socket.accept`` gave (non-blocking here, and the peer's address). Both fail
the way the kernel says and never leak an fd. Loopback only: IPv4 127.0.0.x and IPv6 ::1.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket

import pytest

from router.extensions import TCP_PUMP_MODULE, is_built
from tests.support.tcp_peers import SynDroppingPod

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(not is_built(TCP_PUMP_MODULE), reason="the C relay router.tcp._relay is not built"),
]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_loopback_dial_is_connected_at_once_nonblocking_nodelay_and_close_on_exec() -> None:
    from router.tcp._relay import dial

    with socket.create_server(("127.0.0.2", 0)) as listener:
        port = listener.getsockname()[1]
        fd, connected = dial("127.0.0.2", port)
        assert connected
        pod = socket.socket(fileno=fd)
        with pod:
            assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
            assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
            assert pod.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert pod.getpeername() == ("127.0.0.2", port)
            accepted, _ = listener.accept()
            with accepted:
                pod.send(b"ping")
                assert accepted.recv(4) == b"ping"


def test_an_ipv6_literal_is_dialled() -> None:
    from router.tcp._relay import dial

    try:
        listener = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with listener:
        fd, connected = dial("::1", listener.getsockname()[1])
        os.close(fd)
        assert connected


def test_a_refused_dial_raises_the_kernels_error_and_leaks_no_fd() -> None:
    from router.tcp._relay import dial

    with socket.create_server(("127.0.0.2", 0)) as closed:
        port = closed.getsockname()[1]
    before = open_fds()
    with pytest.raises(OSError) as raised:
        dial("127.0.0.2", port)
    assert raised.value.errno == errno.ECONNREFUSED
    assert open_fds() == before


def test_a_dial_whose_syn_is_dropped_is_in_progress() -> None:
    """The pod's accept queue is full: no answer yet, so not connected (the pump waits for it)."""
    from router.tcp._relay import dial

    pod = SynDroppingPod("127.0.0.2")
    try:
        fd, connected = dial("127.0.0.2", pod.port)
        os.close(fd)
        assert not connected
    finally:
        pod.close()


@pytest.mark.parametrize(("address", "port"), [
    ("stargate-0.stargate.svc", 50051),  # a name: the caller falls back to the resolver
    ("127.0.0.2%eth0", 50051),
    ("", 50051),
    ("127.0.0.2", 65536),
    ("127.0.0.2", -1),
])
def test_what_is_no_ip_literal_or_port_is_a_value_error_before_any_socket(address: str, port: int) -> None:
    from router.tcp._relay import dial

    before = open_fds()
    with pytest.raises(ValueError):
        dial(address, port)
    assert open_fds() == before


def test_accept_hands_over_a_bounded_batch_of_nonblocking_fds_with_their_peers() -> None:
    from router.tcp._relay import accept

    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        clients = [socket.create_connection(listener.getsockname()) for _ in range(3)]
        try:
            first, error = accept(listener.fileno(), 2)
            rest, rest_error = accept(listener.fileno(), 64)
            assert (len(first), error, len(rest), rest_error) == (2, 0, 1, 0)
            assert accept(listener.fileno(), 64) == ([], 0)  # the queue is empty
            peers = {client.getsockname() for client in clients}
            for fd, host, port in first + rest:
                assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
                assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
                assert (host, port) in peers
                os.close(fd)
        finally:
            for client in clients:
                client.close()


def test_accept_names_an_ipv6_peer_as_text() -> None:
    from router.tcp._relay import accept

    try:
        listener = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with listener, socket.create_connection(listener.getsockname()[:2]) as client:
        listener.setblocking(False)
        [(fd, host, port)], error = accept(listener.fileno(), 4)
        os.close(fd)
        assert (host, port, error) == ("::1", client.getsockname()[1], 0)


def test_accept_returns_what_stopped_it_instead_of_raising() -> None:
    """Out of fds (EMFILE) with a connection queued: the batch so far and the errno, which the
    acceptor turns into a pause (tests/faults has the router's side of it)."""
    import resource

    from router.tcp._relay import accept

    with socket.create_server(("127.0.0.1", 0)) as listener, \
            socket.create_connection(listener.getsockname()):
        listener.setblocking(False)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lowest_free = os.dup(0)  # the fd number accept4 would take
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no fd left to accept into
        try:
            assert accept(listener.fileno(), 4) == ([], errno.EMFILE)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        [(fd, _host, _port)], error = accept(listener.fileno(), 4)  # still queued: taken now
        os.close(fd)
        assert error == 0
    assert accept(-1, 4) == ([], errno.EBADF)
