from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest

from cairn.storage.layout import (
    DataFile,
    attempt_prefix,
    backup_key,
    check_id,
    check_path_format,
    check_topic,
    claim_key,
    claim_numbers,
    data_prefixes,
    event_folder,
    folder_date,
    head_key,
    is_safe_folder,
    link_seq,
    manifest_key,
    parse_data_key,
    partitioned_key,
    pending_key,
    quarantine_key,
    token_key,
)


def test_keys_follow_the_documented_layout():
    assert backup_key("orders", 1, 3, 42) == (
        "backup/orders/partition=3/1_3_00000000000000000042.avro"
    )
    assert partitioned_key("orders", 2, 0, 7, "dt=2024-05-01/hr=13") == (
        "partitioned/orders/dt=2024-05-01/hr=13/2_0_00000000000000000007.avro"
    )
    assert quarantine_key("orders", 1, 0, 7, date(2024, 5, 1)) == (
        "quarantine/orders/dt=2024-05-01/1_0_00000000000000000007.avro"
    )
    assert token_key("orders", 12) == "_tokens/orders/000000000012.json"
    assert head_key("orders") == "_heads/orders.json"
    assert pending_key("orders", "a-1") == "_publishing/orders/a-1.json"
    assert claim_key("orders", "rebuild", 3, 2) == "_claims/orders/rebuild/000000000003-000002.json"
    assert attempt_prefix("orders", "a-1") == "_attempts/orders/a-1/"
    assert manifest_key("orders", "run-1.try2") == "_manifests/orders/run-1.try2.json"
    assert data_prefixes("a.b") == ["backup/a.b/", "partitioned/a.b/", "quarantine/a.b/"]


@pytest.mark.parametrize(
    "key",
    [
        backup_key("cairn.demo.events", 1, 11, 0),
        backup_key("t", 3, 0, 10**20 - 1),
        partitioned_key("my_topic-v2", 1, 4, 123, "dt=2024-01-02/hr=03"),
        partitioned_key("t", 1, 4, 123, "d=2024-01-02"),
        quarantine_key("t", 1, 2, 99, date(2030, 12, 31)),
    ],
)
def test_parse_data_key_inverts_the_builders(key):
    found = parse_data_key(key)
    assert found is not None and found.key == key


def test_parse_data_key_recovers_coordinates():
    found = parse_data_key(partitioned_key("t.x", 2, 5, 77, "dt=2024-01-02/hr=03"))
    assert found == DataFile("partitioned", "t.x", "dt=2024-01-02/hr=03", 2, 5, 77)


@pytest.mark.parametrize(
    "key",
    [
        "backup/t/partition=1/1_2_00000000000000000000.avro",  # folder and name disagree
        "backup/t/partition=1/1_1_0.avro",  # offset not 20 digits
        "backup/t/partition=1/01_1_00000000000000000000.avro",  # non-canonical generation
        "backup/t/partition=1/0_1_00000000000000000000.avro",  # generation 0
        "backup/t/partition=1/1_1_00000000000000000000.avro.tmp",
        "backup/t/1_1_00000000000000000000.avro",
        "quarantine/t/dt=2024-02-30/1_1_00000000000000000000.avro",
        "quarantine/t/day=2024-02-03/1_1_00000000000000000000.avro",
        "partitioned/t/../x/1_1_00000000000000000000.avro",
        "partitioned/t/dt=..%2F/1_1_00000000000000000000.avro",
        "partitioned/../dt=1/1_1_00000000000000000000.avro",
        "other/t/dt=1/1_1_00000000000000000000.avro",
        "_tokens/t/000000000001.json",
        "",
    ],
)
def test_parse_data_key_rejects_foreign_names(key):
    assert parse_data_key(key) is None


@pytest.mark.parametrize("topic", ["", ".", "..", "a/b", "a b", "ü", "x" * 250, "a\\b"])
def test_unsafe_topic_names_are_refused(topic):
    with pytest.raises(ValueError):
        check_topic(topic)
    with pytest.raises(ValueError):
        backup_key(topic, 1, 0, 0)


