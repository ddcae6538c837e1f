"""The CLI's pure pieces: showing bytes, range syntax and planning, and the index's binary search
over the token chain (tokens and manifests written by hand, no Avro files needed)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from botocore.exceptions import NoCredentialsError
from confluent_kafka import KafkaError, KafkaException

from cairn.cli import main
from cairn.cli.common import FOUND_PROBLEM, UNREACHABLE, USAGE, show_bytes
from cairn.cli.error_lines import explain
from cairn.config import TopicConfig
from cairn.datafiles.file_entry import FileEntry
from cairn.protocol.manifest import Manifest
from cairn.protocol.tokens import Token
from cairn.replay import Range, parse_bound, plan_ranges
from cairn.storage.layout import backup_key, manifest_key, token_key
from cairn.storage.objects import Storage
from cairn.views.finder import ArchiveIndex, NotArchived
from tests.unit.conftest import commit_next

NOW = datetime(2026, 11, 23, 3, 0, tzinfo=UTC)


def test_show_bytes_escapes_control_and_invalid_bytes_and_cuts_long_values() -> None:
    assert show_bytes(None) == "null"
    assert show_bytes(b'{"a": 1}') == '{"a": 1}'
    assert show_bytes("café".encode()) == "café"
    assert show_bytes(b"\xff\x00a\nb\x1b[31m") == "\\xff\\x00a\\nb\\x1b[31m"
    assert show_bytes(b"x" * 300, limit=10) == "xxxxxxxxxx… (300 bytes)"


def test_parse_bound_reads_partition_colon_offset_only() -> None:
    assert parse_bound("0:1500") == (0, 1500)
    assert parse_bound(" 3:0 ") == (3, 0)
    for bad in ("1500", "0:", "a:1", "0:-1", "0:1:2"):
        with pytest.raises(ValueError, match="PARTITION:OFFSET"):
            parse_bound(bad)


def test_plan_ranges_defaults_to_the_archive_and_refuses_past_it() -> None:
    position = {0: 10, 1: 5, 2: 0}
    assert plan_ranges({}, {}, position) == [Range(0, 0, 10), Range(1, 0, 5)]
    assert plan_ranges({0: 3}, {0: 7}, position) == [Range(0, 3, 7)]
    assert plan_ranges({1: 2}, {0: 4}, position) == [Range(0, 0, 4), Range(1, 2, 5)]
    with pytest.raises(NotArchived, match="only below offset 10"):
        plan_ranges({}, {0: 11}, position)
    with pytest.raises(ValueError, match="not below"):
        plan_ranges({0: 7}, {0: 7}, position)


def _entry(kind: str, partition: int, first: int, last: int, key: str | None = None) -> FileEntry:
    key = key or backup_key("t", 1, partition, first)
    return FileEntry(
        key=key,
        kind=kind,
        partition=partition,
        records=last - first + 1,
        first_offset=first,
        last_offset=last,
        bytes=1,
    )


def _commit(storage: Storage, seq: int, previous: dict, nxt: dict, files: list) -> None:
    attempt = f"a-{seq}"
    m = Manifest(
        topic="t",
        attempt_id=attempt,
        run_id="r",
        generation=1,
        ranges={p: (previous.get(p, 0), n) for p, n in nxt.items()},
        records_read={},
        files=files,
        processing_time=NOW,
        created_at=NOW,
    )
    storage.write(manifest_key("t", attempt), m.model_dump_json().encode())
    token = Token(
        seq=seq,
        topic="t",
        generation=1,
        next_offsets=nxt,
        previous_offsets=previous,
        manifest=None if not files else manifest_key("t", attempt),
        run_id="r",
        created_at=NOW,
        planned_at=NOW,
    )
    storage.write(token_key("t", seq), token.model_dump_json().encode())


@pytest.fixture
def index(tmp_path) -> ArchiveIndex:
    """Partition 0 read in runs [0, 10), [10, 20), nothing, [20, 35); partition 1 appears in
    run 2 and has a hole at offset 13 (a transaction marker)."""
    storage = Storage(tmp_path.as_uri())
    _commit(storage, 1, {}, {0: 10}, [_entry("backup", 0, 0, 9)])
    _commit(
        storage,
        2,
        {0: 10},
        {0: 20, 1: 15},
        [_entry("backup", 0, 10, 19), _entry("backup", 1, 0, 12), _entry("backup", 1, 14, 14)],
    )
    _commit(storage, 3, {0: 20, 1: 15}, {0: 20, 1: 15}, [])
    _commit(storage, 4, {0: 20, 1: 15}, {0: 35, 1: 15}, [_entry("backup", 0, 20, 34)])
    return ArchiveIndex(storage, "t")


def test_covering_finds_the_run_that_read_an_offset(index) -> None:
    assert [index.covering(0, o).seq for o in (0, 9, 10, 19, 20, 34)] == [1, 1, 2, 2, 4, 4]
    assert index.covering(0, 35) is None
    assert index.covering(1, 0).seq == 2
    assert index.position() == {0: 35, 1: 15}


def test_backup_files_reads_only_the_runs_meeting_a_range(index) -> None:
    def keys(p: int, start: int, end: int) -> list[int]:
        return [b.entry.first_offset for b in index.backup_files(p, start, end)]

    assert keys(0, 9, 10) == [0]
    assert keys(0, 9, 21) == [0, 10, 20]
    assert keys(0, 10, 20) == [10]
    assert keys(1, 13, 15) == [14]
    assert keys(0, 35, 40) == []
    index._tokens.clear()
    keys(0, 25, 30)
    assert len(index.read_so_far()) <= 3  # a binary search, not a scan of the chain


def test_find_past_the_position_says_how_far_the_archive_goes(index) -> None:
    with pytest.raises(NotArchived, match="below offset 35"):
        index.find(0, 35)


def test_usage_errors_exit_2_naming_the_problem(tmp_path, capsys) -> None:
    topics = tmp_path / "topics.yaml"
    topics.write_text(
        f"topics:\n  - topic: t\n    format: raw\n    archive_root: {tmp_path.as_uri()}\n"
    )
    base = ["--topics-file", str(topics)]
    assert main([*base, "find", "nope", "0", "1"]) == 2
    assert "'nope' is not configured" in capsys.readouterr().err
    assert main([*base, "replay", "t", "--to-topic", "t"]) == 2
    assert "--force" in capsys.readouterr().err
    assert main([*base, "replay", "t", "--to-topic", "u", "--from", "0-3"]) == 2
    assert "PARTITION:OFFSET" in capsys.readouterr().err
    assert main([*base, "cat", "t", "--file", "backup/t/partition=0/x.avro"]) == 2
    assert "is not the key of a quarantine file of topic 't'" in capsys.readouterr().err
    assert main([*base, "cat", "t", "--key", "backup/t/partition=0/x.avro"]) == 2  # old spelling
    assert "is not the key of a quarantine file" in capsys.readouterr().err


def test_topics_file_mistakes_are_one_line_naming_file_line_and_field(tmp_path, capsys) -> None:
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - topic: t\n    format: raw\n   schedule: x\n")
    assert main(["--topics-file", str(topics), "tokens", "list", "t"]) == 2
    assert capsys.readouterr().err == (
        f"error: topic 't' is not configured in {topics}; the topics files have errors: "
        f"{topics}, line 4: not valid YAML at column 4: expected <block end>, but found "
        "'<block mapping start>'; fix the file there\n"
    )
    topics.write_text("topics:\n  - topic: t\n    format: raw\n    schedule: every minute\n")
    assert main(["--topics-file", str(topics), "tokens", "list", "t"]) == 2
    assert capsys.readouterr().err == (
        f"error: {topics}, line 4: topic 't': schedule: 'every minute' is neither a 5-field cron "
        "expression nor a preset; fix the entry\n"
    )


def test_status_names_a_topic_two_patterns_match_and_shows_the_others(tmp_path, capsys) -> None:
    """Patterns match the topics archived under their root; the overlapped one is a mistake."""
    root = Storage(f"file://{tmp_path}/archive")
    for topic in ("orders.eu", "orders.us"):
        commit_next(root, {0: 1}, topic=topic)
    topics = tmp_path / "topics.yaml"
    topics.write_text(
        f"defaults: {{format: raw, archive_root: '{root.url}'}}\n"
        "topics:\n  - pattern: 'orders[.].+'\n  - pattern: '.+[.]us'\n"
    )
    assert main(["--topics-file", str(topics), "status"]) == 2
    out, err = capsys.readouterr()
    assert "orders.eu" in out and "orders.us" not in out
    assert f"misconfigured: {topics}, line 3: topic 'orders.us': pattern: matched by" in err


def test_debug_shows_the_traceback_instead(tmp_path) -> None:
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics: [")
    with pytest.raises(LookupError, match="line 1: not valid YAML at column 10"):
        main(["--topics-file", str(topics), "--debug", "tokens", "list", "t"])


def test_failures_are_worded_once_with_their_exit_codes() -> None:
    s3 = TopicConfig(topic="t", format="raw", archive_root="s3://lake@bucket/x")
    code, line = explain(NoCredentialsError(), s3)
    assert code == USAGE
    assert line.startswith("error: no AWS credentials for archive root s3://lake@bucket/x: ")
    assert "export the Airflow connection 'lake' as AIRFLOW_CONN_LAKE" in line
    down = KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))
    assert explain(down, s3) == (
        UNREACHABLE,
        "error: Kafka: Broker transport failure; check that the bootstrap servers are right and "
        "Kafka is up (--bootstrap-servers, --kafka-config, CAIRN_KAFKA_CONFIG), then run again",
    )
    assert explain(RuntimeError("two\n  lines"), None) == (
        FOUND_PROBLEM,
        "failed: RuntimeError: two lines (--debug shows where)",
    )
