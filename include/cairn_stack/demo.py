"""The README's main job: sample events into a demo topic on the local stack.

`produce_events` is also what the tests and benchmarks use to fill topics.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta

import fastavro
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.table import Table

from cairn import dag_ids
from cairn.config import TopicConfig
from cairn.kafka.connection import LIBRDKAFKA_LOG
from cairn.pipeline.proof import read_proof
from cairn.protocol import commit
from cairn.storage.layout import kind_folder
from cairn.storage.objects import Storage
from cairn.table import iceberg
from cairn.table.catalog import NAMESPACE, spark_table, table_name
from cairn.topics_file import find_topic
from cairn_stack import services, sql
from cairn_stack.airflow_api import AirflowAPI
from cairn_stack.process import StackError
from cairn_stack.settings import StackSettings

DEMO_TOPIC = "cairn.demo.events"
DEMO_EVENTS = 5000


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create `topic` unless it exists (then its partition count is left as it is)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": LIBRDKAFKA_LOG})
    if topic in admin.list_topics(timeout=10).topics:
        return
    future = admin.create_topics([NewTopic(topic, partitions, 1)])[topic]
    try:
        future.result(timeout=30)
    except KafkaException as err:
        if "TOPIC_ALREADY_EXISTS" not in str(err):
            raise


def sample_events(count: int, start: datetime, seed: int = 7) -> Iterable[bytes]:
    """JSON events of about 300 bytes, shaped like real traffic: most happened a few minutes
    before `start`, and 2% arrive late, up to three days after they happened."""
    rng = random.Random(seed)
    actions = ["view", "click", "add_to_cart", "purchase", "refund"]
    for i in range(count):
        late = rng.random() < 0.02
        delay = rng.uniform(0, 3 * 86400) if late else rng.expovariate(1 / 600)
        ts = start - timedelta(seconds=delay)
        yield json.dumps(
            {
                "event_id": f"evt-{i:09d}",
                "user_id": f"user-{rng.randrange(100000):06d}",
                "action": rng.choice(actions),
                "amount": round(rng.uniform(0, 500), 2),
                "ts": ts.isoformat(timespec="milliseconds"),
                "page": f"/products/{rng.randrange(5000)}?ref=campaign-{rng.randrange(40)}",
                "agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/126 Safari",
            }
        ).encode()


def produce(
    bootstrap: str,
    topic: str,
    values: Iterable[bytes | None],
    keys: Iterable[bytes | None] | None = None,
    partition: int | None = None,
) -> int:
    """Produce every value (to `partition`, or spread by key); fail if any is lost."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "compression.type": "lz4",
            "enable.idempotence": True,
            "message.max.bytes": 16 * 1024 * 1024,
            "logger": LIBRDKAFKA_LOG,
        }
    )
    errors: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    count = 0
    key_iter = iter(keys) if keys is not None else None
    for value in values:
        key = next(key_iter) if key_iter is not None else None
        while True:
            try:
                extra = {} if partition is None else {"partition": partition}
                producer.produce(topic, value=value, key=key, on_delivery=delivered, **extra)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
        producer.poll(0)
    if producer.flush(60) or errors:
        raise RuntimeError(f"producing to {topic}: {len(errors)} failed, e.g. {errors[:3]}")
    return count


