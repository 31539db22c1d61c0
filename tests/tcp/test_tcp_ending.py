"""Who ended a relay: the TCP state of a reset socket, then errno and direction, decide."""

from __future__ import annotations

import errno
import socket
import struct

import pytest

from router.outcomes import Termination
from router.tcp.ending import TCP_CLOSE, closed_termination, failure_termination, tcp_state
from tests.support.polling import eventually_blocking

ESTABLISHED = 1


def test_the_first_end_of_stream_names_who_closed() -> None:
    assert closed_termination("client") is Termination.CLIENT_CLOSE
    assert closed_termination("pod") is Termination.POD_CLOSE


@pytest.mark.parametrize(
    ("client_state", "pod_state", "reading", "writing", "want"),
    [
        (TCP_CLOSE, ESTABLISHED, "pod", "client", Termination.CLIENT_RESET),  # write to a reset client
        (ESTABLISHED, TCP_CLOSE, "client", "pod", Termination.POD_RESET),
        (None, None, "pod", "client", Termination.POD_RESET),  # no TCP_INFO: ECONNRESET is the read side
        (TCP_CLOSE, TCP_CLOSE, "client", "pod", Termination.CLIENT_RESET),
    ],
)
def test_a_reset_is_blamed_on_the_socket_that_was_reset(
    client_state: int | None, pod_state: int | None, reading: str, writing: str, want: Termination,
) -> None:
    exc = ConnectionResetError(errno.ECONNRESET, "reset")
    assert failure_termination(exc, client_state, pod_state, reading, writing) is want  # type: ignore[arg-type]


def test_epipe_without_states_is_the_written_side_and_other_errors_are_the_routers() -> None:
    assert failure_termination(BrokenPipeError(errno.EPIPE, "pipe"), None, None, "client", "pod") is (
        Termination.POD_RESET)
    assert failure_termination(OSError(errno.ENOMEM, "nomem"), None, None, "client", "pod") is (
        Termination.ROUTER_ERROR)
    assert failure_termination(RuntimeError("bug"), None, None, "client", "pod") is Termination.ROUTER_ERROR


def test_a_socket_that_received_a_reset_is_in_tcp_close() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        assert tcp_state(client) == ESTABLISHED
        accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        accepted.close()
        eventually_blocking(lambda: tcp_state(client) == TCP_CLOSE, interval_s=0.01, what="the reset to arrive")
        client.close()
        assert tcp_state(client) is None
