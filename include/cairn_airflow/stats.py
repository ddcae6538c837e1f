"""A committed run's metrics through Airflow's own stats (StatsD, Datadog or OpenTelemetry, as
Airflow's `[metrics]` section configures them). The names are `cairn.views.metrics`'; the
Prometheus endpoint (`cairn_airflow.pages`) serves the same ones from the run records."""

from __future__ import annotations

import logging
from datetime import timedelta

from airflow.sdk.configuration import conf
from airflow.sdk.observability.stats import Stats

from cairn.config import TopicConfig
from cairn.pipeline import run_record
from cairn.views import metrics
from cairn_airflow.hooks.connections import storage

log = logging.getLogger(__name__)


def report_run(cfg: TopicConfig, seq: int) -> run_record.RunRecord | None:
    """Send a committed run's metrics through Airflow's stats. Best effort: the run is committed
    whatever happens here."""
    record = run_record.load(storage(cfg), cfg.topic, seq)
    if record is None:
        log.warning("topic %s: no status record for token %s; no metrics sent", cfg.topic, seq)
        return None
    try:
        emit(metrics.run_samples(record))
    except Exception as err:  # metrics must never fail a committed run
        log.warning("topic %s: metrics not sent: %s: %s", cfg.topic, type(err).__name__, err)
    return record


def emit(samples: list[metrics.Sample]) -> None:
    """Each sample through Airflow's stats: gauges, counters as increments, timings as timers.

    Plain StatsD has no tags, so there, as in Airflow's own legacy names, the labels go into the
    name: `cairn.offset_lag.<topic>.<partition>` (dots in a topic become `__`).
    """
    tagged = _stats_take_tags()
    for sample in samples:
        name, tags = sample.name, sample.labels
        if not tagged:
            name = ".".join([name, *(v.replace(".", "__") for v in tags.values())])
            tags = None
        if sample.name in metrics.TIMINGS:
            Stats.timing(name, timedelta(seconds=sample.value), tags=tags)
        elif sample.kind == "counter":
            Stats.incr(name, int(sample.value), tags=tags)
        else:
            Stats.gauge(name, sample.value, tags=tags)


def _stats_take_tags() -> bool:
    """Whether Airflow's configured stats backend keeps tags (all but plain StatsD)."""
    on = conf.getboolean("metrics", "statsd_on", fallback=False)
    datadog = conf.getboolean("metrics", "statsd_datadog_enabled", fallback=False)
    influx = conf.getboolean("metrics", "statsd_influxdb_enabled", fallback=False)
    return datadog or influx or not on
