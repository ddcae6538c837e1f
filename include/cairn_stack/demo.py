"""The README's main job: sample events into a demo topic on the local stack.

`produce_events` is also what the tests and benchmarks use to fill topics.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console

from cairn_stack.settings import StackSettings

DEMO_TOPIC = "cairn.demo.events"
DEMO_EVENTS = 5000


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create `topic` unless it exists (then its partition count is left as it is)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic in admin.list_topics(timeout=10).topics:
        return
    future = admin.create_topics([NewTopic(topic, partitions, 1)])[topic]
    try:
        future.result(timeout=30)
    except KafkaException as err:
        if "TOPIC_ALREADY_EXISTS" not in str(err):
            raise


def sample_events(count: int, start: datetime, seed: int = 7) -> Iterable[bytes]:
    """JSON events about 300 bytes each, with event times spread over the two days before
    `start`, so they land in many `dt=/hr=` folders."""
    rng = random.Random(seed)
    actions = ["view", "click", "add_to_cart", "purchase", "refund"]
    for i in range(count):
        ts = start - timedelta(seconds=rng.randrange(0, 2 * 86400))
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
    create_topic(settings.bootstrap_servers, DEMO_TOPIC, partitions=3)
    now = datetime.now(UTC)
    count = produce(settings.bootstrap_servers, DEMO_TOPIC, sample_events(DEMO_EVENTS, now))
    console.print(f"produced {count} sample events to Kafka topic {DEMO_TOPIC}")
