"""The foundation under every later feature: Kafka ranges through Spark, the storage API on
both kinds of archive root, and Airflow's metadata database."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path

import pytest

from cairn.storage.objects import ObjectExists, Storage
from cairn_stack import services
from cairn_stack.demo import create_topic, produce
from cairn_stack.process import free_port_block


def test_spark_reads_exactly_the_requested_offset_range(kafka: str, spark) -> None:
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, partitions=2)
    produce(kafka, topic, (f"p0-{i}".encode() for i in range(40)), partition=0)
    produce(kafka, topic, (f"p1-{i}".encode() for i in range(40)), partition=1)

    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka)
        .option("assign", json.dumps({topic: [0, 1]}))
        .option("startingOffsets", json.dumps({topic: {"0": 10, "1": 0}}))
        .option("endingOffsets", json.dumps({topic: {"0": 25, "1": 3}}))
        .option("failOnDataLoss", "true")
        .load()
        .select("partition", "offset", "value")
        .collect()
    )
    got = sorted((r.partition, r.offset, bytes(r.value).decode()) for r in rows)

    expected = [(0, i, f"p0-{i}") for i in range(10, 25)] + [(1, i, f"p1-{i}") for i in range(3)]
    assert got == expected  # ending offsets (25 and 3) are exclusive


@pytest.fixture(params=["file", "s3"])
def storage(request, tmp_path, stack_settings) -> Storage:
    if request.param == "file":
        return Storage(f"file://{tmp_path}/archive")
    options = request.getfixturevalue("s3")
    return Storage(f"s3://{stack_settings.bucket}/t-{uuid.uuid4().hex[:8]}", **options)


def test_storage_write_read_list_delete(storage: Storage) -> None:
    storage.write("backup/t/partition=0/a.avro", b"one")
    storage.write("backup/t/partition=1/b.avro", b"two")
    storage.write("backup/t/partition=0/a.avro", b"one again")

    assert storage.read("backup/t/partition=0/a.avro") == b"one again"
    assert storage.list("backup/t") == [
        "backup/t/partition=0/a.avro",
        "backup/t/partition=1/b.avro",
    ]
    assert storage.list("nothing/here") == []

    storage.delete("backup/t/partition=0/a.avro")
    storage.delete("backup/t/partition=0/a.avro")  # deleting twice is fine
    assert storage.list() == ["backup/t/partition=1/b.avro"]


def test_storage_lists_children_and_keys_after_a_bound(storage: Storage) -> None:
    for offset in (0, 5, 12, 40):
        storage.write(f"backup/t/partition=0/1_0_{offset:020d}.avro", b"x")
    storage.write("backup/t/partition=0/sub/deeper.avro", b"x")

    after = storage.list_after("backup/t/partition=0", f"1_0_{12:020d}")
    assert after == [
        f"backup/t/partition=0/1_0_{12:020d}.avro",
        f"backup/t/partition=0/1_0_{40:020d}.avro",
    ]  # only direct children, from the bound on
    assert storage.children("backup/t/") == ["backup/t/partition=0/"]
    assert storage.children("backup/t/partition=0/")[-1] == "backup/t/partition=0/sub/"
    assert storage.list_after("nothing/here", "") == [] and storage.children("nothing/") == []


def test_storage_moves_reads_heads_and_deletes_folders(storage: Storage) -> None:
    storage.write("_attempts/t/a1/backup/t/partition=0/x.avro", b"0123456789")
    staged = storage.child("_attempts/t/a1")
    assert staged.read("backup/t/partition=0/x.avro") == b"0123456789"
    assert storage.read_head("_attempts/t/a1/backup/t/partition=0/x.avro", 4) == b"0123"

    storage.move("_attempts/t/a1/backup/t/partition=0/x.avro", "backup/t/partition=0/x.avro")
    storage.move("_attempts/t/a1/backup/t/partition=0/x.avro", "backup/t/partition=0/x.avro")

    assert storage.read("backup/t/partition=0/x.avro") == b"0123456789"
    storage.write("_attempts/t/a1/other/y", b"y")
    storage.delete_prefix("_attempts/t/a1/")
    storage.delete_prefix("_attempts/t/a1/")  # twice is fine
    assert storage.list() == ["backup/t/partition=0/x.avro"]
    with pytest.raises(FileNotFoundError):
        storage.move("_attempts/t/a2/missing", "backup/t/partition=0/missing.avro")


def test_storage_create_is_atomic_create_if_absent(storage: Storage) -> None:
    storage.create("_tokens/t/000000000001.json", b'{"seq": 1}')
    with pytest.raises(ObjectExists):
        storage.create("_tokens/t/000000000001.json", b'{"seq": "impostor"}')
    assert storage.read("_tokens/t/000000000001.json") == b'{"seq": 1}'


def test_storage_stream_failure_leaves_no_object(storage: Storage) -> None:
    with pytest.raises(RuntimeError), storage.open_write("backup/t/partition=0/x.avro") as out:
        out.write(b"partial" * 1000)
        raise RuntimeError("writer crashed")
    assert storage.list() == []

    with storage.open_write("backup/t/partition=0/x.avro") as out:
        out.write(b"whole")
    assert storage.list() == ["backup/t/partition=0/x.avro"]


def test_storage_refuses_keys_escaping_the_root(storage: Storage) -> None:
    for key in ("../outside", "backup/../../x", "a//b", ""):
        with pytest.raises(ValueError, match="invalid storage key"):
            storage.write(key, b"x")


def test_postgres_keeps_its_data_and_shuts_down_cleanly_with_a_client_connected(
    tmp_path, stack_settings
) -> None:
    """Airflow's metadata database: first start creates it (as root too, where PostgreSQL
    itself refuses to run), a restart keeps what was written, and `down` stops it cleanly even
    while a client holds a connection (a plain SIGTERM would wait for that client forever)."""
    import psycopg2

    settings = stack_settings.model_copy(
        update={"state_dir": tmp_path, "postgres_port": free_port_block(1)[0]}
    )
    dsn = settings.postgres_url
    service = services.postgres(settings)
    service.start(settings.start_timeout)
    try:
        db = psycopg2.connect(dsn)
        with db, db.cursor() as cur:
            cur.execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('x')")
        assert service.stop()
        db.close()
        assert "database system is shut down" in service.log.read_text()

        service.start(settings.start_timeout)
        with contextlib.closing(psycopg2.connect(dsn)) as db, db.cursor() as cur:
            cur.execute("SELECT v FROM kept")
            assert cur.fetchall() == [("x",)]
    finally:
        service.stop()


def test_every_service_of_the_stack_listens_on_loopback_only(
    airflow, kafka, s3, stack_settings
) -> None:
    groups = {
        int(path.read_text().split()[0]) for path in (stack_settings.state_dir / "pids").iterdir()
    }
    sockets = _listening_sockets()
    found = []
    for pid in _pids_in_groups(groups):
        for inode in _socket_inodes(pid):
            if inode in sockets:
                found.append((_command(pid), *sockets[inode]))
    assert {name for name, *_ in found} >= {"java", "weed"}  # Kafka, Spark, SeaweedFS seen
    exposed = [(name, address, port) for name, address, port in found if not _loopback(address)]
    assert not exposed, f"listening beyond loopback: {sorted(set(exposed))}"


def _pids_in_groups(groups: set[int]) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[2]) in groups:  # field 5: process group
                pids.append(int(entry.name))
    return pids


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def _listening_sockets() -> dict[int, tuple[str, int]]:
    """inode -> (local address, port) of every TCP socket in LISTEN state."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port = fields[1].split(":")
            if fields[3] == "0A":  # LISTEN
                found[int(fields[9])] = (address, int(port, 16))
    return found


def _loopback(address: str) -> bool:
    """127.0.0.0/8 (hex, little-endian per 32-bit word) or ::1 or ::ffff:127.x in /proc form."""
    if len(address) == 8:
        return address.endswith("7F")
    return address == "00000000000000000000000001000000" or (
        address.startswith("0000000000000000FFFF0000") and address.endswith("7F")
    )


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
