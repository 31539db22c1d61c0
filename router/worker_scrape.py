"""The supervisor's view of its workers: ``/readyz`` and ``/metrics`` fetched over aiohttp.

Each answer is bounded in time (``WORKER_PROBE_TIMEOUT_S``) and size (``WORKER_MAX_RESPONSE_BYTES``):
one stuck or broken worker costs a probe one timeout, never an unbounded buffer.
"""

from __future__ import annotations

import asyncio

import aiohttp

from router import constants as c
from router.flag_values import SocketAddress

HostPort = tuple[str, int]

READ_CHUNK_BYTES = 65536
"""Body read granularity: the size cap is checked per chunk, so at most one chunk over it is held."""


class ProbeError(Exception):
    """A worker's health endpoint did not answer with a well-formed HTTP response in time."""


class WorkerClient:
    """GETs from the workers' private health ports; one per supervisor, closed when it stops."""

    def __init__(
        self,
        timeout_s: float = c.WORKER_PROBE_TIMEOUT_S,
        max_response_bytes: int = c.WORKER_MAX_RESPONSE_BYTES,
    ) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max = max_response_bytes
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # A worker's probe server closes after each answer, so no pooled connection is kept.
            connector = aiohttp.TCPConnector(force_close=True)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, auto_decompress=False, trust_env=False,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self, address: HostPort, path: str) -> tuple[int, bytes]:
        """GET ``path`` from a worker: ``(status, body)``, or ProbeError (refused, too slow, too big)."""
        url = f"http://{SocketAddress(*address)}{path}"
        try:
            async with self._open().get(url, allow_redirects=False) as response:
                if (response.content_length or 0) > self._max:
                    raise ProbeError(f"response larger than {self._max} bytes")
                body = bytearray()
                async for chunk in response.content.iter_chunked(READ_CHUNK_BYTES):
                    body += chunk
                    if len(body) > self._max:
                        raise ProbeError(f"response larger than {self._max} bytes")
                return response.status, bytes(body)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise ProbeError(f"GET {path} from {address[0]}:{address[1]}: {exc!r}") from None

    async def fetch_all(
        self, addresses: list[HostPort], path: str
    ) -> list[tuple[int, bytes] | BaseException]:
        """``fetch`` from every address at once; a failure is its ProbeError in the list."""
        return await asyncio.gather(*(self.fetch(a, path) for a in addresses), return_exceptions=True)
