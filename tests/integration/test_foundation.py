"""The foundation under every later feature: Kafka ranges through Spark and Airflow's metadata
database (the storage API's promises are `tests/storage_promises.py`, run on S3 by
`test_storage_s3.py`)."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path

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
