"""Fixtures and factories the unit tests share."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cairn.config import TopicConfig
from cairn.datafiles.writer import KafkaRecord, write_partition
from cairn.pipeline import archive_run
from cairn.protocol import commit, rewind
from cairn.protocol.plan import Plan
from cairn.protocol.tokens import ArchivePayload, Kind, Token
from cairn.storage.objects import Storage

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


@pytest.fixture(autouse=True)
def _connections_resolved_afresh() -> None:
    """Each test resolves Airflow connections itself: a process reuses them for a minute
    (`cairn_airflow.hooks.connections`)."""
    if connections := sys.modules.get("cairn_airflow.hooks.connections"):
        connections._resolved.cache_clear()
        connections._aws_options.cache_clear()


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
    storage: Storage, topic: str = "orders", kind: Kind = "archive", run_id: str = "run"
) -> commit.Claim:
    """Claim the token after the newest; the claim object holds just the claim (as a plan's
    `claim` field)."""
    base = commit.newest(storage, topic)
    return commit.claim(storage, topic, kind, base, run_id, claim_body)


def claim_body(claim: commit.Claim) -> bytes:
    """A claim object that holds just the claim (as a plan's `claim` field)."""
    return json.dumps({"claim": claim.model_dump(mode="json")}).encode()


def commit_next(storage: Storage, next_offsets: dict[int, int], **fields: Any) -> Token:
    """Claim and commit the next archive token, planned from the newest (no files: a position
    only), through the one commit site."""
    topic = fields.pop("topic", "orders")
    claim = claim_next(storage, topic)
    change = commit.Change(
        requirements=[commit.SamePosition(), commit.NewestClaim()],
        adds={},
        position=next_offsets,
        payload=ArchivePayload(**{"planned_at": claim.created_at} | fields),
    )
    return commit.commit(storage, claim, lambda: change)


def archive_records(
    storage: Storage,
    cfg: TopicConfig,
    processing_time: datetime,
    records: Iterable[KafkaRecord],
    run_id: str = "run",
    adopted: dict[int, tuple[int, int]] | None = None,
) -> Token:
    """One committed archive run of `records`, as `cairn.pipeline.archive_run` drives it but without
    Kafka.

    Settle and claim the next token with a `Planned` body (replacing the rewound files its ranges
    read again, and keeping those of the rewound offsets `adopted`, as the planner does), stage
    every partition's files with `write_partition`, save and verify the manifest against the
    staging area, then commit through `cairn.pipeline.archive_run.commit_archive` (the one commit
    site). Returns the token.
    """
    topic = cfg.topic
    previous = commit.settle(storage, topic)
    base = previous.next_offsets if previous else {}
    kept = adopted or {}
    start = base | {p: end for p, (_, end) in kept.items()}
    by_partition: dict[int, list[KafkaRecord]] = {}
    for r in records:
        by_partition.setdefault(r.partition, []).append(r)
    ranges = {p: (first, first) for p, first in start.items()} | {
        p: (start.get(p, 0), rs[-1].offset + 1) for p, rs in by_partition.items()
    }
    planned_plan = Plan(topic=topic, ranges=ranges, capped=False, adopted=kept)
    replaces = rewind.supersedes(rewind.survey(storage, topic, base), ranges)

    def made(claim: commit.Claim) -> archive_run.Planned:
        return archive_run.Planned(
            claim=claim,
            topic=topic,
            run_id=run_id,
            topic_id=None,
            plan=planned_plan,
            planned_at=processing_time,
            replaces=replaces,
        )

    claim = commit.claim(
        storage, topic, "archive", previous, run_id, lambda c: made(c).model_dump_json().encode()
    )
    planned = archive_run.load_claimed(storage, claim.key)
    staged = planned.staged(storage)
    results = [
        write_partition(rs, cfg, staged, processing_time, planned.attempt_id)
        for _, rs in sorted(by_partition.items())
    ]
    archive_run.save_attempt(cfg, storage, planned, results)
    report = archive_run.verify_run(storage, planned)  # checks the claim, verifies the staged files
    return archive_run.commit_archive(cfg, storage, planned, report, None)
