"""Randomized fault injection against real Kafka and Spark: a seeded sequence of steps mixing
produce (committed and aborted transactions, poison records), whole runs, crashes after the Spark
job / after verify / halfway through publishing, two attempts interleaved at every step
boundary (with a zombie still writing), rewinds, rebuilds of random dates (also crashing), and
config fixes that move records across midnight.

After every step the committed archive (what is published, plus what committed tokens have
yet to publish) holds each Kafka record below the newest token exactly once in backup and
exactly once in partitioned-or-quarantine, verbatim; after catching up, the data folders match
Kafka exactly. `CAIRN_FAULT_SEEDS` and `CAIRN_FAULT_STEPS` widen the search; a failure names
the seed, the step and the history to replay it.
"""

from __future__ import annotations

import io
import json
import os
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, timedelta

import fastavro
import pytest
from confluent_kafka import Producer

from cairn import fence, manifest, rebuild, run, staging, tokens
from cairn.config import TopicConfig
from cairn.layout import attempts_folder, parse_data_key, token_key
from cairn.storage import Storage
from cairn.writer import KafkaRecord, write_partition
from cairn_stack.demo import create_topic
from spark_jobs.archive import archive
from tests.integration.conftest import Archiver
from tests.integration.test_rebuild import NOON

SEEDS = [int(s) for s in os.environ.get("CAIRN_FAULT_SEEDS", "20261123").split(",")]
STEPS = int(os.environ.get("CAIRN_FAULT_STEPS", "200"))
S3_STEPS = int(os.environ.get("CAIRN_FAULT_S3_STEPS", "60"))  # each step costs more requests
PARTITIONS = 2
CONFIGS = ("", "timezone: Asia/Tokyo\n")  # the "fix" moves evening events to the next date

OPS = {
    "produce": 24,
    "run": 18,
    "crash_after_spark": 7,
    "crash_after_verify": 6,
    "crash_mid_publish": 7,
    "interleave": 12,
    "rewind": 6,
    "rebuild": 10,
    "rebuild_crash": 4,
    "config_fix": 4,
    "catch_up": 2,
}


