"""Where a Spark task's time goes: the Python side of one partition, in-process, no Kafka or Spark.

Builds N records as the Arrow batches Spark's Kafka source hands to `mapInArrow` (same events as
archive_throughput.py, picked at random like ProducerPerformance does), then times, one after the
other on the same data: the Arrow-to-record conversion of spark_jobs/archive.py, the JSON parser
alone, and the whole `write_partition` (conversion + parse + Avro + files) into an attempt's
staging area (`cairn.staging.staged`) in a temp folder, as the Spark job calls it.

    .venv/bin/python benchmarks/writer_throughput.py --records 100000 [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for spark_jobs

from archive_throughput import event_lines, topics_file

from cairn import staging
from cairn.formats import open_format
from cairn.formats.base import KafkaCoords
from cairn.storage import Storage
from cairn.writer import write_partition
from spark_jobs.archive import records

ATTEMPT = "bench-writer"  # the attempt id the files' headers name and the staging folder
BATCH = 5000  # spark.sql.execution.arrow.maxRecordsPerBatch in spark_jobs/archive.py
SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)


def batches(topic: str, count: int, spread_hours: int, seed: int) -> list[pa.RecordBatch]:
    payloads = event_lines(10_000, spread_hours, seed)
    rng = random.Random(seed)
    now = int(datetime(2025, 1, 1, tzinfo=UTC).timestamp() * 1_000_000)
    out = []
    for start in range(0, count, BATCH):
        n = min(BATCH, count - start)
        columns = {
            "key": [None] * n,
            "value": [rng.choice(payloads) for _ in range(n)],
            "topic": [topic] * n,
            "partition": [0] * n,
            "offset": list(range(start, start + n)),
            "timestamp": [now] * n,
            "timestampType": [0] * n,
            "headers": [[] for _ in range(n)],
        }
        out.append(pa.RecordBatch.from_pydict(columns, schema=SCHEMA))
    return out


def timed(label: str, count: int, fn: Callable[[], object]) -> None:
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    print(f"{label:<34} {seconds:7.2f} s  {count / seconds:10,.0f} records/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--spread-hours", type=int, default=48)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="cProfile write_partition")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cairn-writer-bench-"))
    cfg = topics_file(work / "topics.yaml", "bench.writer", work / "archive", args.records)
    data = batches("bench.writer", args.records, args.spread_hours, args.seed)
    json_format = open_format(cfg)
    now = datetime.now(UTC)
    staged = staging.staged(Storage(cfg.root.storage_url), cfg.topic, ATTEMPT)

    def convert() -> None:
        for _ in records(iter(data)):
            pass

    def parse() -> None:
        for r in records(iter(data)):
            json_format.parse(r.value, KafkaCoords(0, r.offset, r.timestamp), now)

    def write() -> None:
        result = write_partition(records(iter(data)), cfg, staged, now, ATTEMPT)
        print(f"{'':<34} {len(result.files)} files")

    n = args.records
    print(f"{n:,} records, {sum(b.nbytes for b in data) / 1e6:,.1f} MB of Arrow batches")
    timed("Arrow -> KafkaRecord (records())", n, convert)
    timed("  + parse", n, parse)
    try:
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(timed, "write_partition (everything)", n, write)
            pstats.Stats(profile).sort_stats("tottime").print_stats(15)
        else:
            timed("write_partition (everything)", n, write)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
