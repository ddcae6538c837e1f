"""Randomized fault injection against real Kafka and Spark: a seeded sequence of steps mixing
produce (committed and aborted transactions, poison records), whole runs, crashes after the Spark
job / after verify / halfway through publishing, two attempts interleaved at every step boundary
(with a zombie still writing), attempts, rebuilds and seals interrupted at a random step
boundary — inside the commit too, before and after the token's create, and for rebuilds and
seals halfway through publishing, then retried — by a hand rewind, a CLI rewind,
Kafka's retention, another run, another plan, an added partition or a rebuild; and config changes
that move records across midnight and raise or lower the generation.

After every step the archive, as the next step sees it (`cairn.protocol.commit.settle`), holds each
Kafka record below the newest token exactly once in backup and once in partitioned-or-quarantine,
verbatim, except records Kafka's retention deleted while the archive did not hold them; no record is
ever in the data folders twice, and no gap is recorded for a record the archive holds. After
catching up, the data folders match Kafka, every date audits clean and records are found where they
are. Runs for topics starting at `earliest` and at `latest`. `CAIRN_FAULT_SEEDS` and
`CAIRN_FAULT_STEPS` widen the search; a failure names the seed, the step and the history to replay
it.
"""

from __future__ import annotations

import io
import json
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import fastavro
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from py4j.protocol import Py4JJavaError
from pyiceberg.expressions import EqualTo
from pyspark.errors import PySparkException

from cairn.config import TopicConfig
from cairn.datafiles.writer import KafkaRecord, write_partition
from cairn.errors import PermanentError
from cairn.kafka import cluster
from cairn.pipeline import archive_run, rebuild, seal
from cairn.pipeline.completeness import complete_run
from cairn.pipeline.proof import read_proof
from cairn.protocol import commit, leftovers, rewind, tokens
from cairn.storage.layout import DEFAULT_PATH_FORMAT, file_date, parse_data_key, token_key
from cairn.storage.objects import Storage
from cairn.table import iceberg
from cairn.table.catalog import TableTarget
from cairn.table.iceberg import IcebergCatalog
from cairn.views import finder
from cairn.views.audit import audit_date
from cairn.views.finder import ArchiveIndex
from cairn_stack import services
from cairn_stack.demo import create_topic
from spark_jobs.rebuild import rebuild as rebuild_job
from spark_jobs.seal import seal as seal_job
from tests.integration.conftest import Archiver
from tests.integration.test_rebuild import NOON
from tests.leftovers import rewound_publications, staging, table_leftovers, unnamed_data_files

SEEDS = [int(s) for s in os.environ.get("CAIRN_FAULT_SEEDS", "20261125").split(",")]
STEPS = int(os.environ.get("CAIRN_FAULT_STEPS", "100"))
S3_STEPS = int(os.environ.get("CAIRN_FAULT_S3_STEPS", "40"))  # each step costs more requests
CLUSTER_STEPS = int(os.environ.get("CAIRN_FAULT_CLUSTER_STEPS", "12"))  # each job goes over RPC
PARTITIONS, MAX_PARTITIONS = 2, 3
FOUND_SAMPLE = 40  # records looked up with `find` at the end (each reads a few objects)
CONFIGS = (  # the "fixes": Tokyo moves evening events to the next date; generations 1, 2, 10
    "",
    "timezone: Asia/Tokyo\n",
    "generation: 2\n",
    "generation: 10\ntimezone: Asia/Tokyo\n",
)
COMMIT_POINTS = ("select", "spark", "before create", "after create", "mid publish")
"""Where a rebuild or seal is interrupted (`Scenario._interrupted_commit`)."""
STEPS_OF_AN_ATTEMPT = ("plan", "clean", "spark", "verify", "before create", "after create", "done")
INTERFERENCE = (
    "rewind",
    "cli rewind",
    "retention",
    "run",
    "plan",
    "partition",
    "produce",
    "rebuild",
)

OPS = {
    "produce": 22,
    "run": 14,
    "crash_after_spark": 4,
    "crash_after_verify": 4,
    "crash_mid_publish": 5,
    "interleave": 8,
    "shared": 6,
    "interrupted_run": 16,
    "rewind": 4,
    "cli_rewind": 3,
    "retention": 3,
    "add_partition": 1,
    "rebuild": 6,
    "rebuild_crash": 3,
    "interrupted_rebuild": 5,
    "config_fix": 5,
    "seal": 6,
    "interrupted_seal": 5,
    "catch_up": 2,
}
ABANDONED = (PermanentError, ConnectionError, PySparkException, Py4JJavaError)
"""What an interrupted attempt may end with: fenced or refused, the commit task dying
(`Hooked`), or Spark failing to read offsets retention deleted; anything else is a bug."""


