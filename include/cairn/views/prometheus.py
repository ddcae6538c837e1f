"""Cairn's metric samples in Prometheus' text exposition format (version 0.0.4), written by
`prometheus_client`, the reference library: it groups each family's samples under one `# HELP`
and `# TYPE`, escapes help text and label values, and turns the dotted names of
`cairn.views.metrics` (as StatsD takes them) into Prometheus ones (`cairn.offset_lag` →
`cairn_offset_lag`; a counter gains `_total`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4 as CONTENT_TYPE
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from cairn.views.metrics import Sample

__all__ = ["CONTENT_TYPE", "exposition"]

_FAMILIES: dict[str, type[GaugeMetricFamily | CounterMetricFamily]] = {
    "gauge": GaugeMetricFamily,
    "counter": CounterMetricFamily,
}


class _Samples:
    """A collector of samples already computed (from the run records), families in first-seen
    order."""

    def __init__(self, samples: Iterable[Sample]) -> None:
        self.samples = list(samples)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, tuple[GaugeMetricFamily | CounterMetricFamily, list[str]]] = {}
        for s in self.samples:
            if s.name not in families:
                keys = sorted(s.labels)
                families[s.name] = _FAMILIES[s.kind](s.name, s.help, labels=keys), keys
            family, keys = families[s.name]
            family.add_metric([s.labels[k] for k in keys], s.value)
        yield from (family for family, _ in families.values())


def exposition(samples: Iterable[Sample]) -> str:
    """The samples as one scrape's body."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Samples(samples))
    return generate_latest(registry).decode()
