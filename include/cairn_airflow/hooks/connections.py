"""Airflow connections → the plain values Cairn's core takes: Kafka settings, storage, registries.

Resolved when a task runs, never while a DAG file is parsed: the Kafka connection's extra is
librdkafka configuration (`cairn.kafka.connection` checks it), an `s3://<conn>@…` archive root's
connection is an AWS one resolved by the Amazon provider, and an avro topic's Schema Registry is
an `http` connection.

Each process reuses what it resolved for `CONNECTION_SECONDS`. A worker runs one task and would
not notice; the triggerer runs the steps of many runs at once in one process, where every read
of a connection (and each of its secrets, masked) is a round trip through the triggerer's one
supervisor loop, and Python 3.11 lets only one thread at a time resolve an AWS hook's
`conn_config`: uncached, the steps queued behind each other's connection reads.
"""

from __future__ import annotations

import copy
import os
import threading
from typing import Any, NamedTuple

from airflow.sdk import BaseHook
from airflow.sdk.configuration import conf
from cachetools import TTLCache, cached

from cairn.config import TopicConfig
from cairn.formats import registry_ids
from cairn.formats.avro import registry_config
from cairn.jobs import LocalStorageOnCluster
from cairn.kafka.connection import KafkaConf, KafkaConfigError
from cairn.storage.objects import Storage
from cairn.storage.s3_access import ConnectionMissing, connection_options

KAFKA_CONN_ID = os.environ.get("CAIRN_KAFKA_CONN_ID", "cairn_kafka")
SPARK_CONN_ID = os.environ.get("CAIRN_SPARK_CONN_ID", "cairn_spark")
LOCAL_EXECUTORS = {"LocalExecutor", "SequentialExecutor", "DebugExecutor"}
"""Executors that run every task on the scheduler's machine: only they can share a local root."""
CONNECTION_SECONDS = 60.0
"""How long a process reuses a resolved connection: a changed one reaches the triggerer's steps
within this, and a missing one is looked up again at every use."""


def _once() -> dict[str, Any]:
    """A cache's lock that also makes the threads missing one key wait for the first to resolve
    it: when a minute ran out, the 32 steps of a burst each read the connection again, each read
    and mask one more request to the triggerer's supervisor."""
    condition = threading.Condition()
    return {"lock": condition, "condition": condition}


class Resolved(NamedTuple):
    """An Airflow connection's fields, its extra parsed once: each parse of the task SDK's
    connection extra is another round trip, to mask the secrets in it."""

    conn_type: str | None
    host: str | None
    port: int | None
    login: str | None
    password: str | None
    extra: dict[str, Any]


def connection(conn_id: str) -> Resolved:
    """Airflow's connection `conn_id`, as resolved at most `CONNECTION_SECONDS` ago."""
    found = _resolved(conn_id)
    return found._replace(extra=copy.deepcopy(found.extra))


@cached(TTLCache(maxsize=256, ttl=CONNECTION_SECONDS), **_once())
def _resolved(conn_id: str) -> Resolved:
    c = BaseHook.get_connection(conn_id)
    return Resolved(c.conn_type, c.host, c.port, c.login, c.password, c.extra_dejson)


def spark_conn_id(cfg: TopicConfig) -> str:
    """The Spark connection `cfg`'s jobs run on: its `spark_connection`, else the deployment's."""
    return cfg.spark_connection or SPARK_CONN_ID


def kafka_conf() -> KafkaConf:
    """The Kafka connection (the Kafka provider's `kafka` type): its extra is librdkafka
    configuration, checked to be usable by every client Cairn runs (`cairn.kafka.connection`)."""
    conn = connection(KAFKA_CONN_ID)
    label = f"Airflow connection {KAFKA_CONN_ID!r}"
    if conn.conn_type != "kafka":
        raise KafkaConfigError(f"{label} is of type {conn.conn_type!r}; make it a 'kafka' one")
    return KafkaConf(conn.extra, label)


def storage_options(cfg: TopicConfig, *, for_spark: bool = False) -> dict[str, Any]:
    """fsspec options for the topic's archive root. An S3 root's connection is an AWS
    connection, resolved by the Amazon provider (keys, session token, assumed role, profile,
    endpoint, region); `for_spark` leaves the keys out when the cluster uses its own role."""
    if cfg.root.scheme == "file":
        return {}
    try:
        return copy.deepcopy(_aws_options(cfg.root.conn_id, for_spark))
    except _NoConnection:  # the provider would fall back to the worker's own credentials
        raise ConnectionMissing(cfg.topic, cfg.root.conn_id) from None


class _NoConnection(Exception):
    """The root's connection does not exist (raised, so that it is not remembered)."""


@cached(TTLCache(maxsize=256, ttl=CONNECTION_SECONDS), **_once())
def _aws_options(conn_id: str | None, for_spark: bool) -> dict[str, Any]:
    # boto3 (a tenth of a second): not in every DAG file's parse, which imports this module
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    hook = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
    conn = hook.conn_config
    if not conn:
        raise _NoConnection(conn_id)
    return connection_options(
        conn_id,
        conn.extra_config,
        conn.get_service_endpoint_url("s3"),
        conn.region_name,
        hook.get_credentials,
        for_spark=for_spark,
    )


def storage(cfg: TopicConfig) -> Storage:
    """The topic's archive root, with its connection's credentials; a local folder only where
    every task runs on this machine (`LocalStorageOnCluster` otherwise)."""
    executor = conf.get("core", "executor", fallback="LocalExecutor")
    distributed = [e for e in executor.split(",") if e.rsplit(".", 1)[-1] not in LOCAL_EXECUTORS]
    if cfg.root.scheme == "file" and distributed:
        raise LocalStorageOnCluster(
            f"{cfg.label}: archive root {cfg.archive_root} is a local folder, but Airflow runs "
            f"tasks with {distributed[0].strip()}, whose workers may be on other machines and "
            "each would see its own folder: use an s3:// root (docs/operating.md, Running on "
            "your cluster)"
        )
    return Storage(cfg.root.storage_url, **storage_options(cfg))


def schema_registries(cfg: TopicConfig) -> dict[str, dict[str, Any]]:
    """Client configurations of the Schema Registries the topic's format reads (avro topics
    with `avro.registry`), each from its Airflow connection: host (URL), port, login/password,
    and client settings in the extra."""
    found = {}
    for conn_id in registry_ids(cfg):
        conn = connection(conn_id)
        found[conn_id] = registry_config(
            conn.host or "", conn.port, conn.login, conn.password, conn.extra
        )
    return found