@dataclass
class Kafka:
    """The topic's committed records by (partition, offset), as the producer's delivery reports
    place them (an aborted transaction's records take offsets but are never committed), and
    those retention deleted before the archive held them."""

    bootstrap: str
    topic: str
    partitions: int = PARTITIONS
    records: dict[tuple[int, int], bytes | None] = field(default_factory=dict)
    lost: set[tuple[int, int]] = field(default_factory=set)
    low: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})
        self.producer = self._producer()

    def _producer(self) -> Producer:
        """A transactional producer (a new one knows every partition at once)."""
        made = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": uuid.uuid4().hex})
        made.init_transactions(30)
        return made

    def produce(self, values: list[bytes | None], partition: int, commit: bool) -> None:
        delivered: dict[tuple[int, int], bytes | None] = {}

        def report(err, msg) -> None:
            assert err is None, err
            delivered[msg.partition(), msg.offset()] = msg.value()

        self.producer.begin_transaction()
        for value in values:
            self.producer.produce(self.topic, value, b"k", partition=partition, on_delivery=report)
        self.producer.flush(30)
        assert len(delivered) == len(values)
        if commit:
            self.producer.commit_transaction(30)
            self.records |= delivered
        else:
            self.producer.abort_transaction(30)

    def delete_before(self, partition: int, offset: int, held: set[tuple[int, int]]) -> None:
        """Retention: Kafka deletes `partition` below `offset`; what the archive does not hold
        is lost for good."""
        done = self.admin.delete_records([TopicPartition(self.topic, partition, offset)])
        (future,) = done.values()
        future.result(30)
        gone = {c for c in self.records if c[0] == partition and c[1] < offset}
        self.lost |= gone - held
        self.low[partition] = max(self.low.get(partition, 0), offset)

    def add_partition(self) -> None:
        self.partitions += 1
        done = self.admin.create_partitions([NewPartitions(self.topic, self.partitions)])
        done[self.topic].result(30)
        deadline = time.monotonic() + 30
        while not self._leaders_known():  # before then, a DeleteRecords finds "No leaders"
            assert time.monotonic() < deadline, f"partition {self.partitions - 1} has no leader"
            time.sleep(0.2)
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})
        self.producer = self._producer()

    def _leaders_known(self) -> bool:
        found = self.admin.list_topics(self.topic, timeout=10).topics[self.topic].partitions
        return len(found) == self.partitions and all(p.leader >= 0 for p in found.values())


@dataclass
class Archive:
    """What a reader sees: every record in the data folders, by kind."""

    backup: Counter = field(default_factory=Counter)
    values: dict = field(default_factory=dict)
    parsed: Counter = field(default_factory=Counter)
    parsed_at: dict = field(default_factory=dict)
    """The date each partitioned record is filed under."""


def read_data_folders(storage: Storage, topic: str) -> Archive:
    seen = Archive()
    for key in storage.list():
        found = parse_data_key(key)
        if found is None or found.topic != topic:
            continue
        for row in fastavro.reader(io.BytesIO(storage.read(key))):
            if found.kind == "backup":
                seen.backup[row["partition"], row["offset"]] += 1
                seen.values[row["partition"], row["offset"]] = row["value"]
            elif found.kind == "quarantine":
                seen.parsed[row["partition"], row["offset"]] += 1
            else:
                seen.parsed[row["_kafka_partition"], row["_kafka_offset"]] += 1
                day = file_date(found, DEFAULT_PATH_FORMAT)
                seen.parsed_at[row["_kafka_partition"], row["_kafka_offset"]] = day
    return seen


