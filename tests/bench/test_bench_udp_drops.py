"""``bench.procs.udp_drops``: what ``bench.udp_profile`` reports as each box's and the pod's losses.

Checked against the kernel itself: a socket whose receive buffer is full drops what else comes,
and those drops must show up for this process (and only for sockets this process holds).
"""

from __future__ import annotations

import os
import socket

from bench.procs import udp_drops

SENT = 400
"""Far more 1,200-byte datagrams than a 4 KiB receive buffer (the kernel's floor) can hold."""


def test_drops_at_a_full_receive_buffer_are_counted_for_the_process_holding_the_socket() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sink.bind(("127.0.0.1", 0))
        before = udp_drops(os.getpid())
        for _ in range(SENT):
            sender.sendto(bytes(1200), sink.getsockname())
        held = 0
        sink.setblocking(False)
        try:
            while True:
                sink.recv(2048)
                held += 1
        except BlockingIOError:
            pass
        dropped = udp_drops(os.getpid()) - before
    assert held > 0
    assert dropped == SENT - held


def test_a_process_that_is_gone_has_no_drops_and_no_error() -> None:
    assert udp_drops(1 << 22) == 0  # at or above Linux's highest pid_max: no such process