def test_bad_coordinates_and_ids_are_refused():
    with pytest.raises(ValueError):
        backup_key("t", 0, 0, 0)
    with pytest.raises(ValueError):
        backup_key("t", 1, -1, 0)
    with pytest.raises(ValueError):
        backup_key("t", 1, 0, 10**20)
    with pytest.raises(ValueError):
        manifest_key("t", "../x")
    with pytest.raises(ValueError):
        partitioned_key("t", 1, 0, 0, "dt=2024/../../etc")


def test_link_seq_reads_only_link_keys():
    assert link_seq(token_key("t", 5)) == 5
    assert link_seq("_rebuilds/t/000000000007.json") == 7
    assert link_seq("_tokens/t/5.json") is None
    assert link_seq("_tokens/t/000000000005.json.tmp") is None
    assert link_seq(claim_key("t", "archive", 5, 1)) is None


def test_claim_numbers_invert_claim_keys_and_nothing_else():
    assert claim_numbers(claim_key("t", "archive", 5, 12)) == (5, 12)
    assert claim_numbers(token_key("t", 5)) is None
    assert claim_numbers("_claims/t/archive/000000000005-1.json") is None


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a b", "x" * 201])
def test_unsafe_attempt_ids_are_refused(bad):
    with pytest.raises(ValueError):
        check_id(bad)
    with pytest.raises(ValueError):
        attempt_prefix("t", bad)


def test_link_and_claim_numbers_out_of_range_are_refused():
    with pytest.raises(ValueError):
        token_key("t", 10**12)
    with pytest.raises(ValueError):
        claim_key("t", "archive", 1, 0)
    with pytest.raises(ValueError):
        claim_key("t", "archive", 1, 10**6)


@pytest.mark.parametrize(
    "folder, safe",
    [
        ("dt=2024-01-01/hr=00", True),
        ("dt=2024-01-01/../hr=00", False),
        ("dt=..", False),
        ("dt=a\\b", False),
        ("dt=a\0", False),
        ("dt=2024-01-01/", False),
        ("2024-01-01", False),
    ],
)
def test_is_safe_folder(folder, safe):
    assert is_safe_folder(folder) is safe


def test_event_folder_renders_in_the_topic_timezone_and_round_trips_to_a_date():
    when = datetime(2024, 3, 31, 23, 30, tzinfo=UTC)
    assert event_folder("dt=%Y-%m-%d/hr=%H", when, UTC) == "dt=2024-03-31/hr=23"
    local = event_folder("dt=%Y-%m-%d/hr=%H", when, ZoneInfo("Europe/Berlin"))
    assert local == "dt=2024-04-01/hr=01"
    assert folder_date(local) == date(2024, 4, 1)
    assert folder_date("y=2024/m=04/d=01", "y=%Y/m=%m/d=%d") == date(2024, 4, 1)
    with pytest.raises(ValueError):
        event_folder("dt=%Y-%m-%d", datetime(2024, 1, 1), UTC)


@pytest.mark.parametrize("fmt", ["dt=%Y-%m-%d/hr=%H", "y=%Y/m=%m/d=%d", "date=%Y%m%d/min=%H%M"])
def test_valid_path_formats(fmt):
    assert check_path_format(fmt) == fmt


@pytest.mark.parametrize(
    "fmt",
    [
        "%Y/%m/%d",  # not Hive-style
        "dt=%Y-%m-%d/%H",
        "dt=%Y-%m",  # no day: a folder would span dates
        "dt=%Y-%m-%d/hr=%H/../x=1",
        "dt=%Y-%m-%d/hr=%I",  # not an allowed directive
        "dt=%Y-%m-%d/h r=%H",
        "DT=%Y-%m-%d",
        "dt=%Y-%m-%d/dt=%H",
        "dt=%Y.%m.%d",
        "dt=%Y-%m-%d/",
    ],
)
def test_invalid_path_formats(fmt):
    with pytest.raises(ValueError):
        check_path_format(fmt)
