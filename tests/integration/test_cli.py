"""`python -m cairn` on a real archive: one topic archived once (valid and poison records, keys,
headers, CreateTimes) by a real Kafka and Spark, shared by the tests of this module; replay
round-trips through Kafka and a second archive."""

from __future__ import annotations

import io
import json
import shutil
import textwrap
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

import fastavro
import pytest
from confluent_kafka import Producer

from cairn.cli import main
from cairn.config import TopicConfig
from cairn.protocol import commit
from cairn.storage.objects import Storage
from cairn.topics_file import find_topic
from cairn_stack.demo import create_topic
from tests.integration.conftest import DEMO_SCHEMA, Archiver, read_archive

NOW = datetime.now(UTC).replace(microsecond=0)
BASE_MS = int(NOW.timestamp() * 1000) - 3_600_000
POISON = b"\xff\x00not json\x1b[31m"


def event(p: int, i: int) -> bytes:
    body = {"event_id": f"e{p}-{i}", "user_id": "u1", "action": "view", "amount": 1.5}
    return json.dumps({**body, "ts": NOW.isoformat()}).encode()


def topics_entry(topic: str, root: Path) -> str:
    return textwrap.dedent(f"""
        - topic: {topic}
          format: json
          schema: {DEMO_SCHEMA}
          event_time: {{field: ts, encoding: iso8601}}
          archive_root: {root.as_uri()}
        """)


def write_topics(path: Path, *entries: str) -> str:
    path.write_text("topics:\n" + textwrap.indent("".join(entries), "  "))
    return str(path)


@dataclass
class Archived:
    cfg: TopicConfig
    topics_file: str
    archiver: Archiver
    root: Path
    processing_day: date

    @property
    def topic(self) -> str:
        return self.cfg.topic

    def cli(self, *args: str) -> int:
        return main(["--topics-file", self.topics_file, *args])


@pytest.fixture(scope="module")
def archived(spark, kafka, tmp_path_factory) -> Archived:
    """Partition 0: offsets 0..5, poison at 3; partition 1: offsets 0..3, poison at 1. Every
    record has a key, two headers (one null) and its own CreateTime."""
    tmp = tmp_path_factory.mktemp("cli")
    topic = f"it.cli-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka})
    for p, count, poison in ((0, 6, 3), (1, 4, 1)):
        for i in range(count):
            producer.produce(
                topic,
                value=POISON if i == poison else event(p, i),
                key=f"k{p}-{i}".encode(),
                partition=p,
                headers=[("trace", f"t{p}-{i}".encode()), ("empty", None)],
                timestamp=BASE_MS + p * 100_000 + i * 1000,
            )
    assert producer.flush(30) == 0
    root = tmp / "archive"
    topics_file = write_topics(tmp / "topics.yaml", topics_entry(topic, root))
    cfg = find_topic(topic, topics_file)
    archiver = Archiver(spark, kafka, {})
    summary = archiver.run(cfg)
    assert summary.counts.backup == 10 and summary.counts.quarantined == 2
    token = commit.newest(archiver.storage(cfg), topic)
    return Archived(cfg, topics_file, archiver, root, token.planned_at.date())


def test_status_shows_each_topic_s_position_and_last_run(archived, capsys) -> None:
    assert archived.cli("status") == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if archived.topic in line)
    assert "0:6 1:4" in line and "token 1" in line and "10 read" in line


def test_files_lists_a_date_s_files_with_their_manifest_counts(archived, capsys) -> None:
    assert archived.cli("files", archived.topic, "--date", NOW.date().isoformat()) == 0
    out = capsys.readouterr().out
    parsed = [line for line in out.splitlines() if f"partitioned/{archived.topic}/" in line]
    assert len(parsed) == 2 and all("token 1" in line for line in parsed)
    assert [line.split("│")[4].strip() for line in parsed] == ["5", "3"]
    if archived.processing_day == NOW.date():
        assert out.count(f"quarantine/{archived.topic}/dt=") == 2
        assert "10" in out.split("total")[1]

    assert archived.cli("files", archived.topic, "--date", "2001-01-01") == 1


def test_find_names_the_backup_record_and_where_it_was_filed(archived, capsys) -> None:
    assert archived.cli("find", archived.topic, "0", "2") == 0
    out = capsys.readouterr().out
    assert f"backup/{archived.topic}/partition=0/1_0_00000000000000000000.avro" in out
    assert f"partitioned/{archived.topic}/dt={NOW:%Y-%m-%d}/hr={NOW:%H}/1_0_" in out
    assert '"event_id": "e0-2"' in out and "k0-2" in out and "trace=t0-2, empty=null" in out
    assert f"({'CreateTime'}, {BASE_MS + 2000})" in out

    assert archived.cli("find", archived.topic, "1", "1") == 0
    out = capsys.readouterr().out
    assert f"quarantine/{archived.topic}/dt={archived.processing_day}/1_1_" in out
    assert "reason" in out and "\x1b" not in out and "\\xff\\x00not json\\x1b[31m" in out

    assert archived.cli("find", archived.topic, "0", "6") == 1
    assert "not archived yet" in capsys.readouterr().err


