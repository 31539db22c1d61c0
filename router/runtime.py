"""What one router process decides once, at start, and passes down: its ``Runtime``.

Each choice (C extensions, the QUIC tables' bounds, where per-client limits are counted, the
workers' shared connection-ID index) is made here and nowhere else, from the configuration, the
environment and the supervisor's seat; the edges and the app never read the environment again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from router.client_count_table import LayoutError
from router.client_limits import ClientCounts
from router.config import RouterConfig
from router.extensions import Extensions, choose
from router.memory_bounds import MemoryBounds, bounds_at_start
from router.shared_client_limits import client_counts
from router.udp.cid_index import CidIndex, CidIndexError, map_index
from router.worker_seat import SeatError, WorkerSeat


@dataclass(frozen=True)
class Runtime:
    """The start-time choices of one process."""

    extensions: Extensions
    memory: MemoryBounds
    memory_line: str
    """What the start line says of ``memory`` and where it came from."""
    tcp_counts: ClientCounts
    quic_counts: ClientCounts
    seat: WorkerSeat | None = None
    """This process's place among the supervisor's workers; None when the operator started it."""
    cid_index: CidIndex | None = None
    """The workers' shared connection-ID index (``--workers N``); None for one process."""

    @classmethod
    def at_start(
        cls, config: RouterConfig, seat: WorkerSeat | None = None, environ: Mapping[str, str] | None = None
    ) -> Runtime:
        """Decide everything once; a seat whose shared files are unusable is a ``SeatError``."""
        env = os.environ if environ is None else environ
        memory, line = bounds_at_start(1 if seat is None else seat.count, env)
        try:
            tcp, quic = client_counts(
                config.max_connections_per_client, config.max_quic_flows_per_client,
                None if seat is None else seat.client_table_fd, 0 if seat is None else seat.index,
            )
            index = None if seat is None else map_index(seat.cid_index_fd, seat.index)
        except (LayoutError, CidIndexError, OSError) as exc:
            raise SeatError(f"the supervisor's shared files: {exc}") from None
        return cls(choose(env), memory, line, tcp, quic, seat, index)
