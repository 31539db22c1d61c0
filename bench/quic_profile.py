"""Where the router's CPU per QUIC connection goes: ``python -m bench.quic_profile``.

Runs the ``quic_handshake`` load (2 client processes x 4 aioquic connections at a time, each
a handshake, one stream round trip and a close) against the router alone and prints its CPU
per connection, user and system. ``--callbacks`` splits the main thread's CPU by the router
callback that spent it (thread CPU clock around each one, wrapped by a ``sitecustomize``
written into the scratch directory: the router's code is unchanged); ``--py-spy FILE`` records
a py-spy profile (raw collapsed stacks) of the router meanwhile, ``--perf FILE`` a ``perf record -g`` of
it with ``perf report`` by symbol in ``FILE.txt``, ``--strace FILE`` its system
call counts (deterministic, unlike CPU time on a shared machine); ``--peer nginx`` measures
nginx's worker instead. ``--rounds N`` runs the router, nginx and (``--baseline TREE``) the router
of another source tree side by side, ``--seconds`` each in turn, N times, and prints each one's
median and the medians of the per-round ratios (CPU from the scheduler's nanosecond counts): on a
shared 2-core machine one run's CPU figure moves by +-10%, the ratio of neighbouring runs less.

    python -m bench.quic_profile --rounds 6 --seconds 4 --baseline /tmp/main-tree
    python -m bench.quic_profile --seconds 10 --callbacks
    python -m bench.quic_profile --seconds 10 --py-spy /tmp/hs.txt
    python -m bench.quic_profile --seconds 10 --strace /tmp/hs-syscalls.txt
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import callback_hooks
from bench.context import POD, POD_HOST, SNI
from bench.procs import Agent, Nginx, Router, call_all, cpu_exact, process_tree, router_from
from bench.quic_load import quic_handshakes, start_quic_pod_thread
from router.demo.pki import make_pki

NGINX_ROUND_CONNECTIONS = 16_000
"""nginx's worker_connections in ``--rounds``: 8,000 UDP sessions, ~30 rounds of 4 s of handshakes."""

CALLBACK_HOOKS = '''
    from router.udp import demux, edge, flow_opening, pod_link, pod_to_client, verdicts
    from quic import initial_sniffer
    from quic.packet import long_header_cids

    def client_kind(demuxer, data, addr):
        table = demuxer._table
        if table.flow(addr) is not None:
            return "client datagram, routed flow"
        pending = table.pending(addr, long_header_cids(data)[0])
        return "client datagram, pending flow" if pending else "client datagram, new address"

    hook(demux.ClientDemux, "deliver", "", client_kind)
    hook(getattr(pod_link, "Outboxes", None), "_send", "client datagrams sent to pods (per loop iteration)")
    hook(pod_to_client.ClientReplies, "readable", "pod socket readable: read, send to client")
    hook(edge.UdpRouter, "sweep", "sweep (expiry)")
    # The flow's set-up runs inside the routing decision, inside the new address's datagram.
    hook(flow_opening.FlowOpener, "dial", "    of which: flow setup: socket, link, metrics")
    hook(initial_sniffer.InitialSniffer, "feed", "  of which: InitialSniffer.feed")
    hook(initial_sniffer.InitialSniffer, "_sniff_first", "    of which: sniff_first (C: keys, opening, hello)")
    hook(flow_opening.FlowOpener, "_route", "  of which: routing decision and flow setup")
    hook(demux, "judge", "  of which: judge (verdicts)")
    hook(pod_to_client.ClientReplies, "_send", "  of which: send to client")
    # Names the sniffer and the edge imported: hooked where they are looked up.
    hook(initial_sniffer, "client_initial_keys", "    of which: Initial keys")
    hook(initial_sniffer, "decrypt_initial", "    of which: decrypt_initial")
    hook(initial_sniffer, "parse_client_hello", "    of which: parse_client_hello")
    hook(verdicts, "parse_long_header", "    of which: parse_long_header")
    hook(flow_opening, "connect_udp", "      of which: connect_udp (socket, connect)")
    hook(edge.UdpRouter, "_learn_pod_cid", "pod SCID handed back")
'''
"""The QUIC edge's callbacks timed by ``--callbacks`` (``bench.callback_hooks``)."""


