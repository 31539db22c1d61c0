"""The UDP loads' peers in C (``bench/udp_peers.c``): built here with the machine's C compiler,
run by the pod and client agents (``bench.quic_load`` hands its work to them when given one).

The Python peers spend more CPU per datagram than the middle box, on the same cores, so the
rate they reach says more about them than about the box; these read with ``recvmmsg`` as a QUIC
stack that batches does, and keep each load's send pattern (one datagram per call for the relay
and the download as aioquic does, or a GSO batch as quinn does; a batch per batch read for the
echo). Without a compiler the loads run on the
Python peers and their rows say so.

A flow's clients are QUIC-shaped as in ``bench.quic_load``: each flow's socket is handed over with
its connection ID (``FD:HEX``), the DCID of every short header the client sends on it; the pod
answers each long header (a flow's Initial) as a server would, so the middle box learns it.
"""

from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

SOURCE = Path(__file__).with_name("udp_peers.c")
SPARE_S = 30.0
"""How long past its load a C peer may take to answer before the bench gives up on it."""


def build() -> Path | None:
    """The peers' binary, compiled once per source version into the temporary directory; None
    without a C compiler or if the build fails."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    binary = Path(tempfile.gettempdir()) / f"stargate-bench-udp_peers-{digest}"
    if not binary.exists():
        partial = binary.with_suffix(".partial")
        done = subprocess.run([compiler, "-O2", "-o", str(partial), str(SOURCE)], capture_output=True)
        if done.returncode != 0:
            return None
        partial.rename(binary)
    return binary


def describe(binary: Path | None) -> str:
    """What a row's note says about the peers that made its load."""
    return "C peers (bench/udp_peers.c)" if binary is not None else "Python peers"


Flows = Sequence[tuple[socket.socket, bytes]]
"""Connected flow sockets, each with its connection ID (the DCID of the short headers sent on it)."""


class NativePod:
    """The pod on ``sock`` (which it inherits): counts what it receives and answers each long header
    with it (a flow's Initial, as a server answers one) or, ``echo``, sends every datagram back to
    its source; answers ``stats``, ``forget`` and ``blast`` on stdin."""

    def __init__(self, binary: Path, sock: socket.socket, echo: bool) -> None:
        fd = sock.fileno()
        self._proc = subprocess.Popen([str(binary), "pod", str(fd), str(int(echo))], pass_fds=[fd],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def _ask(self, command: str) -> list[str]:
        stdin, stdout = self._proc.stdin, self._proc.stdout
        if stdin is None or stdout is None:
            raise RuntimeError("the C pod was started without pipes")
        stdin.write(command + "\n")
        return stdout.readline().split()

    def stats(self) -> tuple[int, int, int]:
        """(datagrams, bytes, distinct source addresses) received so far."""
        datagrams, size, sources = (int(x) for x in self._ask("stats"))
        return datagrams, size, sources

    def forget_sources(self) -> None:
        self._ask("forget")

    def blast(self, seconds: float, size: int, segments: int = 1) -> tuple[int, float]:
        """``size``-byte datagrams to every source in turn for ``seconds``, ``segments`` per send
        (more than one: a GSO batch): (sent, elapsed)."""
        sent, elapsed = self._ask(f"blast {seconds} {size} {segments}")
        return int(sent), float(elapsed)

    def close(self) -> None:
        """End of stdin ends the pod (as when its agent exits)."""
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=SPARE_S)


def _run(binary: Path, mode: str, seconds: float, args: list[str], flows: Flows) -> list[str]:
    fds = [sock.fileno() for sock, _cid in flows]
    named = [f"{sock.fileno()}:{cid.hex()}" if cid else str(sock.fileno()) for sock, cid in flows]
    done = subprocess.run([str(binary), mode, f"{seconds}", *args, *named], pass_fds=fds,
                          capture_output=True, text=True, check=True, timeout=seconds + SPARE_S)
    return done.stdout.split()


def echo_window(binary: Path, flows: Flows, seconds: float, size: int, window: int,
                stall_s: float) -> tuple[int, int, float]:
    """The windowed echo on ``flows`` (connected sockets, each with its connection ID): (echoes,
    refills, elapsed), as ``quic_load.udp_echo_window``."""
    echoes, refills, elapsed = _run(binary, "echo", seconds, [str(size), str(window), f"{stall_s * 1000}"], flows)
    return int(echoes), int(refills), float(elapsed)


def count(binary: Path, socks: Sequence[socket.socket], seconds: float) -> int:
    """Datagrams ``socks`` receive within ``seconds``, as ``quic_load.count_flow_datagrams`` (they
    send nothing: no connection ID needed)."""
    return int(_run(binary, "count", seconds, [], [(sock, b"") for sock in socks])[0])


def blast(binary: Path, flows: Flows, seconds: float, size: int, segments: int = 1) -> tuple[int, float]:
    """``segments`` short headers per send (more than one: a GSO batch) on each of ``flows`` in turn,
    each to its connection ID, for ``seconds``: (sent, elapsed), as ``quic_load.udp_blast``."""
    sent, elapsed = _run(binary, "blast", seconds, [str(size), str(segments)], flows)
    return int(sent), float(elapsed)
