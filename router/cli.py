"""``stargate-router``: run the router (flags as the Rust router's) or one of its subcommands.

Adding a subcommand is one entry in ``SUBCOMMANDS``: ``--help`` lists it and ``NAME --help`` describes it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from router.config import RouterConfig, build_parser, config_from_args
from router.flag_values import CONFIG_ERROR_PREFIX, CONFIG_ERROR_STATUS, ConfigError
from router.worker_seat import WorkerReport, WorkerSeat, report, seat_from_environ


@dataclass(frozen=True, slots=True)
class Subcommand:
    """One ``stargate-router NAME`` command."""

    summary: str
    """One line in ``stargate-router --help``."""
    description: str
    """What ``stargate-router NAME --help`` says the command does."""
    run: Callable[[argparse.ArgumentParser, list[str]], int]
    """``(parser named and described, arguments after NAME) -> exit status``; imports its module lazily,
    so the router starts light."""


def _run_demo(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    parser.parse_args(argv)  # answers --help; any other argument is a usage error (exit 2)
    from router.demo.command import run_demo

    return run_demo([])


def _run_check(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    from router.check import run_check

    return run_check(parser, argv)


SUBCOMMANDS: dict[str, Subcommand] = {
    "demo": Subcommand(
        summary="the whole path on this machine, no cluster: two local pods, calls through the router",
        description=(
            "Starts two Stargate-like pods, stargate-0 on 127.0.0.2 and stargate-1 on 127.0.0.3\n"
            "(grpcio servers, h2c and TLS, and aioquic servers), writes an EndpointSlice file naming\n"
            "them and runs the router on 127.0.0.1 with it. Then calls each pod through the router by\n"
            "name, once per protocol: gRPC h2c by :authority, gRPC over TLS by SNI, QUIC by SNI; and\n"
            "shows the rejections: an unknown pod (gRPC UNAVAILABLE, QUIC CONNECTION_CLOSE) and a\n"
            "name outside the template (gRPC INVALID_ARGUMENT). Prints each call and who answered.\n"
            "Exits 0 when every call landed where it should, 1 otherwise."
        ),
        run=_run_demo,
    ),
    "check": Subcommand(
        summary="validate the flags and print the routing table the router would serve, then exit",
        description=(
            "Takes the router's own flags and validates them as the router does. Then reads the\n"
            "targets once, by the router's rules: the --endpoints-file, or ONE LIST of the Service's\n"
            "EndpointSlices through the Kubernetes API (--kubeconfig, else in-cluster, else KUBECONFIG\n"
            "or ~/.kube/config; --connect-timeout-ms bounds the connect). Prints one line per pod,\n"
            "sorted by pod:\n"
            "  <hostname> -> <pod> grpc <address:port> quic <address:port>\n"
            "then a summary line, and exits 0 (with a warning on stderr when no target is ready:\n"
            "the router would start not ready). Bad flags, an unreadable or invalid file, an\n"
            "unreachable or refusing API: one line on stderr naming the flag, file or API error,\n"
            "exit 2."
        ),
        run=_run_check,
    ),
}
"""Every subcommand, by name, in the order ``--help`` lists them."""


class _VersionAction(argparse.Action):
    """``--version``: the ``build_info`` metric's ``version`` label, looked up only when asked (startup cost)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0,
            help="print the version (the build_info metric's version label) and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from router.app import version

        print(version())
        parser.exit(0)


def top_parser() -> argparse.ArgumentParser:
    """The router's flags (``router.config``) plus ``--version`` and the list of subcommands."""
    parser = build_parser()
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    names = "{" + ",".join(SUBCOMMANDS) + "}"
    parser.usage = f"%(prog)s [flags]\n       %(prog)s {names} [--help]"
    width = max(map(len, SUBCOMMANDS))
    parser.epilog = "\n".join([
        "subcommands:",
        *(f"  {name:<{width}}  {sub.summary}" for name, sub in SUBCOMMANDS.items()),
        "",
        "`stargate-router SUBCOMMAND --help` says what one does.",
    ])
    parser.add_argument("--version", action=_VersionAction)
    return parser


def subcommand_parser(name: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=f"stargate-router {name}", description=SUBCOMMANDS[name].description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (it is a dependency): faster accept, recv and timers."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a hard dependency on Linux
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def run_router(config: RouterConfig, seat: WorkerSeat | None = None) -> int:
    """Run one router process (a worker of ``seat``, or alone) until SIGTERM/SIGINT; returns its exit status.
    A ``ConfigError`` found at start (``BindFailure`` too) propagates to ``main``, which says it."""
    from router.app import RouterApp
    from router.runtime import Runtime

    async def _main() -> int:
        return await RouterApp(config, Runtime.at_start(config, seat)).run()

    with asyncio.Runner(loop_factory=_new_event_loop) as runner:
        return runner.run(_main())


def announce_start_warnings(config: RouterConfig) -> None:
    """Warn of flags given that have no effect at L4, and of PROXY headers believed from every source."""
    for warning in (config.inert.warning(), config.proxy_trust_warning()):
        if warning is not None:
            logging.getLogger("router.app").warning("%s", warning)


def _exit_status(exc: SystemExit) -> int:
    return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2


def _config_error(exc: ConfigError, seat: WorkerSeat | None) -> int:
    """One line on stderr, or (a worker) to the supervisor, which says it once for all its workers."""
    if seat is not None:
        report(seat, WorkerReport.CONFIG_ERROR, str(exc))
    else:
        print(f"{CONFIG_ERROR_PREFIX}{exc}", file=sys.stderr)
    return CONFIG_ERROR_STATUS


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    seat: WorkerSeat | None = None
    try:
        if args[:1] and args[0] in SUBCOMMANDS:
            return SUBCOMMANDS[args[0]].run(subcommand_parser(args[0]), args[1:])
        seat = seat_from_environ()
        top_parser().parse_args(args)  # --help, --version and unknown flags end here
        config = config_from_args(args)
    except SystemExit as exc:  # argparse's help, version and usage errors
        return _exit_status(exc)
    except ConfigError as exc:
        return _config_error(exc, seat)
    from router.logging_setup import configure_logging

    configure_logging("json" if config.log_format == "json" else "text", config.log_level)
    if seat is None:  # said once, by the process the operator started
        announce_start_warnings(config)
    try:
        if config.workers > 1 and seat is None:
            from router.supervisor import supervise

            return supervise(config, args)
        return run_router(config, seat)
    except ConfigError as exc:  # found at start: a template the router rejects, a listener that cannot bind
        return _config_error(exc, seat)


def entrypoint() -> None:
    sys.exit(main())
