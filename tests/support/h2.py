"""HTTP/2 frames built and split by hand, for the h2c peek's unit, fault and fuzz tests, and the
real ``h2`` client (with its gRPC request) that the peek, stripper and rejection tests share.

Real clients (the ``h2`` library, grpcio) never send a malformed frame; these builders do,
so the tests can reach every refusal of ``wire.h2c``.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
from hyperframe.frame import SettingsFrame
from hypothesis import strategies as st

H2_FRAME_HEADER_BYTES = 9
"""Length (3), type (1), flags (1), stream id (4): RFC 9113 section 4.1."""

Frame = tuple[int, int, int, bytes]
"""(type, flags, stream id, payload) of one frame."""

AUTHORITY = "stargate-0.stargate.external:50071"
PATH = "/stargate.Stargate/Attach"
REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", PATH),
    (":authority", AUTHORITY),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]
"""The headers of the gRPC call a Stargate client makes (the router routes it by ``AUTHORITY``)."""
SETTINGS_ACK = SettingsFrame(0, flags=["ACK"]).serialize()
"""What a client sends on reading the server's SETTINGS."""


def frame(frame_type: int, flags: int, stream_id: int, payload: bytes = b"", length: int | None = None) -> bytes:
    """One frame; ``length`` overrides the header's length field (to lie about the payload)."""
    size = len(payload) if length is None else length
    return size.to_bytes(3, "big") + bytes((frame_type, flags)) + stream_id.to_bytes(4, "big") + payload


frame_runs = st.lists(
    st.tuples(st.integers(0, 10), st.integers(0, 255), st.integers(0, 5), st.binary(max_size=60)),
    max_size=6,
).map(lambda fs: b"".join(frame(t, f, s, p) for t, f, s, p in fs))
"""Hypothesis: up to six well-framed frames of any type, flags, stream and payload."""


def client(max_frame_size: int | None = None) -> h2.connection.H2Connection:
    """A real ``h2`` client connection, preface and SETTINGS queued (``max_frame_size`` caps its frames)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    if max_frame_size is not None:
        conn.max_outbound_frame_size = max_frame_size
    return conn


def split_frames(data: bytes, preface: bytes) -> list[Frame] | None:
    """The frames after ``preface`` (a cut last frame keeps what is there); None without the preface."""
    if not data.startswith(preface):
        return None
    frames, pos = [], len(preface)
    while pos + H2_FRAME_HEADER_BYTES <= len(data):
        size = int.from_bytes(data[pos : pos + 3], "big")
        frames.append((data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5 : pos + 9], "big"),
                       data[pos + 9 : pos + 9 + size]))
        pos += H2_FRAME_HEADER_BYTES + size
    return frames


def h2c_grpc_request(authority: str) -> tuple[h2.connection.H2Connection, bytes]:
    """An h2 client and its first bytes: preface, SETTINGS and one gRPC request naming ``authority``."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", "/x.Y/Z"),
                          (":authority", authority), ("content-type", "application/grpc"), ("te", "trailers")],
                      end_stream=True)
    return conn, conn.data_to_send()


def grpc_status_of(conn: h2.connection.H2Connection, answer: bytes) -> str | None:
    """The grpc-status an h2 client reads in ``answer`` (None if there is none)."""
    for event in conn.receive_data(answer):
        if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
            for name, value in event.headers:
                if name == b"grpc-status":
                    return bytes(value).decode()
    return None