def run(settings: StackSettings, console: Console) -> None:
    """Produce sample events, archive them through Airflow, and show what landed where."""
    create_topic(settings.bootstrap_servers, DEMO_TOPIC, partitions=3)
    now = datetime.now(UTC)
    count = produce(settings.bootstrap_servers, DEMO_TOPIC, sample_events(DEMO_EVENTS, now))
    console.print(f"produced {count} sample events to Kafka topic {DEMO_TOPIC}")

    api = AirflowAPI(settings)
    dag_id = dag_ids.dag_id("archive", DEMO_TOPIC)
    started = datetime.now(UTC)  # unpausing may queue a scheduled run before the trigger
    with console.status(f"waiting for Airflow to parse {dag_id} …"):
        api.wait_for_dag(dag_id)
    run_id = api.trigger(dag_id)
    with console.status(f"archiving: DAG {dag_id} run {run_id} …"):
        runs = api.wait_for_runs(dag_id, timeout=900)
    # This demo's runs: the one it triggered and those queued since (drains, schedule ticks);
    # runs of an earlier demo on the same state folder are history, not this demo's result.
    mine = [
        r
        for r in runs
        if r["dag_run_id"] == run_id or datetime.fromisoformat(r["queued_at"]) >= started
    ]
    failed = [r["dag_run_id"] for r in mine if r["state"] != "success"]
    if failed:
        raise StackError(
            f"demo: runs {failed} of {dag_id} failed; see them in {settings.airflow_url}"
        )
    cfg = find_topic(DEMO_TOPIC, settings.topics_file)
    show_archive(cfg, console)
    announced = set()
    for r in mine:
        done = api.xcom(dag_id, r["dag_run_id"], "complete")
        announced |= set(done["completed"]) | set(done["amended"])
    seal(settings, api, cfg, sorted(announced), started, console)
    console.print(f"Runs and their summaries: {settings.airflow_url}/dags/{dag_id}")
    console.print(f"Overview of every topic: {settings.airflow_url}/plugin/cairn")
    console.print(
        f"This topic's page: {settings.airflow_url}/cairn/topics/{DEMO_TOPIC} "
        f"(log in as {settings.airflow_user}; Prometheus: {settings.airflow_url}/cairn/metrics)"
    )


def seal(
    settings: StackSettings,
    api: AirflowAPI,
    cfg: TopicConfig,
    days: list[str],
    since: datetime,
    console: Console,
) -> None:
    """Wait for the seal DAG's runs of the dates the archive runs completed, then show each
    sealed date and query the topic's Iceberg table."""
    if not days:
        console.print("no date is complete yet (a date completes an hour after it ends)")
        return
    dag_id = dag_ids.dag_id("seal", cfg.topic)
    with console.status(f"sealing {', '.join(days)}: DAG {dag_id} …"):
        runs = api.wait_for_partitions(dag_id, days, since, timeout=900)
    failed = [r["dag_run_id"] for r in runs if r["state"] != "success"]
    if failed:
        raise StackError(
            f"demo: runs {failed} of {dag_id} failed; see them in {settings.airflow_url}"
        )
    storage = Storage(cfg.root.storage_url)
    stack_catalog = services.iceberg_catalog(settings, settings.catalog_warehouse)
    table = iceberg.catalog_of(stack_catalog).load_table(f"{NAMESPACE}.{table_name(cfg.topic)}")
    shown = Table("date", "files before", "sealed files", "records", "table rows")
    for day in map(date.fromisoformat, days):
        proof = read_proof(storage, cfg, day)
        if proof is None:
            shown.add_row(str(day), "-", "-", "-", "not sealed: see the seal run's log")
            continue
        rows = iceberg.date_records(table, day)
        counts = (proof.files_before, proof.files_after, proof.partitioned, rows)
        shown.add_row(str(day), *map(str, counts))
    full_name = spark_table(stack_catalog, cfg.topic)
    console.print(f"Sealed dates: few files each, and Iceberg table {full_name}")
    console.print(shown)
    statement = (
        f"SELECT action, count(*) AS events FROM {full_name} "
        f"WHERE _event_date = DATE'{days[-1]}' GROUP BY action ORDER BY events DESC"
    )
    console.print(f"Spark SQL: {statement}")
    sql.show(settings, statement, console)
    console.print(
        f'Try your own: .venv/bin/python -m cairn_stack sql "SELECT count(*) FROM {full_name}"\n'
        f"Check a date against the backup: .venv/bin/python -m cairn verify {cfg.topic} "
        f"--date {days[-1]}"
    )


def show_archive(cfg: TopicConfig, console: Console) -> None:
    """Files and records per output of the topic, and the newest token."""
    storage = Storage(cfg.root.storage_url)
    table = Table("output", "files", "records", "example")
    for kind in ("backup", "partitioned", "quarantine"):
        keys = [k for k in storage.list(kind_folder(kind, cfg.topic)) if k.endswith(".avro")]
        records = sum(sum(1 for _ in fastavro.reader(storage.open_read(k))) for k in keys)
        table.add_row(kind, str(len(keys)), str(records), keys[0] if keys else "-")
    console.print(f"Archive root: {cfg.root.storage_url}")
    console.print(table)
    token = commit.newest(storage, cfg.topic)
    if token is not None:
        console.print(f"Newest token {token.seq}: next offsets {token.next_offsets}")
