"""Bulk throughput of router.tcp.relay on loopback against a direct socket pair (and HAProxy).

    python bench/relay_throughput.py [--mib N] [--repeat R] [--both-ways] [--haproxy PATH]

A sender process writes N MiB, a receiver process reads them; in between sits nothing
(direct), this process running ``relay`` (splice or buffered; default asyncio loop or uvloop),
or, when an ``haproxy`` binary is found, HAProxy with one thread and ``option splice-auto``.
Sender and receiver have processes of their own so the relay gets a core of its own, as in
production. Prints MB/s (10^6 bytes/s, best of R runs), the ratio to direct, and the CPU
seconds the middle box spent per GiB (user+system), which depends less on how many cores the
machine has: on 2 cores the sender and receiver alone saturate the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from router.extensions import choose
from router.tcp.relay import relay

_MIB = 1024 * 1024
_HAPROXY_CFG = """global
    nbthread 1
    maxconn 64
defaults
    mode tcp
    option splice-auto
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend front
    bind 127.0.0.1:{front}
    default_backend pod
backend pod
    server pod 127.0.0.1:{pod}
"""

# A middle box is started with the pod address; it returns the address the sender dials, a
# function run right after 'go' (the relay itself) and one run once both ends are done that
# returns the middle box's CPU seconds.
Started = tuple[tuple[str, int], Callable[[], None], Callable[[], float]]
Middle = Callable[[tuple[str, int]], Started]


def _pump_out(sock: socket.socket, mib: int) -> None:
    block = bytes(range(256)) * (4 * 1024)  # 1 MiB
    for _ in range(mib):
        sock.sendall(block)
    sock.shutdown(socket.SHUT_WR)


def _drain(sock: socket.socket) -> int:
    buf = bytearray(_MIB)
    total = 0
    while n := sock.recv_into(buf):
        total += n
    return total


def _endpoint(sock: socket.socket, mib: int, go: Any, report: Connection) -> None:
    """Send ``mib`` MiB (after 'go') while reading to EOF; report bytes read and the end time."""
    go.wait()
    writer = threading.Thread(target=_pump_out, args=(sock, mib))
    writer.start()
    got = _drain(sock)
    writer.join()
    report.send((got, time.monotonic()))
    sock.close()


def _sender(addr: tuple[str, int], mib: int, go: Any, report: Connection) -> None:
    _endpoint(socket.create_connection(addr), mib, go, report)


def _receiver(listener: socket.socket, mib: int, go: Any, report: Connection) -> None:
    sock, _ = listener.accept()
    listener.close()
    _endpoint(sock, mib, go, report)


def _listener(port: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen(8)
    return sock


def _run_once(mib: int, both: bool, middle: Middle | None) -> tuple[float, float]:
    """One transfer; returns (seconds from 'go' until both ends saw EOF, middle-box CPU seconds)."""
    ctx = mp.get_context("fork")
    go = ctx.Event()
    recv_end, recv_report = ctx.Pipe(duplex=False)
    send_end, send_report = ctx.Pipe(duplex=False)
    pod_listener = _listener()
    pod_addr = pod_listener.getsockname()
    receiver = ctx.Process(target=_receiver, args=(pod_listener, mib if both else 0, go, recv_report))
    receiver.start()
    pod_listener.close()  # the receiver holds its own copy
    front_addr, run_middle, finish_middle = (
        middle(pod_addr) if middle is not None else (pod_addr, lambda: None, lambda: 0.0)
    )
    sender = ctx.Process(target=_sender, args=(front_addr, mib, go, send_report))
    sender.start()
    started = time.monotonic()
    go.set()
    run_middle()
    got_r, end_r = recv_end.recv()
    got_s, end_s = send_end.recv()
    receiver.join()
    sender.join()
    cpu = finish_middle()
    expected = mib * _MIB
    if got_r != expected or got_s != (expected if both else 0):
        raise SystemExit(f"byte count mismatch: receiver {got_r}, sender {got_s}, expected {expected}")
    return max(end_r, end_s) - started, cpu


def _relay_middle(use_splice: bool, loop_kind: str) -> Middle:
    def start(pod_addr: tuple[str, int]) -> Started:
        front = _listener()
        cpu: list[float] = []

        def run() -> None:
            client, _ = front.accept()
            front.close()
            pod = socket.create_connection(pod_addr)
            client.setblocking(False)
            pod.setblocking(False)
            before = resource.getrusage(resource.RUSAGE_SELF)
            # the pump the router would use here (C where built, unless NO_EXTENSIONS_ENV says no)
            coro = relay(client, pod, idle_timeout_s=60.0, use_splice=use_splice, native=choose().tcp_pump)
            if loop_kind == "uvloop":
                import uvloop

                result = uvloop.run(coro)
            else:
                result = asyncio.run(coro)
            after = resource.getrusage(resource.RUSAGE_SELF)
            if result.outcome != "completed":
                raise SystemExit(f"relay ended {result.outcome}: {result.error}")
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)

        return front.getsockname(), run, lambda: cpu[0]

    return start


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _port_taken(port: int) -> bool:
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", port))
    except OSError:
        return True
    finally:
        probe.close()
    return False


def _haproxy_middle(binary: str) -> Middle:
    def start(pod_addr: tuple[str, int]) -> Started:
        probe = _listener()
        port = probe.getsockname()[1]
        probe.close()
        fd, name = tempfile.mkstemp(suffix=".cfg")
        os.close(fd)
        cfg = Path(name)
        cfg.write_text(_HAPROXY_CFG.format(front=port, pod=pod_addr[1]))
        proc = subprocess.Popen([binary, "-db", "-q", "-f", str(cfg)], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 5
        while not _port_taken(port):  # no probe connection: it would reach the receiver
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"haproxy did not start (exit {proc.poll()})")
            time.sleep(0.01)
        cpu_before = _proc_cpu_s(proc.pid)

        def finish() -> float:
            cpu = _proc_cpu_s(proc.pid) - cpu_before
            proc.terminate()
            proc.wait()
            cfg.unlink()
            return cpu

        return ("127.0.0.1", port), lambda: None, finish

    return start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--mib", type=int, default=1024, help="MiB per run and direction (default 1024)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the best counts (default 3)")
    parser.add_argument("--both-ways", action="store_true", help="also stream N MiB pod->client at once")
    parser.add_argument("--haproxy", default=shutil.which("haproxy"), help="haproxy binary (default: PATH)")
    args = parser.parse_args(argv)
    cases: list[tuple[str, Middle | None]] = [("direct", None)]
    for loop_kind in ("asyncio", "uvloop"):
        for use_splice in (True, False):
            name = f"relay {'splice' if use_splice else 'buffered'} {loop_kind}"
            cases.append((name, _relay_middle(use_splice, loop_kind)))
    if args.haproxy:
        cases.append(("haproxy 1 thread splice", _haproxy_middle(args.haproxy)))
    volume = args.mib * _MIB * (2 if args.both_ways else 1)
    direct_rate = 0.0
    print(f"{args.mib} MiB {'each way' if args.both_ways else 'one way'}, best of {args.repeat}, "
          f"{os.cpu_count()} CPUs")
    for name, middle in cases:
        runs = [_run_once(args.mib, args.both_ways, middle) for _ in range(args.repeat)]
        wall, cpu = min(runs)
        rate = volume / wall / 1e6
        direct_rate = direct_rate or rate
        cpu_text = f"{cpu * (1 << 30) / volume:6.3f} CPU s/GiB" if middle is not None else ""
        print(f"{name:<26} {rate:7.0f} MB/s  {rate / direct_rate:5.2f}x direct  {cpu_text}", flush=True)


if __name__ == "__main__":
    main()
