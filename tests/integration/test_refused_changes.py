"""Changes that would silently re-archive are refused, against the real Kafka and Spark: a topic
archived under one root and then pointed at another (a mistyped `archive_root`) is not archived
again from offset 0 there, whether its consumer group or its earlier root is the witness;
`start_new_archive` starts the new archive on purpose."""

from __future__ import annotations

import pytest

from cairn.errors import PermanentError
from cairn.pipeline.archive_run import plan_run
from cairn.protocol.plan import ArchiveElsewhere
from cairn.storage.objects import Storage
from cairn_stack.demo import create_topic, produce
from tests.integration.test_archive import NOW, event


def test_a_changed_archive_root_is_refused_until_a_new_archive_is_asked_for(
    kafka, archiver, make_cfg, topic_name, tmp_path
) -> None:
    create_topic(kafka, topic_name, partitions=2)
    for p in range(2):
        produce(kafka, topic_name, [event(i, NOW) for i in range(3 + p)], partition=p)
    archiver.run(make_cfg(topic_name))  # commits the group too: offsets 0:3 1:4

    moved = make_cfg(topic_name, root=(tmp_path / "typo").as_uri())
    with pytest.raises(ArchiveElsewhere) as refused:
        archiver.plan(moved)
    assert isinstance(refused.value, PermanentError)  # the task fails without retries
    assert str(refused.value) == (
        f"topic {topic_name!r}: archive root {moved.archive_root} holds no tokens of it, but its "
        f"consumer group 'cairn.{topic_name}' shows it was archived up to offsets 0:3 1:4 "
        "(partition:offset), so its archive is elsewhere: was archive_root changed or mistyped? "
        "Point archive_root back at the archive, or, to start a new archive here on purpose, set "
        "start_new_archive: true for this topic (remove it after the first run)"
    )
    assert not (tmp_path / "typo").exists()  # nothing claimed, nothing written

    new = make_cfg(topic_name, "start_new_archive: true\n", root=(tmp_path / "typo").as_uri())
    summary = archiver.run(new)
    assert summary is not None and summary.counts.read == 7  # a new archive, from the start


def test_without_a_consumer_group_the_earlier_root_is_the_witness(
    kafka, archiver, make_cfg, topic_name, tmp_path
) -> None:
    """`commit_consumer_group: false` leaves Kafka no trace of the archive; the root the topic's
    last commit went to (the Airflow edge remembers it) still holds its tokens, and refuses."""
    create_topic(kafka, topic_name, partitions=1)
    produce(kafka, topic_name, [event(i, NOW) for i in range(3)], partition=0)
    first = make_cfg(topic_name, "commit_consumer_group: false\n")
    archiver.run(first)

    moved = make_cfg(
        topic_name, "commit_consumer_group: false\n", root=(tmp_path / "typo").as_uri()
    )

    def earlier_roots() -> dict[str, Storage]:
        return {first.archive_root: archiver.storage(first)}

    with pytest.raises(ArchiveElsewhere, match=f"but archive root {first.archive_root}, where"):
        plan_run(moved, archiver.storage(moved), archiver.kafka, "run-1", earlier_roots)
    assert not (tmp_path / "typo").exists()  # nothing claimed, nothing written
    # no consumer group and no remembered root: nothing to go by, as before
    assert plan_run(moved, archiver.storage(moved), archiver.kafka, "run-2") is not None