def check(storage: Storage, topic: str, kafka: Kafka, skipped: set, caught_up: bool) -> None:
    """The invariants (module doc); `skipped`: records a `latest` start never had to archive."""
    newest = commit.settle(storage, topic)
    position = newest.next_offsets if newest else {}
    seen = read_data_folders(storage, topic)
    for kind, counted in (("backup", seen.backup), ("parsed or quarantine", seen.parsed)):
        doubled = sorted(c for c, n in counted.items() if n > 1)
        assert not doubled, f"records twice in {kind}: {doubled[:10]}"
    invented = (set(seen.backup) | set(seen.parsed)) - set(kafka.records)
    assert not invented, f"records that are not Kafka's committed records: {sorted(invented)[:10]}"
    assert set(seen.parsed) <= set(seen.backup), "parsed records missing from backup"
    below = {c for c in kafka.records if caught_up or c[1] < position.get(c[0], 0)}
    must = below - kafka.lost - skipped
    held = {c for c in seen.backup if caught_up or c[1] < position.get(c[0], 0)}
    assert must <= held, f"lost below the token: {sorted(must - held)[:10]}"
    assert held <= set(seen.parsed), f"not parsed once: {sorted(held - set(seen.parsed))[:10]}"
    wrong = [c for c in held if seen.values[c] != kafka.records[c]]
    assert not wrong, f"backup values differ from Kafka at {wrong[:5]}"
    for seq in tokens.seqs(storage, topic):
        for gap in tokens.token_at(storage, topic, seq).gaps:
            inside = {c for c in seen.backup if c[0] == gap.partition}
            inside = {c for c in inside if gap.from_offset <= c[1] < gap.to_offset}
            assert not inside, f"token {seq} declares a gap over archived records {inside}"


class Hooked(Storage):
    """The archive root, calling `hooks[point]` once at a point inside a commit: before or after
    the token's create, or after `moves` files of its publication (which moves several at once:
    once dead, every later move fails too, as in a task that died)."""

    def __init__(self, url: str, **options) -> None:
        super().__init__(url, **options)
        self.hooks: dict[str, Callable[[], None]] = {}
        self.moves = -1
        self._moving = threading.Lock()

    def _fire(self, point: str) -> None:
        hook = self.hooks.pop(point, None)
        if hook is not None:
            hook()

    def create(self, key: str, data: bytes) -> None:
        if key.startswith("_tokens/"):
            self._fire("before create")
            super().create(key, data)
            self._fire("after create")
        else:
            super().create(key, data)

    def move(self, source: str, target: str) -> None:
        with self._moving:
            dead = self.moves == 0
            if not dead:
                self.moves -= 1
        if dead:
            raise ConnectionError("the commit task died while publishing")
        super().move(source, target)


