"""``stargate-router``: run the router (flags as the Rust router's) or ``stargate-router demo``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from router.config import ConfigError, RouterConfig, config_from_args


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (it is a dependency): faster accept, recv and timers."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a hard dependency on Linux
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def run_router(config: RouterConfig) -> int:
    """Run one router process until SIGTERM/SIGINT; returns its exit status."""
    from router.app import RouterApp

    async def _main() -> int:
        try:
            app = RouterApp(config)
        except ConfigError as exc:
            print(f"stargate-router: error: {exc}", file=sys.stderr)
            return 2
        return await app.run()

    with asyncio.Runner(loop_factory=_new_event_loop) as runner:
        return runner.run(_main())


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["demo"]:
        from router.demo.command import run_demo

        return run_demo(args[1:])
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"stargate-router: error: {exc}", file=sys.stderr)
        return 2
    from router.logging_setup import configure_logging

    configure_logging("json" if config.log_format == "json" else "text", config.log_level)
    if config.workers > 1:
        from router.supervisor import supervise

        return supervise(config, args)
    return run_router(config)


def entrypoint() -> None:
    sys.exit(main())
