"""Merge the Prometheus expositions of N worker processes into one (pure: text in, text out).

With ``--workers N`` each process counts only its own connections; the supervisor serves this merge
so dashboards see one router. Counters and histograms are summed per label set, ``*_created`` takes
the minimum; gauges are summed, except those every process reports alike (``PER_PROCESS_IDENTICAL_GAUGES``,
``PER_PROCESS_LIMIT_GAUGES``, ``*_info``: the maximum, so two workers never show twice the pods) and
``OLDEST_WINS_GAUGES`` (the minimum).

``cumulative_only=True`` keeps what a dead worker leaves (counters, histograms, ``_created``; no
gauges). The supervisor banks it so merged counters never go down when a worker restarts from zero:
Prometheus would read the drop as a reset, and ``rate()`` the survivors' totals as new traffic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from router.constants import OLDEST_WINS_GAUGES, PER_PROCESS_IDENTICAL_GAUGES, PER_PROCESS_LIMIT_GAUGES

CUMULATIVE_TYPES = frozenset({"counter", "histogram", "summary"})
"""Family types whose samples only grow while a process lives, so a dead worker's values still count."""

CREATED_SUFFIX = "_created"
"""Suffix of the creation-time samples prometheus-client exports (as gauge families in text format)."""

INFO_SUFFIX = "_info"
"""Suffix of info-style gauges (constant 1, facts in labels), e.g. ``build_info`` and ``python_info``."""

LabelSet = tuple[tuple[str, str], ...]
SampleKey = tuple[str, LabelSet]
Combine = Callable[[float, float], float]


class ExpositionError(ValueError):
    """An exposition that does not parse, or families that disagree on their type."""


def _sum(a: float, b: float) -> float:
    return a + b


def combine_for(family_name: str, family_type: str, sample_name: str) -> Combine:
    """How two workers' values of one sample merge: ``min``, ``max`` or sum (see module doc)."""
    if sample_name.endswith(CREATED_SUFFIX) or family_name in OLDEST_WINS_GAUGES:
        return min
    if family_type == "gauge" and (
        family_name in PER_PROCESS_IDENTICAL_GAUGES
        or family_name in PER_PROCESS_LIMIT_GAUGES
        or family_name.endswith(INFO_SUFFIX)
    ):
        return max
    return _sum


def is_cumulative(family_name: str, family_type: str) -> bool:
    """True for what a dead worker still contributes: counters, histograms, and their ``_created``."""
    return family_type in CUMULATIVE_TYPES or family_name.endswith(CREATED_SUFFIX)


@dataclass
class _MergedFamily:
    name: str
    documentation: str
    type: str
    values: dict[SampleKey, float] = field(default_factory=dict)

    def to_metric(self) -> Metric:
        metric = Metric(self.name, self.documentation, self.type)
        for (sample_name, labels), value in self.values.items():
            metric.add_sample(sample_name, dict(labels), value)
        return metric


class _StaticCollector(Collector):
    """Hands already-built families to ``generate_latest`` (so escaping and format are the library's)."""

    def __init__(self, metrics: Sequence[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


def _parse(index: int, text: str) -> list[Metric]:
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise ExpositionError(f"exposition {index} does not parse: {exc}") from None


def merge_expositions(texts: Sequence[str], *, cumulative_only: bool = False) -> bytes:
    """One text exposition (with HELP/TYPE) merging ``texts``; families and samples keep the order
    they first appear in, so identical layouts (every worker runs the same code) keep theirs."""
    families: dict[str, _MergedFamily] = {}
    for index, text in enumerate(texts):
        for family in _parse(index, text):
            if cumulative_only and not is_cumulative(family.name, family.type):
                continue
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = _MergedFamily(
                    family.name, family.documentation, family.type
                )
            elif merged.type != family.type:
                raise ExpositionError(
                    f"exposition {index}: {family.name} is a {family.type}, elsewhere a {merged.type}"
                )
            for sample in family.samples:
                key: SampleKey = (sample.name, tuple(sorted(sample.labels.items())))
                previous = merged.values.get(key)
                if previous is None:
                    merged.values[key] = float(sample.value)
                else:
                    combine = combine_for(family.name, family.type, sample.name)
                    merged.values[key] = combine(previous, float(sample.value))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StaticCollector([f.to_metric() for f in families.values()]))
    return generate_latest(registry)
