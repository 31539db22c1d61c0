"""The names clients dial the demo pods by, written out (not read from the router's default
template), so a change of that default fails the tests instead of following it silently."""

from __future__ import annotations


def host(pod: str) -> str:
    """``pod``'s hostname under the default template: the SNI, :authority or QUIC server name."""
    return f"{pod}.stargate.external"