def test_cat_shows_quarantined_records_with_reasons_and_escaped_values(archived, capsys) -> None:
    assert archived.cli("cat", archived.topic, "--date", archived.processing_day.isoformat()) == 0
    out = capsys.readouterr().out
    assert "2 quarantined records in 2 files" in out
    rows = [line for line in out.splitlines() if "\\xff\\x00not json" in line]
    assert len(rows) == 2 and "\x1b" not in out and "\x00" not in out
    key = next(
        k
        for k in Storage(archived.root.as_uri()).list(f"quarantine/{archived.topic}/")
        if "/1_1_" in k
    )
    assert archived.cli("cat", archived.topic, "--key", key, "--limit", "1") == 0
    assert "1 quarantined records in 1 files" in capsys.readouterr().out


def test_verify_passes_then_names_every_mismatch(archived, tmp_path, capsys) -> None:
    day = NOW.date().isoformat()
    assert archived.cli("verify", archived.topic, "--date", day) == 0
    same_day = archived.processing_day == NOW.date()  # quarantine is filed by processing date
    counts = "10 records (8 partitioned, 2 quarantined)" if same_day else "8 records (8 partit"
    out = capsys.readouterr().out
    assert f"OK, every backup record of the date is in it exactly once: {counts}" in out

    copy = tmp_path / "archive"
    shutil.copytree(archived.root, copy)
    topics = write_topics(tmp_path / "topics.yaml", topics_entry(archived.topic, copy))
    storage = Storage(copy.as_uri())
    p0, p1 = sorted(storage.list(f"partitioned/{archived.topic}/"))
    reader = fastavro.reader(io.BytesIO(storage.read(p0)))
    first = next(reader)
    shortened = io.BytesIO()
    fastavro.writer(shortened, reader.writer_schema, [first])
    storage.write(p0, shortened.getvalue())
    storage.delete(p1)

    assert main(["--topics-file", topics, "verify", archived.topic, "--date", day]) == 1
    out = capsys.readouterr().out
    assert f"date {day}: MISMATCH: missing partition" in out.splitlines()[0]
    assert "1 records, token 1 says 5" in out
    assert f"{p1} is missing (token 1 committed it)" in out


def test_replay_round_trips_keys_headers_and_timestamps_exactly(archived, kafka, capsys) -> None:
    target = f"{archived.topic}-replay"
    create_topic(kafka, target, partitions=2)
    args = ["replay", archived.topic, "--to-topic", target, "--bootstrap-servers", kafka]
    ranges = ["--from", "0:1", "--to", "0:5", "--from", "1:1"]

    assert archived.cli(*args, *ranges) == 0

    out = capsys.readouterr().out
    assert "partition 0 [1, 5): 4 records" in out and "partition 1 [1, 4): 3 records" in out
    assert "replayed 7 records" in out
    root = archived.root.parent / "replayed"
    topics = write_topics(root.parent / "replayed.yaml", topics_entry(target, root))
    cfg = find_topic(target, topics)
    assert archived.archiver.run(cfg).counts.backup == 7

    def kept(row: dict) -> tuple:
        return (row["partition"], row["key"], row["value"], row["headers"], row["timestamp"])

    source = read_archive(archived.archiver.storage(archived.cfg), archived.topic).backup
    wanted = sorted(
        (
            r
            for r in source
            if (r["partition"], r["offset"]) in {(0, 1), (0, 2), (0, 3), (0, 4)}
            or (r["partition"] == 1 and r["offset"] >= 1)
        ),
        key=lambda r: (r["partition"], r["offset"]),
    )
    replayed = read_archive(archived.archiver.storage(cfg), target).backup
    replayed.sort(key=lambda r: (r["partition"], r["offset"]))
    assert [kept(r) for r in replayed] == [kept(r) for r in wanted]
    assert all(r["timestamp_type"] == 0 for r in replayed)
    assert [r["value"] for r in replayed if r["partition"] == 0][2] == POISON


def test_replay_refuses_the_source_topic_a_missing_target_and_an_unarchived_range(
    archived, kafka, capsys
) -> None:
    base = ["replay", archived.topic, "--bootstrap-servers", kafka]
    assert archived.cli(*base, "--to-topic", archived.topic) == 2
    assert "is the archived topic itself" in capsys.readouterr().err
    assert archived.cli(*base, "--to-topic", f"absent-{uuid.uuid4().hex[:6]}") == 2
    assert "create it first" in capsys.readouterr().err
    assert archived.cli(*base, "--to-topic", "x", "--to", "0:7") == 1
    assert "only below offset 6" in capsys.readouterr().err
    assert archived.cli(*base, "--to-topic", "x", "--from", "1:2", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "partition 1 [2, 4): 1 backup files" in out


def test_after_a_rebuild_the_rebuilt_files_are_found_and_verified(archived, tmp_path, capsys):
    copy = tmp_path / "archive"
    shutil.copytree(archived.root, copy)
    topics = write_topics(tmp_path / "topics.yaml", topics_entry(archived.topic, copy))
    cfg = find_topic(archived.topic, topics)
    assert archived.archiver.rebuild(cfg, NOW.date()) is not None
    day = NOW.date().isoformat()

    def cli(*args: str) -> int:
        return main(["--topics-file", topics, *args])

    assert cli("files", archived.topic, "--date", day) == 0
    parsed = [
        line
        for line in capsys.readouterr().out.splitlines()
        if f"partitioned/{archived.topic}/" in line
    ]
    assert len(parsed) == 2 and all("rebuild 2" in line for line in parsed)
    assert cli("verify", archived.topic, "--date", day) == 0
    assert ": OK, every backup record of the date is in it exactly once" in capsys.readouterr().out
    assert cli("find", archived.topic, "0", "2") == 0
    assert "(rebuild 2)" in capsys.readouterr().out
