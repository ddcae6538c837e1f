"""Staging on a real local archive root: nothing reaches the data folders until a link commits,
and publishing a committed attempt finishes whatever a crash interrupted."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from cairn import staging, tokens
from cairn.config import TopicConfig
from cairn.layout import attempt_prefix, backup_key, parse_data_key, partitioned_key, quarantine_key
from cairn.staging import Publication
from cairn.storage import Storage
from cairn.writer import KafkaRecord, write_partition
from tests.unit.conftest import claim_next, make_token

TOPIC = "orders"
HOUR = "dt=2024-05-01/hr=00"
KEYS = [
    backup_key(TOPIC, 1, 0, 0),
    partitioned_key(TOPIC, 1, 0, 0, HOUR),
    quarantine_key(TOPIC, 1, 0, 3, date(2024, 5, 1)),
]
STALE = partitioned_key(TOPIC, 1, 0, 0, "dt=2024-04-30/hr=23")  # a rebuild's old file


def stage(storage: Storage, attempt_id: str, keys: list[str]) -> dict[str, bytes]:
    """Write each key into the attempt's staging area; returns what each holds."""
    staged = staging.staged(storage, TOPIC, attempt_id)
    written = {key: f"{attempt_id}:{key}".encode() for key in keys}
    for key, data in written.items():
        staged.write(key, data)
    return written


def data_files(storage: Storage) -> dict[str, bytes]:
    return {k: storage.read(k) for k in storage.list() if parse_data_key(k)}


def test_publish_moves_exactly_the_publications_files_and_deletes_the_stale_ones(storage):
    attempt = claim_next(storage).attempt_id
    written = stage(storage, attempt, KEYS)
    stage(storage, attempt, [backup_key(TOPIC, 1, 0, 5)])  # staged, but not in the publication
    storage.write(STALE, b"old")
    staging.prepare(storage, TOPIC, attempt, Publication(move=KEYS, delete=[STALE]))

    done = staging.publish(storage, TOPIC, attempt)

    assert done == Publication(move=KEYS, delete=[STALE])
    assert data_files(storage) == written
    assert storage.list(attempt_prefix(TOPIC, attempt)) == []


@pytest.mark.parametrize("moved", [1, 2, 3])
def test_publish_after_a_crash_midway_finishes_and_is_idempotent(storage, moved):
    attempt = claim_next(storage).attempt_id
    written = stage(storage, attempt, KEYS)
    storage.write(STALE, b"old")
    staging.prepare(storage, TOPIC, attempt, Publication(move=KEYS, delete=[STALE]))
    prefix = attempt_prefix(TOPIC, attempt)
    for key in KEYS[:moved]:  # the crashed publish got this far
        storage.move(prefix + key, key)

    staging.publish(storage, TOPIC, attempt)
    assert data_files(storage) == written

    assert staging.publish(storage, TOPIC, attempt) == Publication(move=[])
    assert data_files(storage) == written
    assert storage.list("_attempts/") == []


def test_settle_publishes_committed_discards_dead_and_leaves_open_attempts(storage):
    lost, won = claim_next(storage), claim_next(storage)  # two attempts at token 1
    stage(storage, lost.attempt_id, KEYS)
    staging.prepare(storage, TOPIC, lost.attempt_id, Publication(move=KEYS))
    written = stage(storage, won.attempt_id, KEYS)
    staging.prepare(storage, TOPIC, won.attempt_id, Publication(move=KEYS))
    token = make_token(1, {0: 4}, attempt_id=won.attempt_id)
    assert tokens.commit(storage, token, won)  # ...and the run died before publishing
    running = claim_next(storage)  # token 2, still being written
    stage(storage, running.attempt_id, [backup_key(TOPIC, 1, 0, 4)])

    settled = staging.settle(storage, TOPIC)

    assert settled == {"published": [won.attempt_id], "discarded": [lost.attempt_id]}
    assert data_files(storage) == written
    assert storage.children(f"_attempts/{TOPIC}/") == [attempt_prefix(TOPIC, running.attempt_id)]
    assert staging.settle(storage, TOPIC) == {"published": [], "discarded": []}


def test_data_folders_show_nothing_of_an_attempt_before_its_token_commits(storage):
    cfg = TopicConfig(topic=TOPIC, format="raw")
    records = [KafkaRecord(TOPIC, 0, offset, 0, 0, b"k", b"v") for offset in range(3)]
    processing_time = datetime(2024, 5, 1, tzinfo=UTC)
    claim = claim_next(storage)
    staged = staging.staged(storage, TOPIC, claim.attempt_id)

    result = write_partition(records, cfg, staged, processing_time, claim.attempt_id)
    staging.prepare(storage, TOPIC, claim.attempt_id, Publication(move=[KEYS[0]]))
    staging.settle(storage, TOPIC)  # another run settling meanwhile leaves it alone

    assert [e.key for e in result.files] == [KEYS[0]]
    assert data_files(storage) == {}
    token = make_token(1, {0: 3}, attempt_id=claim.attempt_id)
    assert tokens.commit(storage, token, claim)
    assert data_files(storage) == {}  # committed, not yet published

    staging.publish(storage, TOPIC, claim.attempt_id)
    assert list(data_files(storage)) == [KEYS[0]]


def test_late_writes_of_a_published_attempt_are_removed_and_never_published(storage):
    """A duplicate Spark job of the same attempt (a retried task whose first job still ran)
    keeps staging files after the commit published them: settling removes them, unpublished."""
    claim = claim_next(storage)
    written = stage(storage, claim.attempt_id, KEYS)
    staging.prepare(storage, TOPIC, claim.attempt_id, Publication(move=KEYS))
    tokens.commit(storage, make_token(1, {0: 4}, attempt_id=claim.attempt_id), claim)
    staging.publish(storage, TOPIC, claim.attempt_id)
    stage(storage, claim.attempt_id, [backup_key(TOPIC, 1, 0, 9)])  # the late duplicate

    staging.settle(storage, TOPIC)

    assert data_files(storage) == written
    assert storage.list(attempt_prefix(TOPIC, claim.attempt_id)) == []