def _cpu_ticks(pid: int) -> tuple[int, int]:
    user = system = 0
    for p in process_tree(pid):
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        user, system = user + int(fields[11]), system + int(fields[12])
    return user, system


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quic_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0, help="measured load (default 10)")
    p.add_argument("--callbacks", action="store_true", help="split the router's CPU by callback")
    p.add_argument("--py-spy", type=Path, help="record a py-spy raw profile of the middle box here")
    p.add_argument("--strace", type=Path, help="count the middle box's system calls (strace -c) into this file")
    p.add_argument("--perf", type=Path, help="perf-record the middle box: FILE.data, and perf report in FILE.txt")
    p.add_argument("--peer", choices=("router", "nginx"), default="router")
    p.add_argument("--rounds", type=int, default=0, help="interleaved rounds of router, nginx (and baseline)")
    p.add_argument("--baseline", type=Path, help="with --rounds: also the router of this source tree")
    args = p.parse_args(argv)
    if args.rounds or args.baseline:
        return _rounds(max(args.rounds, 1), args.seconds, args.baseline)
    with tempfile.TemporaryDirectory(prefix="stargate-qprof-") as tmp:
        workdir = Path(tmp)
        counts = callback_hooks.install(workdir, CALLBACK_HOOKS) if args.callbacks else None
        pki = make_pki(workdir / "pki")
        pod = Agent("quic-pod")
        clients = [Agent(f"quic-client-{i}") for i in range(2)]
        try:
            port = pod.call(start_quic_pod_thread, POD, POD_HOST, str(pki.cert_path), str(pki.key_path))
            box: Router | Nginx
            if args.peer == "router":
                box = router = Router(workdir, [(POD, POD_HOST, 1, port)])
                addr, pid = ("127.0.0.1", router.udp_port), router.pid
            else:
                box = nginx = Nginx(workdir, POD_HOST, port)
                addr, pid = ("127.0.0.1", nginx.port), nginx.pid
            try:
                load = [(addr[0], addr[1], SNI, str(pki.ca_path), 1.0, 4)] * 2
                call_all(clients, quic_handshakes, load)  # warm-up: imports, first flows
                spy = None
                if args.py_spy:
                    spy = subprocess.Popen(["py-spy", "record", "--native", "-r", "500", "-f", "raw", "-o",
                                            str(args.py_spy), "-d", str(int(args.seconds)), "--pid", str(pid)],
                                           stdout=subprocess.DEVNULL)
                    time.sleep(1)
                if args.perf:
                    spy = subprocess.Popen(["perf", "record", "-g", "-F", "2999", "-p", str(pid), "-o",
                                            f"{args.perf}.data"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(1)
                if args.strace:
                    spy = subprocess.Popen(["strace", "-c", "-f", "-o", str(args.strace), "-p", str(pid)],
                                           stderr=subprocess.DEVNULL)
                    time.sleep(1)
                if counts is not None and args.peer == "router":
                    callback_hooks.start(pid)
                user0, sys0 = _cpu_ticks(pid)
                load = [(addr[0], addr[1], SNI, str(pki.ca_path), args.seconds - (1.5 if spy else 0), 4)] * 2
                answers = call_all(clients, quic_handshakes, load)
                user1, sys1 = _cpu_ticks(pid)
                if counts is not None and args.peer == "router":
                    callback_hooks.stop(pid)
                if spy is not None:
                    if args.strace or args.perf:
                        spy.send_signal(signal.SIGINT)
                    spy.wait()
                    if args.perf:
                        report = subprocess.run(["perf", "report", "-i", f"{args.perf}.data", "--no-children",
                                                 "--sort", "dso,sym", "--stdio", "--percent-limit", "0.4"],
                                                capture_output=True, text=True).stdout
                        Path(f"{args.perf}.txt").write_text(report)
            finally:
                box.close()
        finally:
            pod.close()
            for client in clients:
                client.close()
        done, failed = sum(a[0] for a in answers), sum(a[1] for a in answers)
        per = 1e6 / (os.sysconf("SC_CLK_TCK") * max(done, 1))
        print(f"{args.peer}: {done} connections ({failed} failed), CPU per connection "
              f"{(user1 - user0 + sys1 - sys0) * per:.0f} us (user {(user1 - user0) * per:.0f}, "
              f"system {(sys1 - sys0) * per:.0f}); load average {os.getloadavg()[0]:.2f}")
        if counts is not None and args.peer == "router":
            callback_hooks.print_split(json.loads(counts.read_text()), done)
    return 0


def _rounds(rounds: int, seconds: float, baseline: Path | None) -> int:
    """Router, nginx (and the baseline router) in turn, ``seconds`` each, ``rounds`` times."""
    results: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="stargate-qprof-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        pki = make_pki(workdir / "pki")
        pod = Agent("quic-pod")
        stack.callback(pod.close)
        clients = [Agent(f"quic-client-{i}") for i in range(2)]
        for client in clients:
            stack.callback(client.close)
        port = pod.call(start_quic_pod_thread, POD, POD_HOST, str(pki.cert_path), str(pki.key_path))
        rows = [(POD, POD_HOST, 1, port)]
        router = stack.enter_context(router_from(None, workdir, rows))
        boxes = {"router": (router.udp_port, router.pid)}
        if baseline is not None:
            base = stack.enter_context(router_from(baseline.resolve(), workdir, rows))
            boxes["baseline"] = (base.udp_port, base.pid)
        # Two connections per UDP session, kept for proxy_timeout: the default 4,096 run out after
        # ~2,000 handshakes (~8 rounds), and then nginx fails them and logs each datagram.
        nginx = Nginx(workdir, POD_HOST, port, connections=NGINX_ROUND_CONNECTIONS)
        stack.callback(nginx.close)
        boxes["nginx"] = (nginx.port, nginx.pid)
        for udp_port, _ in boxes.values():  # warm-up: imports, first flows
            call_all(clients, quic_handshakes, [("127.0.0.1", udp_port, SNI, str(pki.ca_path), 1.0, 4)] * 2)
        names = list(boxes)
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                udp_port, pid = boxes[name]
                cpu0 = cpu_exact(pid)
                answers = call_all(clients, quic_handshakes,
                                   [("127.0.0.1", udp_port, SNI, str(pki.ca_path), seconds, 4)] * 2)
                cpu1 = cpu_exact(pid)
                done = max(sum(a[0] for a in answers), 1)
                results.setdefault(name, []).append((cpu1 - cpu0) / done * 1e6)
                failed[name] = failed.get(name, 0) + sum(a[1] for a in answers)
    print(f"{rounds} rounds x {seconds:g} s per box, load average {os.getloadavg()[0]:.2f}")
    for name, per_conn in results.items():
        print(f"{name:9s} {statistics.median(per_conn):6.0f} us CPU per connection, {failed[name]} failed (rounds: "
              f"{', '.join(f'{v:.0f}' for v in per_conn)})")
    for name in ("nginx", "baseline"):
        if name in results:
            ratios = [a / b for a, b in zip(results["router"], results[name], strict=True)]
            print(f"router/{name} CPU per connection, median of the rounds: {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
