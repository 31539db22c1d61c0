"""A discovery source's ``publish`` callback for tests: every snapshot it published, and the last one's pods."""

from __future__ import annotations

from discovery.targets import TargetSnapshot


class SnapshotRecorder:
    """Records each published ``TargetSnapshot``; reads the latest."""

    def __init__(self) -> None:
        self.published: list[TargetSnapshot] = []

    def __call__(self, snapshot: TargetSnapshot) -> None:
        self.published.append(snapshot)

    @property
    def pods(self) -> dict[str, str]:
        """pod -> address of the latest published snapshot (empty before the first)."""
        return {t.pod_name: t.address for t in self.published[-1]} if self.published else {}

    @property
    def pod_names(self) -> list[str]:
        """The latest snapshot's pods, in its (sorted) order."""
        return list(self.pods)

    def address_of(self, pod: str) -> str | None:
        return self.pods.get(pod)
