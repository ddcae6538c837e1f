"""What a failed command says: one line naming what is wrong and what to do, and its exit code.

Operators read these, not tracebacks, so every failure a command can meet is worded here once
(`--debug` shows the traceback instead). The codes are the ones `cairn.cli` documents.
"""

from __future__ import annotations

import re

from botocore.exceptions import (
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from confluent_kafka import KafkaException

from cairn.cli.common import FOUND_PROBLEM, UNREACHABLE, USAGE, UsageError
from cairn.config import TopicConfig
from cairn.errors import PermanentError
from cairn.kafka.cluster import reason
from cairn.kafka.connection import KafkaAccessDenied, KafkaConfigError
from cairn.replay import ReplayRefused
from cairn.views.finder import NotArchived

_CONFIGURATION = (
    UsageError,
    LookupError,
    FileNotFoundError,
    KafkaConfigError,
    KafkaAccessDenied,
    ReplayRefused,
    ValueError,
)
"""What the person running the command has to change (exit 2): arguments, the topics file,
Kafka settings, a missing target."""

_STORAGE_UNREACHABLE = (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError)


def explain(error: Exception, cfg: TopicConfig | None) -> tuple[int, str]:
    """The exit code and the one line to print for `error`, met on `cfg`'s topic (if known)."""
    code, text = _explain(error, cfg)
    return code, re.sub(r"\s+", " ", text).strip()


def _explain(error: Exception, cfg: TopicConfig | None) -> tuple[int, str]:
    if isinstance(error, NotArchived):
        return FOUND_PROBLEM, f"not found: {error}"
    if isinstance(error, NoCredentialsError):
        return USAGE, f"error: {_no_credentials(cfg)}"
    if isinstance(error, _STORAGE_UNREACHABLE):
        return UNREACHABLE, f"error: {_storage(cfg)} cannot be reached: {error}; check its endpoint"
    if isinstance(error, FileNotFoundError) and error.filename:  # a file the command was given
        return USAGE, f"error: {error.filename}: no such file; check the path"
    if isinstance(error, PermissionError):
        return USAGE, f"error: {_storage(cfg)} refused access: {error}; check its credentials"
    if isinstance(error, _CONFIGURATION):
        return USAGE, f"error: {error}"
    if isinstance(error, KafkaException):
        return UNREACHABLE, (
            f"error: Kafka: {reason(error)}; check that the bootstrap servers are right and "
            "Kafka is up (--bootstrap-servers, --kafka-config, CAIRN_KAFKA_CONFIG), then run again"
        )
    if isinstance(error, PermanentError):  # a failed delivery, a corrupt token or manifest
        return FOUND_PROBLEM, f"failed: {error}"
    return FOUND_PROBLEM, f"failed: {type(error).__name__}: {error} (--debug shows where)"


def _storage(cfg: TopicConfig | None) -> str:
    return "the archive's storage" if cfg is None else f"archive root {cfg.archive_root}"


def _no_credentials(cfg: TopicConfig | None) -> str:
    conn_id = None if cfg is None else cfg.root.conn_id
    if cfg is None or conn_id is None:
        return (
            "no AWS credentials for an s3:// archive root: export its connection as "
            "AIRFLOW_CONN_<CONN_ID> (JSON), or set AWS_ACCESS_KEY_ID or AWS_PROFILE"
        )
    return (
        f"no AWS credentials for archive root {cfg.archive_root}: export the Airflow connection "
        f"{conn_id!r} as AIRFLOW_CONN_{conn_id.upper()} (JSON: login, password, extra), or set "
        "AWS_ACCESS_KEY_ID or AWS_PROFILE"
    )
