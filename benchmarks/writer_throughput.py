"""Where a Spark task's time goes: the Python side of one partition, in-process, no Kafka or Spark.

Builds N records as the Arrow batches the archive job's JVM side hands to `mapInArrow`
(`cairn.datafiles.fastpath.OUTPUT_COLUMNS`: coordinates, the backup datum, the partitioned datum and
event time; same events as archive_throughput.py, picked at random like ProducerPerformance does;
the datums are encoded here by fastavro, byte-identical to Spark's `to_avro`), then times, one after
the other on the same data, the whole `write_partition` into an attempt's staging area
(`cairn.protocol.commit.staged`) in a temp folder, as the Spark job calls it: when the JVM parsed
every value and the batches go in whole (as the job hands them: Python assembles blocks per folder),
the same record by record (`EncodedRecord`, the path a batch takes when it would evict files),
and when the JVM parsed none (every value through the Python reference parser, as for a topic
`cairn.datafiles.fastpath.gap` names or the records the fast path refuses).

    .venv/bin/python benchmarks/writer_throughput.py --records 100000 [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

import fastavro
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for spark_jobs

from archive_throughput import event_lines, topics_file

from cairn.datafiles.avro_file import BACKUP_SCHEMA
from cairn.datafiles.writer import EncodedRecord, encoded_records, write_partition
from cairn.formats import open_format
from cairn.formats.base import KafkaCoords, Parsed
from cairn.storage.layout import attempt_prefix
from cairn.storage.objects import Storage

ATTEMPT = "bench-writer"  # the attempt id the files' headers name and the staging folder
BATCH = 5000  # spark.sql.execution.arrow.maxRecordsPerBatch in spark_jobs/archive.py
SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("backup", pa.binary()),
        ("datum", pa.binary()),
        ("event_time", pa.int64()),
    ]
)
BACKUP = fastavro.parse_schema(BACKUP_SCHEMA)


def batches(cfg, count: int, spread_hours: int, seed: int, parsed: bool) -> list[pa.RecordBatch]:
    """The JVM's output for `count` records: with `parsed`, every value parsed and encoded."""
    payloads = event_lines(10_000, spread_hours, seed)
    rng = random.Random(seed)
    json_format, now = open_format(cfg), datetime.now(UTC)
    stamp = int(datetime(2025, 1, 1, tzinfo=UTC).timestamp() * 1000)
    out, rows = [], []
    for offset in range(count):
        value = rng.choice(payloads)
        backup = io.BytesIO()
        verbatim = {"topic": cfg.topic, "partition": 0, "offset": offset, "timestamp": stamp}
        verbatim |= {"timestamp_type": 0, "key": None, "value": value, "headers": []}
        fastavro.schemaless_writer(backup, BACKUP, verbatim)
        result = json_format.parse(value, KafkaCoords(0, offset, stamp), now) if parsed else None
        row = {**verbatim, "backup": backup.getvalue(), "datum": None, "event_time": None}
        if isinstance(result, Parsed):
            row |= {"datum": result.datum, "event_time": result.event_time}
        rows.append(row)
        if len(rows) == BATCH or offset == count - 1:
            out.append(pa.RecordBatch.from_pylist(rows, schema=SCHEMA))
            rows = []
    return out


def timed(label: str, count: int, fn: Callable[[], object]) -> None:
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    print(f"{label:<40} {seconds:7.2f} s  {count / seconds:10,.0f} records/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--spread-hours", type=int, default=48)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="cProfile write_partition")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cairn-writer-bench-"))
    cfg = topics_file(work / "topics.yaml", "bench.writer", work / "archive", args.records)
    n, now = args.records, datetime.now(UTC)
    fast = batches(cfg, n, args.spread_hours, args.seed, parsed=True)
    slow = batches(cfg, n, args.spread_hours, args.seed, parsed=False)

    def write(data: Callable[[], Iterable], attempt: str) -> Callable[[], None]:
        def run() -> None:
            staged = Storage(cfg.root.storage_url).child(attempt_prefix(cfg.topic, attempt))
            result = write_partition(data(), cfg, staged, now, attempt)
            print(f"{'':<40} {len(result.files)} files")

        return run

    def one_by_one() -> Iterable[EncodedRecord]:
        return (record for batch in fast for record in encoded_records(batch))

    print(f"{n:,} records, {sum(b.nbytes for b in fast) / 1e6:,.1f} MB of Arrow batches")
    try:
        jobs = [("JVM parsed all: Arrow batches", write(lambda: fast, ATTEMPT))]
        jobs.append(("JVM parsed all: record by record", write(one_by_one, ATTEMPT + "-1")))
        jobs.append(("Python parses all", write(lambda: slow, ATTEMPT + "-py")))
        for label, job in jobs:
            if args.profile:
                profile = cProfile.Profile()
                profile.runcall(timed, label, n, job)
                pstats.Stats(profile).sort_stats("tottime").print_stats(12)
            else:
                timed(label, n, job)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
