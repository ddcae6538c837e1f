"""Rewinds and the commit protocol against real Kafka and Spark: the sequences that used to lose,
duplicate or strand records (Trust II), each with the operation docs/recovery.md allows (hand and
CLI rewinds, retention, generation changes, `latest` topics, added partitions) at the worst
moment."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from cairn.cli import main as cli
from cairn.pipeline import archive_run
from cairn.protocol import commit, tokens
from cairn.storage.layout import parse_data_key, token_key
from cairn.storage.objects import Storage
from cairn_stack.demo import create_topic, produce
from tests.integration.conftest import coords, read_archive
from tests.integration.test_archive import NOW, all_offsets, assert_exactly_once, event
from tests.integration.test_recovery import delete_records


def produce_run(kafka, archiver, cfg, first: int, count: int, partition: int = 0) -> None:
    produce(
        kafka, cfg.topic, [event(i, NOW) for i in range(first, first + count)], partition=partition
    )
    archiver.run(cfg)


def test_rewound_files_stay_readable_until_the_commit_and_survive_retention_meanwhile(
    kafka, archiver, make_cfg, topic_name
) -> None:
    """A hand rewind; the next run plans and cleans, then waits for a Spark slot while Kafka's
    retention deletes the rewound offsets. Nothing archived may be lost and no gap is declared,
    even with accept_gaps: the rewound files are the archive's only copy."""
    create_topic(kafka, topic_name, partitions=1)
    cfg = make_cfg(topic_name, "accept_gaps: true\n")
    produce_run(kafka, archiver, cfg, 0, 5)
    produce_run(kafka, archiver, cfg, 5, 15)
    storage = archiver.storage(cfg)
    storage.delete(token_key(topic_name, 2))  # a rewind by hand, as docs/recovery.md allows

    waiting = archiver.plan(cfg)
    archive_run.clean_run(storage, waiting)  # the clean task; the Spark task now waits for a slot
    assert coords(read_archive(storage, topic_name).backup) == [(0, o) for o in range(20)]
    delete_records(kafka, topic_name, before=12)  # retention, while the run waits
    with pytest.raises(Exception):  # noqa: B017 - Spark's read of deleted offsets fails
        archiver.write(cfg, waiting)

    summary = archiver.run(cfg)

    token = commit.newest(storage, topic_name)
    assert token.adopted == {0: (5, 20)} and token.gaps == [] and summary.gaps == []
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 20}))
    produce_run(kafka, archiver, cfg, 20, 3)
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 23}))


class CreateHook(Storage):
    """The archive root, calling `hook` once right after a token's create."""

    def __init__(self, url: str, hook) -> None:
        super().__init__(url)
        self.hook = hook

    def create(self, key: str, data: bytes) -> None:
        super().create(key, data)
        if key.startswith("_tokens/") and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()


@pytest.mark.parametrize("where", ["before the create", "after the create", "after publishing"])
def test_a_rewind_inside_a_commit_never_leaves_a_token_whose_records_are_missing(
    kafka, archiver, make_cfg, topic_name, monkeypatch, where
) -> None:
    """A's commit passes its checks; token 1, the newest, is deleted by hand (and another run
    plans and cleans). Before A's create, A is withdrawn; right after it, A sees that its token
    stands on nothing and withdraws it: nothing of A is published, and the runs read its
    offsets again. Once A has published, deleting token 1 is a hole below the newest token, not
    a rewind: A's token counts and nothing is read twice. No token claims records that are not
    there, and every record ends up archived exactly once."""
    create_topic(kafka, topic_name, partitions=2)
    cfg = make_cfg(topic_name)
    produce_run(kafka, archiver, cfg, 0, 6)
    produce(kafka, topic_name, [event(i, NOW) for i in range(6, 14)], partition=0)
    storage = archiver.storage(cfg)
    a = archiver.plan(cfg)
    archiver.write(cfg, a)
    report = archive_run.verify_run(storage, a)

    def rewind_and_replan() -> None:
        storage.delete(token_key(topic_name, 1))
        b = archiver.plan(cfg)
        if b is not None:
            archive_run.clean_run(storage, b)

    if where == "before the create":
        real = commit.SamePosition.check

        def check_then_rewind(self, storage_, claim, newest) -> None:
            real(self, storage_, claim, newest)
            if claim.attempt_id == a.attempt_id:
                rewind_and_replan()

        monkeypatch.setattr(commit.SamePosition, "check", check_then_rewind)
        with pytest.raises(commit.Fenced, match="withdrawn"):  # b's clean withdrew it
            archive_run.commit_run(cfg, storage, a, report, archiver.kafka)
        monkeypatch.undo()
    elif where == "after the create":
        hooked = CreateHook(storage.url, lambda: storage.delete(token_key(topic_name, 1)))
        with pytest.raises(commit.Fenced, match="token 1 was deleted while this attempt"):
            archive_run.commit_run(cfg, hooked, a, report, archiver.kafka)
    else:
        archive_run.commit_run(cfg, storage, a, report, archiver.kafka)
        rewind_and_replan()
        assert tokens.seqs(storage, topic_name) == [2]  # a hole, and the position stays

    for seq in tokens.seqs(storage, topic_name):
        promised = tokens.token_at(storage, topic_name, seq).adds
        assert all(storage.exists(key) for key in promised), f"token {seq} promises missing files"
    while archiver.run(cfg) is not None:
        pass
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 14}))
    assert not storage.list(f"_attempts/{topic_name}/") + storage.list(f"_publishing/{topic_name}/")


