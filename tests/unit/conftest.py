"""Fixtures and factories the unit tests share."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cairn import fence, manifest, run, staging, tokens
from cairn.config import TopicConfig
from cairn.layout import Chain
from cairn.plan import Plan
from cairn.storage import Storage
from cairn.tokens import Token
from cairn.writer import KafkaRecord, write_partition

T0 = datetime(2024, 5, 1, tzinfo=UTC)
TIMESTAMP_FIELDS = ("timestamp", "processing_time", "_kafka_timestamp", "_event_time")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def as_read(record: dict[str, Any]) -> dict[str, Any]:
    """`record` (written with epoch millis) as a reader gets it back: Cairn's timestamp-millis
    fields as aware datetimes."""
    return {
        k: _EPOCH + timedelta(milliseconds=v) if k in TIMESTAMP_FIELDS and isinstance(v, int) else v
        for k, v in record.items()
    }


@pytest.fixture
def storage(tmp_path) -> Storage:
    """A fresh local archive root."""
    return Storage(f"file://{tmp_path}/archive")


def make_token(
    seq: int, next_offsets: dict[int, int], previous=None, run_id="run", **fields: Any
) -> Token:
    """Token `seq` of topic `orders`, created `seq` hours after T0; `fields` override the rest."""
    return Token(
        **{
            "seq": seq,
            "topic": "orders",
            "generation": 1,
            "next_offsets": next_offsets,
            "previous_offsets": previous or {},
            "run_id": run_id,
            "created_at": T0 + timedelta(hours=seq),
            "planned_at": T0 + timedelta(hours=seq),
        }
        | fields
    )


def claim_next(
    storage: Storage, topic: str = "orders", chain: Chain = "archive", run_id: str = "run"
) -> fence.Claim:
    """Claim the link after the chain's newest; the claim object holds just the claim."""
    base = fence.newest_link(storage, topic, chain)
    return fence.claim(storage, topic, chain, base, run_id, lambda c: c.model_dump_json().encode())


def commit_next(storage: Storage, next_offsets: dict[int, int], **fields: Any) -> Token:
    """Claim and commit the next token, planned from the newest (no files: a position only)."""
    topic = fields.get("topic", "orders")
    previous = tokens.newest(storage, topic)
    claim = claim_next(storage, topic)
    token = make_token(
        claim.seq,
        next_offsets,
        previous.next_offsets if previous else None,
        **{"attempt_id": claim.attempt_id} | fields,
    )
    assert tokens.commit(storage, token, claim)
    return token


def archive_run(
    storage: Storage,
    cfg: TopicConfig,
    processing_time: datetime,
    records: Iterable[KafkaRecord],
    run_id: str = "run",
) -> Token:
    """One committed archive run of `records`, as `cairn.run` drives it but without Kafka.

    Settle, claim the next token with a `Planned` body, stage every partition's files with
    `write_partition`, save and verify the manifest against the staging area, then store the
    publication, commit the token through the fence and publish. Returns the token.
    """
    topic = cfg.topic
    staging.settle(storage, topic)
    previous = tokens.newest(storage, topic)
    base = previous.next_offsets if previous else {}
    by_partition: dict[int, list[KafkaRecord]] = {}
    for r in records:
        by_partition.setdefault(r.partition, []).append(r)
    ranges = {p: (start, start) for p, start in base.items()} | {
        p: (base.get(p, 0), rs[-1].offset + 1) for p, rs in by_partition.items()
    }
    planned_plan = Plan(topic=topic, ranges=ranges, capped=False)

    def body(claim: fence.Claim) -> bytes:
        made = run.Planned(
            claim=claim,
            topic=topic,
            run_id=run_id,
            topic_id=None,
            base_offsets=base,
            plan=planned_plan,
            planned_at=processing_time,
        )
        return made.model_dump_json().encode()

    link = fence.Link(seq=previous.seq, created_at=previous.created_at) if previous else None
    claim = fence.claim(storage, topic, "archive", link, run_id, body)
    planned = run.load_planned(storage, claim.key)
    staged = planned.staged(storage)
    results = {
        p: write_partition(rs, cfg, staged, processing_time, planned.attempt_id)
        for p, rs in sorted(by_partition.items())
    }
    attempt = manifest.Manifest(
        topic=topic,
        attempt_id=planned.attempt_id,
        run_id=run_id,
        generation=cfg.generation,
        ranges=planned_plan.to_read,
        records_read={p: r.records for p, r in results.items()},
        files=[e for r in results.values() for e in r.files],
        processing_time=processing_time,
        created_at=datetime.now(UTC),
        parses=cfg.parses,
    )
    manifest.save(storage, attempt)
    report = run.verify_run(storage, planned)  # checks the claim, verifies the staged files
    publication = staging.Publication(move=[e.key for e in attempt.files])
    staging.prepare(storage, topic, planned.attempt_id, publication)
    token = Token(
        seq=planned.seq,
        topic=topic,
        generation=cfg.generation,
        next_offsets=planned_plan.next_offsets,
        previous_offsets=base,
        counts=report.counts,
        manifest=planned.manifest_key,
        attempt_id=planned.attempt_id,
        run_id=run_id,
        created_at=datetime.now(UTC),
        planned_at=processing_time,
    )
    assert tokens.commit(storage, token, claim)
    staging.publish(storage, topic, planned.attempt_id)
    return token
