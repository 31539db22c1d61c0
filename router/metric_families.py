"""Counter, gauge and histogram families whose series are plain numbers, exposed at scrape.

prometheus_client's children take a lock on every update (7% of a new connection's CPU,
bench/README). The router updates and scrapes on one thread, its event loop, so a number needs no
lock: never update these from another thread. API and exposition are prometheus_client's where the
router uses them (``tests/process/test_metric_families.py`` compares the two).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar, cast

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

_go_float = cast("Callable[[float], str]", floatToGoString)
"""How prometheus_client writes a bucket's ``le`` (``+Inf``, ``0.005``): untyped, so typed here."""

_TOTAL = "_total"
"""The suffix prometheus_client strips from a counter's name and puts back on its samples."""


class CounterSeries:
    """One counter series: a number that only grows."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class GaugeSeries:
    """One gauge series: a number, or a function read at scrape."""

    __slots__ = ("read", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.read: Callable[[], float] | None = None

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)

    def set_function(self, read: Callable[[], float]) -> None:
        """Read ``read()`` at each scrape instead of the number."""
        self.read = read

    def get(self) -> float:
        return float(self.read()) if self.read is not None else self.value


class HistogramSeries:
    """One histogram series: a count per bucket (not cumulative until exposed) and the sum."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # The first bound >= amount, as prometheus_client's loop finds it; the last is +Inf.
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount


S = TypeVar("S", CounterSeries, GaugeSeries, HistogramSeries)


class _Family(Generic[S]):
    """A named family of series, one per tuple of label values, registered as a collector."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], *, registry: CollectorRegistry,
                 new_series: Callable[[], S], expose: Callable[[_Family[S]], Metric]) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self._new_series: Callable[[], S] = new_series
        self._expose: Callable[[_Family[S]], Metric] = expose
        self._series: dict[tuple[str, ...], S] = {}
        if not self.labelnames:
            self._series[()] = new_series()
        registry.register(self)

    def items(self) -> Iterator[tuple[tuple[str, ...], S]]:
        """``(label values, series)`` of every series so far, in creation order."""
        return iter(self._series.items())

    def labels(self, *values: str, **by_name: str) -> S:
        """The series of these label values (created at 0 on first use), by position or name."""
        if by_name:
            if values or set(by_name) != set(self.labelnames):
                raise ValueError(f"{self.name}: labels {sorted(by_name)}, expected {list(self.labelnames)}")
            values = tuple(by_name[n] for n in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(values)} label values, expected {len(self.labelnames)}")
        key = tuple(str(v) for v in values)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self._new_series()
        return series

    def label_values(self) -> tuple[tuple[str, ...], ...]:
        """The label values of every series so far, in creation order."""
        return tuple(self._series)

    def collect(self) -> Iterator[Metric]:
        yield self._expose(self)

    def describe(self) -> Iterator[Metric]:
        """What the registry checks names against, with or without its ``auto_describe``."""
        return self.collect()


def _counters(family: _Family[CounterSeries]) -> Metric:
    exposed = CounterMetricFamily(family.name, family.documentation, labels=family.labelnames)
    for values, series in family.items():
        exposed.add_metric(values, series.value, created=series.created)
    return exposed


class CounterFamily(_Family[CounterSeries]):
    """A counter family; its name may end in ``_total`` or not, as with prometheus_client."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: CollectorRegistry) -> None:
        super().__init__(name.removesuffix(_TOTAL), documentation, labelnames, registry=registry,
                         new_series=CounterSeries, expose=_counters)

    def inc(self, amount: float = 1) -> None:
        """The unlabelled family's one series."""
        self._series[()].inc(amount)


def _gauges(family: _Family[GaugeSeries]) -> Metric:
    exposed = GaugeMetricFamily(family.name, family.documentation, labels=family.labelnames)
    for values, series in family.items():
        exposed.add_metric(values, series.get())
    return exposed


class GaugeFamily(_Family[GaugeSeries]):
    """A gauge family; unlabelled, it is its own series (``set``, ``set_function``)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: CollectorRegistry) -> None:
        super().__init__(name, documentation, labelnames, registry=registry, new_series=GaugeSeries,
                         expose=_gauges)

    def set(self, value: float) -> None:
        self._series[()].set(value)

    def set_function(self, read: Callable[[], float]) -> None:
        self._series[()].set_function(read)


class HistogramFamily(_Family[HistogramSeries]):
    """A histogram family; ``+Inf`` is appended to the buckets, as prometheus_client does."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 buckets: Sequence[float], registry: CollectorRegistry) -> None:
        bounds = tuple(float(b) for b in buckets)
        if list(bounds) != sorted(bounds):
            raise ValueError(f"{name}: buckets not in increasing order")
        self.bounds = full = bounds if bounds and bounds[-1] == math.inf else (*bounds, math.inf)
        les = tuple(_go_float(b) for b in full)

        def expose(family: _Family[HistogramSeries]) -> Metric:
            exposed = HistogramMetricFamily(family.name, family.documentation, labels=family.labelnames)
            for values, series in family.items():
                cumulative, buckets = 0, []
                for le, count in zip(les, series.counts, strict=True):
                    cumulative += count
                    buckets.append((le, float(cumulative)))
                exposed.add_metric(values, buckets, series.sum)
                exposed.add_sample(f"{family.name}_created", dict(zip(family.labelnames, values, strict=True)),
                                   series.created)
            return exposed

        super().__init__(name, documentation, labelnames, registry=registry,
                         new_series=lambda: HistogramSeries(full), expose=expose)