def test_a_partition_added_to_a_latest_topic_is_archived_from_its_first_offset(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    produce(kafka, topic_name, [event(i, NOW) for i in range(5)], partition=0)  # before: skipped
    cfg = make_cfg(topic_name, "new_partition_start: latest\n")
    archiver.run(cfg)
    produce_run(kafka, archiver, cfg, 5, 3)
    admin = AdminClient({"bootstrap.servers": kafka})
    admin.create_partitions([NewPartitions(topic_name, 2)])[topic_name].result(30)
    produce(kafka, topic_name, [event(i, NOW) for i in range(100, 104)], partition=1)

    summary = archiver.run(cfg)

    assert summary.ranges == {1: (0, 4)}
    backup = coords(read_archive(archiver.storage(cfg), topic_name).backup)
    assert backup == [(0, 5), (0, 6), (0, 7), (1, 0), (1, 1), (1, 2), (1, 3)]


def test_generations_compare_as_numbers_when_a_rewind_reads_them_again(
    kafka, archiver, make_cfg, topic_name
) -> None:
    """Generation 9, then 10, then back to 9, then a rewind of one token: the run replaces the
    generation-10 files (`10_…` sorts before `9_…` as text) and archives nothing twice."""
    create_topic(kafka, topic_name, partitions=1)
    produce_run(kafka, archiver, make_cfg(topic_name, "generation: 9\n"), 0, 10)
    produce_run(kafka, archiver, make_cfg(topic_name, "generation: 10\n"), 10, 10)
    cfg = make_cfg(topic_name, "generation: 9\n")
    produce_run(kafka, archiver, cfg, 20, 10)
    archiver.rewind(cfg, count=2)

    archiver.run(cfg)

    storage = archiver.storage(cfg)
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 30}))
    assert {parse_data_key(k).gen for k in storage.list(f"backup/{topic_name}/")} == {9}


def test_a_cli_rewind_never_strands_a_latest_topic_and_a_hand_one_carries_on(
    kafka, archiver, make_cfg, topic_name, tmp_path, capsys
) -> None:
    create_topic(kafka, topic_name, partitions=2)
    produce(kafka, topic_name, [event(i, NOW) for i in range(3)], partition=1)  # before: skipped
    cfg = make_cfg(topic_name, "new_partition_start: latest\n")
    archiver.run(cfg)
    produce_run(kafka, archiver, cfg, 10, 6)
    storage = archiver.storage(cfg)
    topics = str(tmp_path / f"{topic_name}.yaml")
    rewind = ["--topics-file", topics, "tokens", "rewind", topic_name, "--bootstrap-servers", kafka]

    assert cli([*rewind, "--to-seq", "0"]) == 1
    assert "--to-seq 1" in capsys.readouterr().err and tokens.seqs(storage, topic_name) == [1, 2]
    assert cli([*rewind, "--to-seq", "1"]) == 0
    archiver.run(cfg)
    assert_exactly_once(read_archive(storage, topic_name), [(0, o) for o in range(6)])

    for seq in tokens.seqs(storage, topic_name):  # every token deleted by hand
        storage.delete(token_key(topic_name, seq))
    archiver.run(cfg)  # carries on: partition 0 from where its archive began, 1 from Kafka's start
    contents = read_archive(storage, topic_name)
    assert_exactly_once(contents, [(0, o) for o in range(6)] + [(1, o) for o in range(3)])


def test_a_rewind_between_a_rebuilds_checks_and_its_commit_changes_nothing_of_the_archive(
    kafka, archiver, make_cfg, topic_name, monkeypatch
) -> None:
    """A rebuild of a date passes its checks; the topic is rewound and the archive reads the same
    offsets again into same-named files, all before the rebuild creates its token. The rebuild
    must not delete or overwrite those files: it is withdrawn or refused, and changes nothing."""
    create_topic(kafka, topic_name, partitions=1)
    cfg = make_cfg(topic_name)
    produce_run(kafka, archiver, cfg, 0, 8)
    produce_run(kafka, archiver, cfg, 8, 8)
    storage = archiver.storage(cfg)
    day = NOW.date()
    chosen = archiver.rebuild_selected(make_cfg(topic_name, "generation: 2\n"), day)
    real = commit.NotRewound.check

    def check_then_reread(self, storage_, claim, newest) -> None:
        real(self, storage_, claim, newest)
        if claim.attempt_id == chosen.claim.attempt_id:
            archiver.rewind(cfg, count=2)
            while archiver.run(cfg) is not None:
                pass

    monkeypatch.setattr(commit.NotRewound, "check", check_then_reread)
    with pytest.raises((commit.Fenced, commit.Conflict)):
        archiver.commit_rebuild(make_cfg(topic_name, "generation: 2\n"), chosen)
    monkeypatch.undo()

    contents = read_archive(storage, topic_name)
    assert_exactly_once(contents, all_offsets({0: 16}))
    assert {parse_data_key(k).gen for k in storage.list() if parse_data_key(k)} == {1}
    assert {t.kind for t in tokens.list_tokens(storage, topic_name)} == {"archive"}
