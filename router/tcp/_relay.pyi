"""Type stub of the optional C extension ``router.tcp._relay`` (see ``_relay.c``)."""

from collections.abc import Callable

CLIENT_TO_POD: int
POD_TO_CLIENT: int
CONNECT: int

def dial(address: str, port: int, /) -> tuple[int, bool]: ...

class Relay:
    def abort(self) -> None: ...
    def probe(self) -> tuple[int, int, float]: ...
    def next_release(self, quiet_s: float, /) -> float: ...
    def release_quiet(self, now: float, quiet_s: float, /) -> None: ...
    def state(self) -> tuple[str, str, int, int, int, int, int]: ...
    def done(self) -> tuple[bool, bool]: ...
    def is_connecting(self) -> bool: ...

class Engine:
    def __init__(
        self,
        *,
        chunk_bytes: int,
        splice_after_bytes: int,
        pipe_bytes: int,
        report_bytes: int,
        rounds: int,
        events_per_dispatch: int,
    ) -> None: ...
    @property
    def live(self) -> int: ...
    @property
    def watched(self) -> int: ...
    def start(
        self,
        client_fd: int,
        pod_fd: int,
        initial: bytes,
        splice: bool,
        connecting: bool,
        on_end: Callable[[Relay, int, int, int, int, int], object],
        on_bytes: Callable[[int, int], object] | None,
        on_acquired: Callable[[], object] | None,
        on_connected: Callable[[], object] | None,
        /,
    ) -> Relay: ...
    def dispatch(self) -> None: ...
    def fileno(self) -> int: ...
    def close(self) -> None: ...
