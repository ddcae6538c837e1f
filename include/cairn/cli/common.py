"""What every command shares: storage and Kafka from the environment, consoles, exit codes, and
showing Kafka bytes safely."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime

from rich.console import Console

from cairn.config import TopicConfig
from cairn.datafiles.avro_file import millis
from cairn.kafka.connection import KafkaConf
from cairn.storage.objects import Storage
from cairn.storage.s3_access import env_connection_options

OK, FOUND_PROBLEM, USAGE, UNREACHABLE = 0, 1, 2, 3
"""Exit codes: done; a mismatch, a record or file not found, a refusal or a failed delivery; a
usage or configuration error; Kafka or the archive's storage could not be reached."""

NONE = "—"


class UsageError(Exception):
    """What was asked cannot be done as asked (exit 2); the message says what to change."""


def out() -> Console:
    """The console for results: wide when piped, so keys are never wrapped."""
    return Console(width=None if sys.stdout.isatty() else 250, highlight=False)


def err() -> Console:
    """The console for errors and progress (stderr), so results stay clean to pipe."""
    return Console(stderr=True, highlight=False)


def storage_for(cfg: TopicConfig) -> Storage:
    root = cfg.root
    return Storage(root.storage_url, **env_connection_options(root.conn_id, os.environ))


CATALOG_VARIABLE = "AIRFLOW_CONN_CAIRN_CATALOG"
"""The Iceberg catalog as the Airflow connection `cairn_catalog` holds it (JSON)."""


def table_counter(cfg: TopicConfig) -> Callable[[date], int | None] | None:
    """Counts a date's records in the topic's table, when the catalog connection is exported
    (`AIRFLOW_CONN_CAIRN_CATALOG`, as Airflow holds it); None without it."""
    raw = os.environ.get(CATALOG_VARIABLE)
    if not raw:
        return None
    from cairn.table import iceberg  # pyiceberg: only when a table is asked about
    from cairn.table.catalog import Catalog, table_name

    conn = json.loads(raw)
    fields = dict(conn.get("extra") or {})
    fields |= {
        k: v for k, v in (("user", conn.get("login")), ("password", conn.get("password"))) if v
    }
    found = iceberg.catalog_of(Catalog.model_validate(fields))

    def count(day: date) -> int | None:
        try:
            table = found.load_table(f"cairn.{table_name(cfg.topic_name)}")
        except iceberg.NoSuchTableError:
            return None
        return iceberg.date_records(table, day)

    return count


def add_kafka_args(parser: argparse.ArgumentParser) -> None:
    kafka = parser.add_mutually_exclusive_group()
    kafka.add_argument("--kafka-config", metavar="FILE", help="librdkafka settings (JSON)")
    kafka.add_argument("--bootstrap-servers", help="a plaintext cluster's bootstrap servers")


def kafka_for(args: argparse.Namespace, command: str) -> KafkaConf:
    """The Kafka configuration the arguments or the environment name (see `cairn.cli`), with
    librdkafka's log lines off unless `--debug`."""
    if args.kafka_config:
        found = KafkaConf.from_file(args.kafka_config)
    elif args.bootstrap_servers:
        found = KafkaConf.from_bootstrap(args.bootstrap_servers, "--bootstrap-servers")
    else:
        from_env = KafkaConf.from_env(os.environ)
        if from_env is None:
            raise UsageError(
                f"{command} needs Kafka: pass --kafka-config FILE or --bootstrap-servers, or set "
                "CAIRN_KAFKA_CONFIG or CAIRN_BOOTSTRAP_SERVERS"
            )
        found = from_env
    return found if args.debug else found.quiet()


def day_arg(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD)") from None


def show_bytes(value: bytes | None, limit: int = 120) -> str:
    """Kafka bytes as one safe line: UTF-8 text with every other byte and every control
    character escaped (`\\xff`, `\\n`), cut after `limit` characters with the size left."""
    if value is None:
        return "null"
    text = value.decode("utf-8", errors="backslashreplace")
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(shown) <= limit:
        return shown
    return f"{shown[:limit]}… ({len(value)} bytes)"


def show_millis(value: int | datetime | None) -> str:
    """A Kafka timestamp (epoch millis, or as fastavro reads timestamp-millis) in UTC."""
    if value is None:
        return NONE
    when = datetime.fromtimestamp(millis(value) / 1000, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def show_time(when: datetime | None) -> str:
    return NONE if when is None else when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def show_size(n: int | None) -> str:
    if n is None:
        return NONE
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def show_offsets(offsets: dict[int, int]) -> str:
    return " ".join(f"{p}:{o}" for p, o in sorted(offsets.items())) or NONE
