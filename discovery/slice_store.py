"""The set of EndpointSlices a watch has observed, in observation order.

Events change it one slice at a time; a re-list replaces it whole. It holds no routing logic (the
snapshot is ``targets_from_slices`` of the whole set); it adds the Rust router's order: an applied
slice becomes the most recently observed, so its copy of a pod wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from discovery.endpoint_slices import slice_key, targets_from_slices
from discovery.settings import DiscoverySettings
from discovery.targets import TargetSnapshot


class SliceStore:
    """Slices by ``metadata.name``, oldest observation first; the snapshot is cached until a change.
    It keeps references to the mappings given: callers hand over fresh objects."""

    def __init__(self, settings: DiscoverySettings) -> None:
        self._settings = settings
        self._slices: dict[str, Mapping[str, Any]] = {}  # insertion order = observation order
        self._snapshot: TargetSnapshot | None = None

    def __len__(self) -> int:
        return len(self._slices)

    def replace_all(self, slices: Iterable[Mapping[str, Any]]) -> None:
        """A completed re-list: the whole set, atomically (a nameless slice leaves the store untouched)."""
        replacement: dict[str, Mapping[str, Any]] = {}
        for slice_ in slices:
            key = slice_key(slice_)
            replacement.pop(key, None)  # a repeated name counts as observed again, at the end
            replacement[key] = slice_
        self._slices = replacement
        self._snapshot = None

    def apply(self, slice_: Mapping[str, Any]) -> None:
        """ADDED or MODIFIED: the slice becomes the most recently observed."""
        key = slice_key(slice_)
        self._slices.pop(key, None)
        self._slices[key] = slice_
        self._snapshot = None

    def delete(self, slice_: Mapping[str, Any]) -> None:
        """DELETED: forget the slice of that name; an unknown slice changes nothing."""
        if self._slices.pop(slice_key(slice_), None) is not None:
            self._snapshot = None

    def snapshot(self) -> TargetSnapshot:
        """The routable pods of every stored slice."""
        if self._snapshot is None:
            self._snapshot = targets_from_slices(self._slices.values(), self._settings)
        return self._snapshot
