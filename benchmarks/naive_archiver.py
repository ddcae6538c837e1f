"""PEER, NOT CAIRN: the hand-written single-process archiver that teams keep writing.

The benchmark's yardstick (`archive_throughput.py --peers`): confluent-kafka reads the whole
topic, and every record is written verbatim to a per-partition backup Avro file and, parsed with
`json`, to a `dt=/hr=` Avro file per partition and hour, with fastavro and deflate like Cairn.
It keeps every file open, never stages, never verifies and commits nothing: the 80 lines a user
would compare Cairn with, not a design to copy.

    .venv/bin/python benchmarks/naive_archiver.py BOOTSTRAP TOPIC OUT_DIR
"""

from __future__ import annotations

import contextlib
import json
import sys
from datetime import datetime
from pathlib import Path

import fastavro
from confluent_kafka import Consumer, TopicPartition

from cairn.config import INCLUDE_DIR
from cairn.datafiles.avro_file import BACKUP_SCHEMA
from cairn.formats.base import load_schema


def main(bootstrap: str, topic: str, out: Path) -> int:
    user = load_schema(INCLUDE_DIR / "schemas" / "demo_event.avsc")
    parsed_schema = user | {
        "fields": [*user["fields"], {"name": "_kafka_offset", "type": "long"}],
    }
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "naive-archiver", "enable.auto.commit": False}
    )
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p))[1] for p in partitions}
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    writers: dict[tuple, fastavro.write.Writer] = {}
    files = contextlib.ExitStack()

    def writer(key: tuple, path: Path, schema: dict) -> fastavro.write.Writer:
        if key not in writers:
            path.parent.mkdir(parents=True, exist_ok=True)
            out = files.enter_context(open(path, "wb"))  # noqa: SIM115 (the stack closes it)
            writers[key] = fastavro.write.Writer(out, schema, "deflate")
        return writers[key]

    done, count = {p for p, end in ends.items() if end == 0}, 0
    while len(done) < len(ends):
        for msg in consumer.consume(1000, timeout=1.0):
            if msg.error():
                continue
            p, offset = msg.partition(), msg.offset()
            record = {
                "topic": topic,
                "partition": p,
                "offset": offset,
                "timestamp": msg.timestamp()[1],
                "timestamp_type": msg.timestamp()[0],
                "key": msg.key(),
                "value": msg.value(),
                "headers": [],
            }
            writer(("b", p), out / f"backup/partition={p}/{p}.avro", BACKUP_SCHEMA).write(record)
            event = json.loads(msg.value())
            hour = datetime.fromisoformat(event["ts"]).strftime("dt=%Y-%m-%d/hr=%H")
            path = out / f"partitioned/{hour}/{p}.avro"
            writer(("p", p, hour), path, parsed_schema).write(event | {"_kafka_offset": offset})
            count += 1
            if offset + 1 >= ends[p]:
                done.add(p)
    with files:
        for w in writers.values():
            w.flush()
    consumer.close()
    print(f"archived {count} records into {len(writers)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
