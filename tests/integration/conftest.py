"""Helpers for archive tests: topics files, one archive run driven step by step exactly as the
DAG drives it (plan → clean → Spark → verify → commit), and a reader of the whole archive."""

from __future__ import annotations

import io
import json
import textwrap
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import fastavro
import pytest

from cairn.config import INCLUDE_DIR, TopicConfig
from cairn.jobs import ArchiveInput
from cairn.kafka import cluster
from cairn.kafka.connection import KafkaConf
from cairn.pipeline import archive_run, rebuild, run_record
from cairn.protocol import manifest, rewind, tokens
from cairn.storage.layout import parse_data_key
from cairn.storage.objects import Storage
from cairn.topics_file import find_topic
from cairn_stack import services
from cairn_stack.settings import StackSettings
from spark_jobs.archive import archive
from spark_jobs.rebuild import rebuild as rebuild_job

DEMO_SCHEMA = INCLUDE_DIR / "schemas" / "demo_event.avsc"


@pytest.fixture
def topic_name() -> str:
    return f"it.events-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make_cfg(tmp_path: Path) -> Callable[..., TopicConfig]:
    """A topic's config from a real topics file; `extra` is YAML added to its entry."""

    def make(topic: str, extra: str = "", root: str | None = None) -> TopicConfig:
        root = root or (tmp_path / "archive").as_uri()
        entry = f"""
            topics:
              - topic: {topic}
                format: json
                schema: {DEMO_SCHEMA}
                event_time: {{field: ts, encoding: iso8601}}
                archive_root: {root}
            """
        path = tmp_path / f"{topic}.yaml"  # rewritten by each call; tests re-read it by name
        path.write_text(textwrap.dedent(entry) + textwrap.indent(textwrap.dedent(extra), " " * 4))
        return find_topic(topic, path)

    return make


@dataclass
class Archiver:
    spark: object
    kafka: KafkaConf | str
    """The Kafka configuration, or only a plaintext listener's bootstrap servers."""
    options: dict
    registries: dict = field(default_factory=dict)
    """Schema Registry client configurations, as the operator gives the job (avro topics)."""

    def __post_init__(self) -> None:
        if isinstance(self.kafka, str):
            self.kafka = KafkaConf.from_bootstrap(self.kafka, "the test broker")

    def storage(self, cfg: TopicConfig) -> Storage:
        return Storage(cfg.root.storage_url, **self.options)

    def plan(self, cfg: TopicConfig) -> archive_run.Planned | None:
        return archive_run.plan_run(
            cfg, self.storage(cfg), self.kafka, f"test-{uuid.uuid4().hex[:6]}"
        )

    def write(self, cfg: TopicConfig, planned: archive_run.Planned) -> None:
        """Clean, then the Spark job (skipped, as the operator skips it, for an empty plan)."""
        archive_run.clean_run(self.storage(cfg), planned)
        if not planned.plan.empty:
            self.archive(cfg, planned)

    def archive(self, cfg: TopicConfig, planned: archive_run.Planned) -> None:
        """The Spark job of `planned` alone, raising why it staged nothing."""
        (outcome,) = self.stage((cfg, planned))
        if isinstance(outcome, Exception):
            raise outcome

    def job(self, cfg: TopicConfig, planned: archive_run.Planned) -> ArchiveInput:
        """The archive job's input for `planned`, as the operator makes it."""
        assert isinstance(self.kafka, KafkaConf)
        return ArchiveInput(
            topic=cfg.snapshot(),
            claim=planned.claim.key,
            storage_options=self.options,
            kafka=self.kafka.settings,
            kafka_label=self.kafka.label,
            registries=self.registries,
        )

    def stage(
        self, *runs: tuple[TopicConfig, archive_run.Planned], tag: str | None = None
    ) -> list[manifest.Outcome]:
        """One Spark archive job staging every run of `runs` (a shared job if more than one)."""
        return archive(self.spark, [self.job(cfg, planned) for cfg, planned in runs], tag)

    def finish(self, cfg: TopicConfig, planned: archive_run.Planned) -> run_record.RunRecord:
        report = archive_run.verify_run(self.storage(cfg), planned)
        return archive_run.commit_run(cfg, self.storage(cfg), planned, report, self.kafka)

    def rebuild(self, cfg: TopicConfig, *days: date) -> rebuild.Selection | None:
        """One rebuild operation as the rebuild DAG drives it: select, the Spark job, commit."""
        chosen = self.rebuild_selected(cfg, *days)
        if chosen is not None:
            self.commit_rebuild(cfg, chosen)
        return chosen

    def rebuild_selected(self, cfg: TopicConfig, *days: date) -> rebuild.Selection | None:
        """The rebuild DAG's select task and its Spark job, without its commit task."""
        chosen = rebuild.select(self.storage(cfg), cfg, days, f"test-{uuid.uuid4().hex[:6]}")
        if chosen is not None:
            rebuild_job(self.spark, chosen, cfg, self.options, self.registries)
        return chosen

    def commit_rebuild(self, cfg: TopicConfig, chosen: rebuild.Selection) -> tokens.Token:
        return rebuild.commit_rebuild(self.storage(cfg), cfg, chosen)

    def rewind(self, cfg: TopicConfig, **how) -> list[str]:
        """`python -m cairn tokens rewind` (its rule sees Kafka as it is now)."""
        state = cluster.fetch_topic(self.kafka, cfg.topic)
        return rewind.rewind(self.storage(cfg), cfg, state, **how)

    def run(self, cfg: TopicConfig) -> run_record.RunRecord | None:
        """One whole run; None when planning found nothing to do (no Spark, no token)."""
        planned = self.plan(cfg)
        if planned is None:
            return None
        self.write(cfg, planned)
        return self.finish(cfg, planned)