@dataclass
class Kafka:
    """The topic's committed records by (partition, offset), as the producer's delivery reports
    place them (an aborted transaction's records take offsets but are never committed)."""

    bootstrap: str
    topic: str
    records: dict[tuple[int, int], bytes | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.producer = Producer(
            {"bootstrap.servers": self.bootstrap, "transactional.id": uuid.uuid4().hex}
        )
        self.producer.init_transactions(30)

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


@dataclass
class Archive:
    """What a reader sees: every record in the data folders, by kind."""

    backup: Counter = field(default_factory=Counter)
    values: dict = field(default_factory=dict)
    parsed: Counter = field(default_factory=Counter)


def read_committed_view(storage: Storage, topic: str, pending: bool) -> Archive:
    """The data folders, plus (if `pending`) the files committed tokens have yet to publish."""
    files = {key: key for key in storage.list() if parse_data_key(key) is not None}
    if pending:
        for folder in storage.children(attempts_folder(topic)):
            attempt_id = folder.rstrip("/").rsplit("/", 1)[-1]
            if fence.fate(storage, topic, attempt_id) != "committed":
                continue
            for staged in storage.list(folder):
                final = staged[len(folder) :]
                if parse_data_key(final) is not None:
                    files[final] = staged
    seen = Archive()
    for final, key in files.items():
        kind = parse_data_key(final).kind
        for row in fastavro.reader(io.BytesIO(storage.read(key))):
            if kind == "backup":
                seen.backup[row["partition"], row["offset"]] += 1
                seen.values[row["partition"], row["offset"]] = row["value"]
            elif kind == "quarantine":
                seen.parsed[row["partition"], row["offset"]] += 1
            else:
                seen.parsed[row["_kafka_partition"], row["_kafka_offset"]] += 1
    return seen


def check_below_token(storage: Storage, topic: str, kafka: Kafka) -> None:
    newest = tokens.newest(storage, topic)
    position = newest.next_offsets if newest else {}
    below = {c for c in kafka.records if c[1] < position.get(c[0], 0)}
    seen = read_committed_view(storage, topic, pending=True)
    committed_backup = {c for c in seen.backup if c[1] < position.get(c[0], 0)}
    assert committed_backup == below, f"backup below the token differs: {committed_backup ^ below}"
    doubled = {c: n for c, n in seen.backup.items() if n > 1 and c in below}
    assert not doubled, f"records twice in backup: {doubled}"
    parsed = {c: n for c, n in seen.parsed.items() if c[1] < position.get(c[0], 0)}
    assert parsed == dict.fromkeys(below, 1), f"parsed != once: {set(parsed) ^ below}"
    wrong = [c for c in below if seen.values[c] != kafka.records[c]]
    assert not wrong, f"backup values differ from Kafka at {wrong[:5]}"


def check_matches_kafka(storage: Storage, topic: str, kafka: Kafka) -> None:
    seen = read_committed_view(storage, topic, pending=False)
    everything = dict.fromkeys(kafka.records, 1)
    assert dict(seen.backup) == everything, f"backup: {set(seen.backup) ^ set(everything)}"
    assert dict(seen.parsed) == everything, f"parsed: {set(seen.parsed) ^ set(everything)}"


@dataclass
class Scenario:
    rng: random.Random
    archiver: object
    kafka: Kafka
    cfgs: list[TopicConfig]
    cfg_index: int = 0
    produced: int = 0
    history: list[str] = field(default_factory=list)

    @property
    def cfg(self) -> TopicConfig:
        return self.cfgs[self.cfg_index]

    @property
    def storage(self) -> Storage:
        return self.archiver.storage(self.cfg)

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

    # --- the operations ------------------------------------------------------------------

    def produce(self) -> str:
        partition = self.rng.randrange(PARTITIONS)
        values = [self.value() for _ in range(self.rng.randint(1, 12))]
        commit = self.rng.random() > 0.15
        self.kafka.produce(values, partition, commit)
        return f"produce {len(values)} to {partition} {'committed' if commit else 'aborted'}"

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
            run.verify_run(self.storage, planned)
        return "crash after verify"

    def crash_mid_publish(self) -> str:
        """The commit task dies after creating the token, having moved half of the files."""
        planned = self.archiver.plan(self.cfg)
        if planned is None:
            return "crash mid publish: nothing"
        self.archiver.write(self.cfg, planned)
        report = run.verify_run(self.storage, planned)
        run.prepare_publication(self.storage, planned)
        keys = []
        if not planned.plan.empty:
            keys = [f.key for f in manifest.load(self.storage, planned.manifest_key).files]
        topic = planned.topic
        tokens.commit(self.storage, run.token_for(self.cfg, planned, report), planned.claim)
        for key in keys[: len(keys) // 2]:  # the rest stays staged until a run settles it
            self.storage.move(f"{attempts_folder(topic)}{planned.attempt_id}/{key}", key)
        return f"crash mid publish of token {planned.seq} ({len(keys) // 2}/{len(keys)} moved)"

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
            except fence.Fenced:
                trace.append(f"{name}.fenced")
                del attempts[name]
        return "interleave " + " ".join(trace)

    def _attempt(self, name: str):
        planned = self.archiver.plan(self.cfg)
        yield "plan" if planned else "plan-nothing"
        if planned is None:
            return
        try:
            run.clean_run(self.cfg, self.storage, planned, self.archiver.kafka)
            yield "clean"
            if not planned.plan.empty:
                archiver = self.archiver
                archive(archiver.spark, planned, self.cfg, archiver.kafka, archiver.options)
            yield "spark"
            report = run.verify_run(self.storage, planned)
            yield "verify"
            run.commit_run(self.cfg, self.storage, planned, report, self.archiver.kafka)
            yield "commit"
        except fence.Fenced:
            if self.rng.random() < 0.5:  # its Spark job had passed its check: it keeps writing
                self._zombie(planned)
            raise

    def _zombie(self, planned: run.Planned) -> None:
        p, (start, end) = next(iter(planned.plan.to_read.items()), (0, (0, 0)))
        records = [
            KafkaRecord(planned.topic, p, o, 0, 0, b"k", self.kafka.records.get((p, o)))
            for o in range(start, end)
            if (p, o) in self.kafka.records
        ]
        staged = planned.staged(self.storage)
        write_partition(records, self.cfg, staged, planned.planned_at, planned.attempt_id)

    def rewind(self) -> str:
        seqs = fence.link_seqs(self.storage, self.cfg.topic, "archive")
        doomed = seqs[-self.rng.randint(1, 2) :]
        for seq in reversed(doomed):  # by hand, newest first, as the README allows
            self.storage.delete(token_key(self.cfg.topic, seq))
        return f"rewind tokens {doomed}"

    def _dates(self) -> list[date]:
        topic = self.cfg.topic
        found = set()
        for kind in ("partitioned", "quarantine"):
            for folder in self.storage.children(f"{kind}/{topic}/"):
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
        chosen = self.archiver.rebuild(self.cfg, *days) if days else None
        return f"rebuild {days} -> {chosen.claim.attempt_id if chosen else 'nothing'}"

    def rebuild_crash(self) -> str:
        days = self._chosen_dates()
        chosen = rebuild.select(self.storage, self.cfg, days, "crashing") if days else None
        if chosen is not None:
            staged = staging.staged(self.storage, self.cfg.topic, chosen.claim.attempt_id)
            for source in chosen.sources[: len(chosen.sources) // 2 + 1]:
                rebuild.rebuild_source(source, self.cfg, self.storage, staged)
        return f"rebuild crash {days}"

    def config_fix(self) -> str:
        self.cfg_index = 1 - self.cfg_index
        return f"config {CONFIGS[self.cfg_index].strip() or 'UTC'}"

    def catch_up(self) -> str:
        runs = 0
        while self.archiver.run(self.cfg) is not None:
            runs += 1
            assert runs < 100, "the archive never caught up"
        return f"catch up in {runs} runs"


@pytest.mark.parametrize("root", ["file", "s3"])
@pytest.mark.parametrize("seed", SEEDS)
def test_random_faults_never_lose_or_double_a_record(
    seed, root, kafka, archiver, make_cfg, topic_name, request, stack_settings
) -> None:
    create_topic(kafka, topic_name, partitions=PARTITIONS)
    url, steps = None, STEPS
    if root == "s3":  # the same sequence on the real S3 server, shorter
        archiver = Archiver(archiver.spark, kafka, request.getfixturevalue("s3"))
        url = f"s3://{stack_settings.s3_conn_id}@{stack_settings.bucket}/faults-{topic_name}"
        steps = S3_STEPS
    extra = "max_records_per_partition: 15\n"
    cfgs = [make_cfg(topic_name, extra + c, root=url) for c in CONFIGS]
    rng = random.Random(seed)
    scenario = Scenario(rng, archiver, Kafka(kafka, topic_name), cfgs)
    ops, weights = zip(*OPS.items(), strict=True)
    try:
        for step in range(steps):
            op = rng.choices(ops, weights)[0]
            scenario.history.append(f"{step}: {getattr(scenario, op)()}")
            check_below_token(scenario.storage, topic_name, scenario.kafka)
        scenario.history.append(scenario.catch_up())
        check_matches_kafka(scenario.storage, topic_name, scenario.kafka)
    except Exception as err:
        replay = "\n".join(scenario.history[-40:])
        pytest.fail(f"seed {seed} ({root}) failed: {type(err).__name__}: {err}\n{replay}")
    print(f"seed {seed} ({root}): {steps} steps, {len(scenario.kafka.records)} records")
    print(Counter(line.split(": ", 1)[1].split()[0] for line in scenario.history[:-1]))
