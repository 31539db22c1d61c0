"""A listener that cannot bind: one line naming its flag, its address and why, then exit 2.

The kernel says why in an errno; an operator reads words. The router process and the ``--workers``
supervisor both bind through ``binding``, so both say the same line.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator, Mapping

from router.flag_values import ConfigError, SocketAddress

REASONS: Mapping[int, str] = {
    errno.EADDRINUSE: "address already in use",
    errno.EADDRNOTAVAIL: "address not available on this host",
    errno.EACCES: "permission denied (a port below net.ipv4.ip_unprivileged_port_start needs CAP_NET_BIND_SERVICE)",
}
"""The bind errnos an operator meets, in words; others fall back to ``os.strerror``."""


def reason(error: OSError) -> str:
    """Why ``error`` stopped a bind, in words. The errno may sit on a cause: uvloop raises its own
    ``OSError`` without one ``from`` the kernel's."""
    cause: BaseException | None = error
    while isinstance(cause, OSError):
        if cause.errno is not None and cause.errno > 0:
            return REASONS.get(cause.errno) or os.strerror(cause.errno).lower()
        cause = cause.__cause__
    return str(error).lower()


class BindFailure(ConfigError):
    """A listener could not bind its flag's address. A ``ConfigError`` (one line, exit 2) because the fix
    is the flag's value or the host's state: restarting the same process cannot help."""

    def __init__(self, flag: str, address: SocketAddress, error: OSError) -> None:
        super().__init__(f"{flag} {address}: {reason(error)}")
        self.flag = flag
        self.address = address
        self.error = error


@contextlib.contextmanager
def binding(flag: str, address: SocketAddress) -> Iterator[None]:
    """An ``OSError`` raised inside (binding ``address``) becomes a ``BindFailure`` naming ``flag``."""
    try:
        yield
    except OSError as exc:
        raise BindFailure(flag, address, exc) from exc
