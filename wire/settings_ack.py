"""The SETTINGS-ACK stripper: hides from the pod the client's ACK of the router's own SETTINGS.

Sans-IO. The pod never sent the router's ``EMPTY_SETTINGS_FRAME``, so exactly that one ACK frame is removed
from the client->pod stream, wherever it falls in the chunks.
"""

from __future__ import annotations

from wire.h2_frames import FRAME_HEADER_BYTES, H2_PREFACE, Flag, FrameType, H2PeekError, parse_frame_header


class SettingsAckStripper:
    """Removes exactly one SETTINGS ACK frame from the client->pod stream, then passes everything through."""

    __slots__ = ("_done", "_header", "_payload_left", "_preface_left")

    def __init__(self) -> None:
        self._preface_left = len(H2_PREFACE)
        self._header = bytearray()
        """A partial frame header (< 9 bytes): the only bytes ever held back."""
        self._payload_left = 0
        self._done = False

    @property
    def done(self) -> bool:
        """True once the ACK was removed; ``feed`` is then the identity."""
        return self._done

    def feed(self, data: bytes) -> bytes:
        """Bytes to forward for ``data``; raises H2PeekError on a malformed stream."""
        if self._done:
            return data
        out: list[bytes] = []
        view = memoryview(data)
        pos = 0
        while pos < len(view) and not self._done:
            if self._preface_left:
                offset = len(H2_PREFACE) - self._preface_left
                n = min(self._preface_left, len(view) - pos)
                if view[pos : pos + n] != H2_PREFACE[offset : offset + n]:
                    raise H2PeekError("not the HTTP/2 client preface")
                out.append(bytes(view[pos : pos + n]))
                self._preface_left -= n
                pos += n
            elif self._payload_left:
                n = min(self._payload_left, len(view) - pos)
                out.append(bytes(view[pos : pos + n]))
                self._payload_left -= n
                pos += n
            else:
                n = min(FRAME_HEADER_BYTES - len(self._header), len(view) - pos)
                self._header += view[pos : pos + n]
                pos += n
                if len(self._header) == FRAME_HEADER_BYTES:
                    self._on_header(out)
        if pos < len(view):
            out.append(bytes(view[pos:]))
        return b"".join(out)

    def _on_header(self, out: list[bytes]) -> None:
        header = parse_frame_header(self._header)
        if header.type == FrameType.SETTINGS and header.flags & Flag.ACK:
            if header.length or header.stream_id:
                raise H2PeekError("malformed SETTINGS ACK")
            self._done = True
        else:
            out.append(bytes(self._header))
            self._payload_left = header.length
        self._header.clear()