@dataclass
class Scenario:
    rng: random.Random
    archiver: Archiver
    kafka: Kafka
    cfgs: list[TopicConfig]
    latest: bool
    catalog: IcebergCatalog
    table: TableTarget
    table_options: dict = field(default_factory=dict)
    """What the seal job's executors reach the table's location with (S3: its fsspec options)."""
    cfg_index: int = 0
    produced: int = 0
    skipped: set | None = None
    history: list[str] = field(default_factory=list)

    @property
    def cfg(self) -> TopicConfig:
        return self.cfgs[self.cfg_index]

    @property
    def topic(self) -> str:
        return self.cfg.topic

    @property
    def storage(self) -> Storage:
        return self.archiver.storage(self.cfg)

    def seal_job(self, chosen: seal.Selection) -> None:
        seal_job(self.archiver.spark, chosen, self.cfg, self.archiver.options, self.table_options)

    def hooked(self) -> Hooked:
        return Hooked(self.cfg.root.storage_url, **self.archiver.options)

    def value(self) -> bytes | None:
        """A valid event near midnight on one of three dates, or a poison record."""
        self.produced += 1
        roll = self.rng.random()
        if roll < 0.08:
            return b'{"event_id": "broken", "ts": '
        if roll < 0.12:
            return None  # a tombstone
        ts = NOON + timedelta(days=self.rng.randrange(3), hours=self.rng.choice([-3, 0, 9, 11.5]))
        body = {"event_id": f"e{self.produced}", "user_id": "u", "action": "a", "amount": 1.0}
        return json.dumps(body | {"ts": ts.isoformat()}).encode()

    def check(self, caught_up: bool = False) -> None:
        """The invariants; a `latest` topic's first token says what it never had to archive."""
        first = tokens.read(self.storage, self.topic, 1)
        if self.latest and self.skipped is None and first is not None:
            start = first.next_offsets if not first.counts.read else {}
            self.skipped = {c for c in self.kafka.records if c[1] < start.get(c[0], 0)}
        check(self.storage, self.topic, self.kafka, self.skipped or set(), caught_up)

    # --- the operations ------------------------------------------------------------------

    def produce(self) -> str:
        partition = self.rng.randrange(self.kafka.partitions)
        values = [self.value() for _ in range(self.rng.randint(1, 12))]
        committed = self.rng.random() > 0.15
        self.kafka.produce(values, partition, committed)
        return f"produce {len(values)} to {partition} {'committed' if committed else 'aborted'}"

    def run(self) -> str:
        done = self.archiver.run(self.cfg)
        return f"run -> {done.seq if done else 'nothing'}"

    def crash_after_spark(self) -> str:
        planned = self.archiver.plan(self.cfg)
        if planned is not None:
            self.archiver.write(self.cfg, planned)
        return "crash after spark"

    def crash_after_verify(self) -> str:
        planned = self.archiver.plan(self.cfg)
        if planned is not None:
            self.archiver.write(self.cfg, planned)
            archive_run.verify_run(self.storage, planned)
        return "crash after verify"

    def crash_mid_publish(self) -> str:
        """The commit task dies after creating the token, having moved some of the files."""
        planned = self.archiver.plan(self.cfg)
        if planned is None:
            return "crash mid publish: nothing"
        self.archiver.write(self.cfg, planned)
        report = archive_run.verify_run(self.storage, planned)
        hooked = self.hooked()
        hooked.hooks["after create"] = lambda: setattr(hooked, "moves", self.rng.randint(0, 3))
        try:
            archive_run.commit_archive(self.cfg, hooked, planned, report, self.archiver.kafka)
        except ConnectionError:
            return f"crash mid publish of {planned.attempt_id}"
        return f"crash mid publish: {planned.attempt_id} published before the crash"

    def interleave(self) -> str:
        """Two attempts, each plan → clean → spark → verify → commit, steps interleaved at
        random; a fenced attempt stops, and sometimes leaves a zombie writing to its staging."""
        attempts = {"A": self._attempt("A"), "B": self._attempt("B")}
        trace = []
        while attempts:
            name = self.rng.choice(sorted(attempts))
            try:
                trace.append(f"{name}.{next(attempts[name])}")
            except StopIteration:
                del attempts[name]
            except commit.Fenced:
                trace.append(f"{name}.fenced")
                del attempts[name]
        return "interleave " + " ".join(trace)

    def shared(self) -> str:
        """Two attempts planned one after the other, staged by one shared Spark job (the first
        fenced out by the second), then verified and committed in random order: a fenced
        attempt's outcome is its error, the live one's its manifest, and only it commits."""
        runs = []
        for _ in range(2):
            planned = self.archiver.plan(self.cfg)
            if planned is not None and not planned.plan.empty:
                archive_run.clean_run(self.storage, planned)
                runs.append(planned)
        if not runs:
            return "shared: nothing to read"
        self.rng.shuffle(runs)
        trace = []
        outcomes = self.archiver.stage(*((self.cfg, p) for p in runs), tag="fault")
        for planned, outcome in zip(runs, outcomes, strict=True):
            if isinstance(outcome, Exception):
                assert isinstance(outcome, ABANDONED), outcome
                trace.append(f"{planned.attempt_id} {type(outcome).__name__}")
                continue
            try:
                self.archiver.finish(self.cfg, planned)
                trace.append(f"{planned.attempt_id} committed")
            except ABANDONED as err:
                trace.append(f"{planned.attempt_id} {type(err).__name__}")
        return "shared " + ", ".join(trace)

    def _attempt(self, name: str) -> Iterator[str]:
        planned = self.archiver.plan(self.cfg)
        yield "plan" if planned else "plan-nothing"
        if planned is None:
            return
        try:
            archive_run.clean_run(self.storage, planned)
            yield "clean"
            if not planned.plan.empty:
                self.archiver.archive(self.cfg, planned)
            yield "spark"
            report = archive_run.verify_run(self.storage, planned)
            yield "verify"
            archive_run.commit_run(self.cfg, self.storage, planned, report, self.archiver.kafka)
            yield "commit"
        except commit.Fenced:
            if self.rng.random() < 0.5:  # its Spark job had passed its check: it keeps writing
                self._zombie(planned)
            raise

    def _zombie(self, planned: archive_run.Planned) -> None:
        p, (start, end) = next(iter(planned.plan.to_read.items()), (0, (0, 0)))
        records = [
            KafkaRecord(planned.topic, p, o, 0, 0, b"k", self.kafka.records.get((p, o)))
            for o in range(start, end)
            if (p, o) in self.kafka.records
        ]
        staged = planned.staged(self.storage)
        write_partition(records, self.cfg, staged, planned.planned_at, planned.attempt_id)

    def interrupted_run(self) -> str:
        """One archive attempt, step by step, with something else happening at a random step
        boundary: inside the commit too, before or after its token's create."""
        at, what = self.rng.choice(STEPS_OF_AN_ATTEMPT), self.rng.choice(INTERFERENCE)
        hooked, steps = self.hooked(), []
        try:
            planned = self.archiver.plan(self.cfg)
            if planned is None:
                return f"interrupted run: nothing ({what} unused)"
            for step, do in (
                ("plan", lambda: None),
                ("clean", lambda: archive_run.clean_run(self.storage, planned)),
                ("spark", lambda: self._spark(planned)),
                ("verify", lambda: steps.append(archive_run.verify_run(self.storage, planned))),
                ("done", lambda: self._commit(hooked, planned, steps[-1], at, what)),
            ):
                do()
                if step == at:
                    self.interfere(what)
        except ABANDONED as err:
            return f"interrupted run: {what} at {at}: {type(err).__name__}"
        return f"interrupted run: {what} at {at}: committed"

    def _spark(self, planned: archive_run.Planned) -> None:
        if not planned.plan.empty:
            self.archiver.archive(self.cfg, planned)

    def _commit(
        self, hooked: Hooked, planned: archive_run.Planned, report, at: str, what: str
    ) -> None:
        if at in ("before create", "after create"):
            hooked.hooks[at] = lambda: self.interfere(what)
        archive_run.commit_run(self.cfg, hooked, planned, report, self.archiver.kafka)

    def interfere(self, what: str) -> None:
        self.history.append(f"   ... {what}")
        getattr(self, {"cli rewind": "cli_rewind", "partition": "add_partition"}.get(what, what))()

    def plan(self) -> str:
        planned = self.archiver.plan(self.cfg)
        if planned is not None:
            archive_run.clean_run(self.storage, planned)
        return "plan and clean"

    def rewind(self) -> str:
        seqs = tokens.seqs(self.storage, self.topic)
        doomed = seqs[-self.rng.randint(1, 2) :]
        for seq in reversed(doomed):  # by hand, newest first, as docs/recovery.md allows
            self.storage.delete(token_key(self.topic, seq))
        return f"rewind tokens {doomed}"

    def cli_rewind(self) -> str:
        try:
            deleted = self.archiver.rewind(self.cfg, count=self.rng.randint(1, 2))
        except (rewind.RewindRefused, ValueError) as err:
            return f"cli rewind refused: {str(err)[:60]}"
        return f"cli rewind {deleted}"

    def retention(self) -> str:
        partition = self.rng.randrange(self.kafka.partitions)
        marks = cluster.fetch_watermarks(self.archiver.kafka, self.topic)
        low, high = marks[partition]
        if high <= low:
            return "retention: nothing to delete"
        upto = self.rng.randint(low + 1, high)
        held = set(read_data_folders(self.storage, self.topic).backup)
        self.kafka.delete_before(partition, upto, held)
        return f"retention deletes partition {partition} below {upto}"

    def add_partition(self) -> str:
        if self.kafka.partitions >= MAX_PARTITIONS:
            return "add partition: enough"
        self.kafka.add_partition()
        return f"add partition {self.kafka.partitions - 1}"

    def _dates(self) -> list[date]:
        found = set()
        for kind in ("partitioned", "quarantine"):
            for folder in self.storage.children(f"{kind}/{self.topic}/"):
                found.add(date.fromisoformat(folder.rstrip("/").rsplit("dt=", 1)[1]))
        return sorted(found)

    def _chosen_dates(self) -> list[date]:
        dates = self._dates()
        if not dates:
            return []
        first = self.rng.choice(dates)
        return [first + timedelta(days=i) for i in range(self.rng.randint(1, 2))]

    def rebuild(self) -> str:
        days = self._chosen_dates()
        try:
            chosen = self.archiver.rebuild(self.cfg, *days) if days else None
        except (commit.Conflict, commit.Fenced) as err:
            return f"rebuild {days}: {type(err).__name__}"
        return f"rebuild {days} -> {chosen.claim.attempt_id if chosen else 'nothing'}"

    def rebuild_crash(self) -> str:
        days = self._chosen_dates()
        chosen = rebuild.select(self.storage, self.cfg, days, "crashing") if days else None
        if chosen is not None:
            staged = commit.staged(self.storage, chosen.claim)
            for source in chosen.sources[: len(chosen.sources) // 2 + 1]:
                rebuild.rebuild_source(source, self.cfg, self.storage, staged)
        return f"rebuild crash {days}"

    def interrupted_rebuild(self) -> str:
        """A rebuild with something else happening at a random step boundary (module doc)."""
        days = self._chosen_dates()
        at = self.rng.choice(COMMIT_POINTS)
        what = self.rng.choice(INTERFERENCE)
        if not days:
            return "interrupted rebuild: no dates"
        try:
            chosen = rebuild.select(self.storage, self.cfg, days, "interrupted")
            if chosen is None:
                return f"interrupted rebuild {days}: nothing"
            if at == "select":
                self.interfere(what)
            rebuild_job(self.archiver.spark, chosen, self.cfg, self.archiver.options)
            if at == "spark":
                self.interfere(what)
            self._interrupted_commit(
                at, what, lambda s: rebuild.commit_rebuild(s, self.cfg, chosen)
            )
        except ABANDONED as err:
            return f"interrupted rebuild {days}: {what} at {at}: {type(err).__name__}"
        return f"interrupted rebuild {days}: {what} at {at}: committed"

    def seal(self) -> str:
        """Mark the dates that became complete (the archive DAG's complete task), then seal one
        of the dates with files (the seal DAG), its table included."""
        days = self._chosen_dates()[:1]
        if not days:
            return "seal: no dates"
        complete_run(self.cfg, self.storage, self.archiver.kafka, "faults")
        try:
            chosen = seal.select(self.storage, self.cfg, days[0], "sealing", self.table)
            if chosen is None:
                return f"seal {days[0]}: nothing"
            self.seal_job(chosen)
            seal.finish_seal(self.storage, self.cfg, chosen, self.catalog)
        except (commit.Conflict, commit.Fenced) as err:
            return f"seal {days[0]}: {type(err).__name__}"
        return f"seal {days[0]} -> {chosen.claim.attempt_id}"

    def interrupted_seal(self) -> str:
        """A seal with something else happening at a random step boundary (module doc)."""
        days = self._chosen_dates()[:1]
        at = self.rng.choice(COMMIT_POINTS)
        what = self.rng.choice(INTERFERENCE)
        if not days:
            return "interrupted seal: no dates"
        complete_run(self.cfg, self.storage, self.archiver.kafka, "faults")
        try:
            chosen = seal.select(self.storage, self.cfg, days[0], "interrupted", self.table)
            if chosen is None:
                return f"interrupted seal {days[0]}: nothing"
            if at == "select":
                self.interfere(what)
            self.seal_job(chosen)
            if at == "spark":
                self.interfere(what)
            self._interrupted_commit(
                at, what, lambda s: seal.finish_seal(s, self.cfg, chosen, self.catalog)
            )
        except ABANDONED as err:
            return f"interrupted seal {days[0]}: {what} at {at}: {type(err).__name__}"
        return f"interrupted seal {days[0]}: {what} at {at}: committed"

    def _interrupted_commit(self, at: str, what: str, finish: Callable[[Storage], object]) -> None:
        """A rebuild's or seal's commit task (`finish`) with `what` happening at `at` inside it;
        at "mid publish" the task dies having moved some files, `what` happens (a rewind may
        delete its token), then the task's retry."""
        hooked = self.hooked()
        if at in ("before create", "after create"):
            hooked.hooks[at] = lambda: self.interfere(what)
        if at != "mid publish":
            finish(hooked)
            return
        hooked.hooks["after create"] = lambda: setattr(hooked, "moves", self.rng.randint(0, 3))
        try:
            finish(hooked)
        except ConnectionError:
            self.history.append("   ... the commit task died mid publish")
        self.interfere(what)
        finish(self.storage)

    def check_table(self) -> None:
        """Every sealed date's table partition holds its sealed records, each once."""
        table = self.catalog.load_table(self.table.identifier) if self.sealed_any() else None
        if table is None:
            return
        rows = table.scan().to_arrow()
        pairs = list(
            zip(
                rows.column("_kafka_partition").to_pylist(),
                rows.column("_kafka_offset").to_pylist(),
                strict=True,
            )
        )
        doubled = [c for c, n in Counter(pairs).items() if n > 1]
        assert not doubled, f"records twice in the table: {doubled[:10]}"
        assert set(pairs) <= set(self.kafka.records), "records in the table that Kafka never had"

    def sweep_everything(self) -> str:
        """A day later (past every attempt's deadline): what every attempt that did not commit
        left is removed, in the table's location too."""
        reach = {self.table.location: iceberg.location_storage(self.catalog, self.table)}
        later, removed = datetime.now(UTC) + timedelta(days=1, minutes=1), []
        while found := leftovers.sweep(self.storage, self.topic, reach, now=later):
            removed += found
        return f"swept {len(removed)} attempts"

    def check_nothing_left(self) -> None:
        """Nothing is left that no token refers to: no staging or pending mark, no data file that
        no token names but those a token adopted (a rewind Kafka could not serve again) and
        those a rebuild or seal published before a rewind deleted its token (the only copy of
        their records), and no file in the table's location that its metadata does not refer
        to."""
        assert staging(self.storage, self.topic) == []
        adopted = [t.adopted for t in tokens.list_tokens(self.storage, self.topic)]
        unnamed = unnamed_data_files(self.storage, self.topic)
        unnamed -= rewound_publications(self.storage, self.topic)
        kept = {k for k in unnamed if _within(parse_data_key(k), adopted)}
        assert unnamed == kept, f"data files no token refers to: {sorted(unnamed - kept)[:5]}"
        if self.sealed_any():
            files = iceberg.location_storage(self.catalog, self.table)
            left = table_leftovers(self.catalog.load_table(self.table.identifier), files)
            assert not left, f"table files no snapshot refers to: {sorted(left)[:5]}"

    def check_findable(self) -> None:
        """Every date audits clean against the history (each file as the commit that wrote it
        says, none missing), and records the archive holds are found where they are: verbatim in
        backup and in the parsed or quarantine file holding them now."""
        for day in self._dates():
            checked = audit_date(self.storage, self.cfg, day)
            bad = [(f.key, f.problems) for f in checked.files if f.problems]
            assert checked.ok, f"{day} audits with problems: {checked.problems[:3]} {bad[:3]}"
        index = ArchiveIndex(self.storage, self.topic)
        held = sorted(read_data_folders(self.storage, self.topic).backup)
        for p, o in self.rng.sample(held, min(FOUND_SAMPLE, len(held))):
            found = index.find(p, o)
            assert found.record["value"] == self.kafka.records[p, o], f"find {p}/{o}: wrong value"
            assert found.output is not None, f"find {p}/{o}: no parsed or quarantine copy"
            assert finder.coordinates(found.output.kind, found.output_record) == (p, o)

    def sealed_any(self) -> bool:
        return any(t.kind == "seal" for t in tokens.list_tokens(self.storage, self.topic))

    def config_fix(self) -> str:
        self.cfg_index = self.rng.choice([i for i in range(len(CONFIGS)) if i != self.cfg_index])
        return f"config {CONFIGS[self.cfg_index].strip() or 'UTC, generation 1'}"

    def catch_up(self) -> str:
        runs = 0
        while self.archiver.run(self.cfg) is not None:
            runs += 1
            assert runs < 100, "the archive never caught up"
        return f"catch up in {runs} runs"

    def seal_everything(self) -> str:
        """After catching up: seal every complete date again (a re-seal threshold of one file),
        so each sealed date's table partition must hold exactly its partitioned records."""
        complete_run(self.cfg, self.storage, self.archiver.kafka, "faults")
        for day in self._dates():
            chosen = seal.select(self.storage, self.cfg, day, "final", self.table)
            if chosen is not None:
                self.seal_job(chosen)
                seal.finish_seal(self.storage, self.cfg, chosen, self.catalog)
        table = self.catalog.load_table(self.table.identifier) if self.sealed_any() else None
        for day in self._dates() if table is not None else []:
            proof = read_proof(self.storage, self.cfg, day)
            if proof is None or proof.table_records is None:
                continue
            rows = table.scan(row_filter=EqualTo("_event_date", day)).to_arrow()
            in_table = Counter(
                zip(
                    rows.column("_kafka_partition").to_pylist(),
                    rows.column("_kafka_offset").to_pylist(),
                    strict=True,
                )
            )
            in_folders = Counter(
                c
                for c, where in read_data_folders(self.storage, self.topic).parsed_at.items()
                if where == day
            )
            assert in_table == in_folders, (
                f"table of {day} differs from its folders: {set(in_table) ^ set(in_folders)}"
            )
        return "sealed every complete date"


def _within(f, adopted: list[dict[int, tuple[int, int]]]) -> bool:
    """Whether run file `f` holds offsets a token adopted."""
    spans = [t[f.partition] for t in adopted if not f.sealed and f.partition in t]
    return any(a <= f.first_offset < b for a, b in spans)


@pytest.mark.parametrize("start", ["earliest", "latest"])
@pytest.mark.parametrize("root", ["file", "s3"])
@pytest.mark.parametrize("seed", SEEDS)
def test_random_faults_never_lose_or_double_a_record(
    seed,
    root,
    start,
    kafka,
    archiver,
    make_cfg,
    topic_name,
    request,
    stack_settings,
    postgres,
    tmp_path,
) -> None:
    url, steps, warehouse = None, STEPS, tmp_path / "warehouse"
    if root == "s3":  # the same kind of sequence on the real S3 server, shorter
        archiver = Archiver(archiver.spark, kafka, request.getfixturevalue("s3"))
        url = f"s3://{stack_settings.s3_conn_id}@{stack_settings.bucket}/faults-{topic_name}"
        steps = S3_STEPS
    warehouse.mkdir()
    stack_catalog = services.iceberg_catalog(
        postgres, warehouse.as_uri(), name=f"f{uuid.uuid4().hex[:8]}"
    )
    cfgs = fault_configs(make_cfg, topic_name, start, url)
    random_faults(f"{seed}-{root}-{start}", archiver, kafka, cfgs, stack_catalog, steps)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_faults_on_the_cluster_never_lose_or_double_a_record(
    seed, kafka, s3, on_the_cluster, make_cfg, topic_name, stack_settings, postgres
) -> None:
    """The same sequences, shorter, with every Spark job on the standalone cluster through its
    Connect server: executors in other processes with nothing of Cairn but the code each session
    ships, the archive and the table's warehouse on S3."""
    url = f"s3://{stack_settings.s3_conn_id}@{stack_settings.bucket}/faults-cluster-{topic_name}"
    stack_catalog = services.iceberg_catalog(
        postgres,
        f"s3://{stack_settings.bucket}/faults-warehouse-{topic_name}",
        name=f"f{uuid.uuid4().hex[:8]}",
    )
    cfgs = fault_configs(make_cfg, topic_name, "earliest", url)
    archiver = Archiver(on_the_cluster, kafka, s3)
    random_faults(f"{seed}-cluster", archiver, kafka, cfgs, stack_catalog, CLUSTER_STEPS)


def fault_configs(make_cfg, topic_name: str, start: str, url: str | None) -> list[TopicConfig]:
    """The topic's configurations a "config fix" moves between (CONFIGS), archived to `url`."""
    extra = (
        f"max_records_per_partition: 15\naccept_gaps: true\nnew_partition_start: {start}\n"
        "reseal_files: 1\n"
    )
    return [make_cfg(topic_name, extra + c, root=url) for c in CONFIGS]


def random_faults(
    label: str,
    archiver: Archiver,
    kafka: str,
    cfgs: list[TopicConfig],
    stack_catalog,
    steps: int,
) -> None:
    """`steps` random steps seeded by `label` on a fresh topic, then catch up, seal every
    complete date again and sweep, checking the archive after each step and nothing left at
    the end; a failure names `label`, the step and the history to replay it."""
    topic_name = cfgs[0].topic_name
    create_topic(kafka, topic_name, partitions=PARTITIONS)
    rng = random.Random(label)
    scenario = Scenario(
        rng,
        archiver,
        Kafka(kafka, topic_name),
        cfgs,
        latest=cfgs[0].new_partition_start == "latest",
        catalog=iceberg.catalog_of(stack_catalog),
        table=iceberg.target(stack_catalog, topic_name),
        table_options=iceberg.storage_options(stack_catalog),
    )
    ops, weights = zip(*OPS.items(), strict=True)
    done: Counter = Counter()
    try:
        for step in range(steps):
            op = rng.choices(ops, weights)[0]
            done[op] += 1
            scenario.history.append(f"{step}: {getattr(scenario, op)()}")
            scenario.check()
            scenario.check_table()
        scenario.history.append(scenario.catch_up())
        scenario.check(caught_up=True)
        scenario.history.append(scenario.seal_everything())
        scenario.check(caught_up=True)
        scenario.history.append(scenario.sweep_everything())
        scenario.check_nothing_left()
        scenario.check_findable()
    except Exception as err:
        replay = "\n".join(scenario.history[-40:])
        pytest.fail(f"{label} failed: {type(err).__name__}: {err}\n{replay}")
    print(f"{label}: {steps} steps, {len(scenario.kafka.records)} records")
    print(dict(done.most_common()))