@pytest.fixture
def archiver(spark, kafka) -> Archiver:
    return Archiver(spark, kafka, {})


@pytest.fixture
def table_catalog(postgres, tmp_path):
    """The stack's Iceberg catalog (JDBC on PostgreSQL), with a warehouse of this test's own."""
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    return services.iceberg_catalog(postgres, warehouse.as_uri(), name=f"t{uuid.uuid4().hex[:8]}")


@dataclass
class ArchiveContents:
    backup: list[dict]
    partitioned: list[tuple[str, dict]]  # (folder, record)
    quarantine: list[dict]


def read_archive(storage: Storage, topic: str) -> ArchiveContents:
    """Every data file of `topic`, read with fastavro, as a plain reader listing the folders."""
    contents = ArchiveContents([], [], [])
    for key in storage.list():
        data = parse_data_key(key)
        if data is None or data.topic != topic:
            continue
        rows = list(fastavro.reader(io.BytesIO(storage.read(key))))
        if data.kind == "backup":
            contents.backup.extend(rows)
        elif data.kind == "quarantine":
            contents.quarantine.extend(rows)
        else:
            contents.partitioned.extend((data.folder, row) for row in rows)
    return contents


def coords(rows: list[dict], partition: str = "partition", offset: str = "offset") -> list:
    return sorted((r[partition], r[offset]) for r in rows)


def stack_env(settings: StackSettings) -> dict[str, str]:
    """`CAIRN_*` variables under which `python -m cairn_stack …` finds the test stack, not the
    default one (StackSettings reads them; lists and mappings as JSON)."""
    found = {}
    for name, value in settings.model_dump(mode="json").items():
        if value is not None:
            found[f"CAIRN_{name.upper()}"] = value if isinstance(value, str) else json.dumps(value)
    return found


def process_tree(root: int) -> list[int]:
    """`root` and every process below it (by parent pid), as they are now."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except (OSError, ValueError):
                continue
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(child for child, parent in parents.items() if parent == pid)
    return tree
