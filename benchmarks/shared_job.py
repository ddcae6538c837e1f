"""Shared Spark jobs beside a job per run: the Spark time of N small archive runs, in one sitting.

A burst on many topics leaves many small runs ready at once. Before shared jobs each run was a
Spark job of its own, two at a time (the `cairn_spark` pool's two slots); now the runs ready
together are staged by one job (`spark_jobs.archive.archive`). This starts a private Kafka,
fills `--topics` topics (2 partitions, `--records` records each), and in each of `--rounds`
rounds plans one run per topic and stages them both ways, alternating which goes first: one job
per run on two threads (the pool), and one shared job. Each run is then verified and committed,
so every round archives for real and the next round's runs read new records. Both arms run on
the same local[2] SparkSession in this process, with the same code and data.

    .venv/bin/python benchmarks/shared_job.py                  # 50 topics, 3 rounds
    .venv/bin/python benchmarks/shared_job.py --topics 200 --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from archive_throughput import console, git_commit, machine, private_kafka
from requests_per_run import local_spark, topic_config

from cairn.jobs import ArchiveInput
from cairn.kafka.connection import KafkaConf
from cairn.pipeline import archive_run
from cairn.storage.objects import Storage
from cairn_stack.demo import create_topic, produce, sample_events
from cairn_stack.settings import REPO

PARTITIONS = 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=50)
    parser.add_argument("--records", type=int, default=20, help="per partition and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from spark_jobs.archive import archive

    with ExitStack() as stack, tempfile.TemporaryDirectory() as work_dir:
        work = Path(work_dir)
        bootstrap = stack.enter_context(private_kafka(work / "kafka"))
        kafka = KafkaConf.from_bootstrap(bootstrap, "the benchmark's broker")
        root = (work / "archive").as_uri()
        run = uuid.uuid4().hex[:6]
        cfgs = []
        for i in range(args.topics):
            topic = f"bench.shared-{run}-{i}"
            create_topic(bootstrap, topic, partitions=PARTITIONS)
            cfgs.append(topic_config(work / f"{topic}.yaml", topic, root))
        spark = local_spark("cairn-shared-job")
        stack.callback(spark.stop)

        def ready(round_: int) -> list[tuple[ArchiveInput, archive_run.Planned]]:
            """One planned, cleaned run per topic, over `--records` new records a partition."""
            runs = []
            for cfg in cfgs:
                for p in range(PARTITIONS):
                    values = sample_events(args.records, datetime.now(UTC), seed=round_ * 7 + p)
                    produce(bootstrap, cfg.topic, values, partition=p)
            for cfg in cfgs:
                storage = Storage(cfg.root.storage_url)
                planned = archive_run.plan_run(cfg, storage, kafka, f"bench-{uuid.uuid4().hex}")
                assert planned is not None
                archive_run.clean_run(storage, planned)
                job = ArchiveInput(
                    topic=cfg.snapshot(),
                    claim=planned.claim.key,
                    kafka=kafka.settings,
                    kafka_label=kafka.label,
                )
                runs.append((job, planned))
            return runs

        def commit(runs: list[tuple[ArchiveInput, archive_run.Planned]]) -> None:
            for cfg, (_, planned) in zip(cfgs, runs, strict=True):
                storage = Storage(cfg.root.storage_url)
                report = archive_run.verify_run(storage, planned)
                archive_run.commit_run(cfg, storage, planned, report, kafka)

        def alone(runs) -> None:
            with ThreadPoolExecutor(2) as pool:  # the pool's two slots
                for outcomes in pool.map(lambda r: archive(spark, [r[0]]), runs):
                    assert not isinstance(outcomes[0], Exception), outcomes

        def shared(runs) -> None:
            outcomes = archive(spark, [job for job, _ in runs], "bench")
            assert not any(isinstance(o, Exception) for o in outcomes), outcomes

        seconds: dict[str, list[float]] = {"one job per run": [], "one shared job": []}
        arms = [("one job per run", alone), ("one shared job", shared)]
        for r in range(args.rounds):
            for name, arm in arms if r % 2 == 0 else arms[::-1]:
                runs = ready(2 * r + (name == "one shared job"))
                start = time.monotonic()
                arm(runs)
                seconds[name].append(time.monotonic() - start)
                commit(runs)
                console.print(f"round {r + 1}: {name}: {seconds[name][-1]:.1f} s")
    per_run = statistics.median(seconds["one job per run"])
    one = statistics.median(seconds["one shared job"])
    print(
        f"{args.topics} runs of {PARTITIONS} x {args.records} records, Spark time, median of "
        f"{args.rounds} rounds:"
    )
    for name, values in seconds.items():
        each = ", ".join(f"{v:.1f}" for v in values)
        print(f"  {name:>16}: {statistics.median(values):7.1f} s  ({each})")
    print(f"  shared / per run: {one / per_run:.2f}x")
    print(f"code {git_commit()}, {machine()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
