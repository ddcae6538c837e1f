"""PEERS, NOT CAIRN: plain Spark on one date of an archive, what `seal_day.py` compares with.

`rewrite`: what a user would write to compact a date by hand — read the date folder's Avro
files (Spark finds the `hr=` folders), write them back as one deflate Avro file per hour folder,
and with `--parquet` also as one zstd Parquet file per hour (what sealing writes for the
table). It checks nothing, names nothing after the backup, counts no proof and commits nothing.

`scan`: a day-scan query — `count(*)`, and `count(*)` per `action` — over Avro folders (the
files are listed afresh for every query) and over an Iceberg table by name through its catalog
(`<catalog>.cairn.<table> WHERE _event_date = D`); each source is timed `--rounds` times, the
sources in turn, after one untimed warm-up query on each. Prints one line `RESULT <json>`.

    spark-submit benchmarks/spark_day.py rewrite --input DIR --output DIR [--parquet DIR --date D]
    spark-submit benchmarks/spark_day.py scan --folder NAME=DIR ... [--table NAME --date D]

The catalog's Spark settings (`cairn.table.catalog.spark_conf`) come as JSON in
`CAIRN_BENCH_SPARK_CONF`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

SPARK_CONF = "CAIRN_BENCH_SPARK_CONF"


def rewrite(spark: SparkSession, args: argparse.Namespace) -> dict:
    day = spark.read.format("avro").load(args.input)
    by_hour = day.repartition("hr").write.partitionBy("hr")
    by_hour.format("avro").option("compression", "deflate").save(args.output)
    if args.parquet:
        table = day.withColumn("_event_date", F.lit(args.date).cast("date")).repartition("hr")
        table.write.partitionBy("hr").option("compression", "zstd").parquet(args.parquet)
    return {}


def scan(spark: SparkSession, args: argparse.Namespace) -> dict:
    sources = {}
    for given in args.folder:
        name, folder = given.split("=", 1)
        sources[name] = lambda folder=folder: spark.read.format("avro").load(folder)
    if args.table:
        where = f"_event_date = DATE '{args.date}'"
        sources["table"] = lambda: spark.table(args.table).where(where)

    def count(frame: DataFrame) -> dict:
        return {"rows": frame.count()}

    def by_action(frame: DataFrame) -> dict:
        rows = frame.groupBy("action").count().collect()
        return {r["action"]: r["count"] for r in rows}

    queries = {"count": count, "group_by_action": by_action}
    for frame in sources.values():  # warm-up: JVM code paths, each source's first load
        count(frame())
    seconds = {s: {q: [] for q in queries} for s in sources}
    answers: dict = {s: {} for s in sources}
    for _ in range(args.rounds):
        for source, frame in sources.items():
            for query, run in queries.items():
                start = time.perf_counter()
                answers[source][query] = run(frame())  # listing and planning included
                seconds[source][query].append(round(time.perf_counter() - start, 3))
    return {"seconds": seconds, "answers": answers}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    jobs = parser.add_subparsers(dest="job", required=True)
    one = jobs.add_parser("rewrite")
    one.add_argument("--input", required=True)
    one.add_argument("--output", required=True)
    one.add_argument("--parquet", help="also write Parquet files here")
    one.add_argument("--date", help="the date, as the Parquet files' _event_date")
    two = jobs.add_parser("scan")
    two.add_argument("--folder", action="append", default=[], help="NAME=DIR of Avro files")
    two.add_argument("--table", help="<catalog>.cairn.<table>")
    two.add_argument("--date")
    two.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    builder = SparkSession.builder.appName(f"plain-spark-{args.job}")
    for key, value in json.loads(os.environ.get(SPARK_CONF) or "{}").items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    found = rewrite(spark, args) if args.job == "rewrite" else scan(spark, args)
    spark.stop()
    print("RESULT " + json.dumps(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
