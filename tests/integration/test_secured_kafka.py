"""Archiving through the broker's SASL_SSL listener (SCRAM-SHA-512 over TLS), as from a secured
cluster: one librdkafka configuration drives the planner and, mapped to the Java client, Spark.

A refused login or an untrusted broker certificate fails the run naming the configuration and
the cause, and leaves the archive as it was.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from cairn import cli
from cairn.kafka import cluster
from cairn.kafka.connection import KafkaAccessDenied, KafkaConf
from cairn.protocol import commit, tokens
from cairn_stack import certs
from tests.integration.conftest import Archiver, coords, read_archive

LABEL = "test connection 'secured'"
AWKWARD_USER = "cairn-awkward"
AWKWARD_PASSWORD = 'a "quoted" back\\slash pass; word'
"""Quotes, a backslash and a semicolon: the JAAS line must carry it to Java unchanged."""


def event(i: int) -> bytes:
    return json.dumps(
        {
            "event_id": f"e{i}",
            "user_id": "u1",
            "action": "view",
            "amount": 1.5,
            "ts": f"2024-05-01T{i % 24:02d}:00:00+00:00",
        }
    ).encode()


def create_and_fill(secured: dict, topic: str, per_partition: int, partitions: int = 2) -> None:
    """Create `topic` and produce to it, both through the SASL_SSL listener."""
    admin = AdminClient(secured)
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
    fill(secured, topic, range(per_partition), partitions)


def fill(secured: dict, topic: str, indexes: range, partitions: int = 2) -> None:
    producer = Producer({**secured, "enable.idempotence": True})
    for p in range(partitions):
        for i in indexes:
            producer.produce(topic, event(i), partition=p)
    assert producer.flush(30) == 0


WRONG_PASSWORD = {"sasl.password": "not-the-password"}
UNTRUSTED_CA = {"ssl.ca.location": None, "ssl.ca.pem": certs.pem(certs.make_ca("Other CA").cert)}
REFUSALS = {
    "wrong password": (WRONG_PASSWORD, "invalid credentials", "SaslAuthenticationException"),
    "untrusted CA": (
        UNTRUSTED_CA,
        "certificate verify failed",
        "SSLHandshakeException: PKIX path building failed",
    ),
}


def changed(settings: dict, change: dict) -> dict:
    return {k: v for k, v in {**settings, **change}.items() if v is not None}


@pytest.fixture(scope="module")
def awkward_login(kafka_secured: dict) -> dict:
    """The secured listener's settings for a SCRAM user whose password needs JAAS quoting."""
    admin = AdminClient(kafka_secured)
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    upsert = UserScramCredentialUpsertion(AWKWARD_USER, info, AWKWARD_PASSWORD.encode())
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)
    return {**kafka_secured, "sasl.username": AWKWARD_USER, "sasl.password": AWKWARD_PASSWORD}


def test_a_topic_on_the_secured_listener_is_archived_through_it(
    awkward_login, spark, make_cfg, topic_name, tmp_path, capsys
) -> None:
    create_and_fill(awkward_login, topic_name, per_partition=20)
    cfg = make_cfg(topic_name)
    archiver = Archiver(spark, KafkaConf(awkward_login, LABEL), {})

    summary = archiver.run(cfg)

    assert summary.counts.read == summary.counts.backup == 40
    assert summary.ranges == {0: (0, 20), 1: (0, 20)}
    assert summary.offset_lag == {0: 0, 1: 0}  # lag, too, was asked through the secured listener
    assert summary.time_lag_seconds == 0 and summary.lag_error is None
    contents = read_archive(archiver.storage(cfg), topic_name)
    assert coords(contents.backup) == [(p, o) for p in (0, 1) for o in range(20)]
    assert len(contents.partitioned) == 40
    assert [t.seq for t in tokens.list_tokens(archiver.storage(cfg), topic_name)] == [1]

    # Discovery and the CLI reach the secured listener from the same settings.
    assert topic_name in cluster.list_topic_names(KafkaConf(awkward_login, LABEL))
    settings = tmp_path / "kafka.json"
    settings.write_text(json.dumps(awkward_login))
    argv = ["--topics-file", str(tmp_path / f"{topic_name}.yaml"), "tokens", "rewind", topic_name]
    wrong = tmp_path / "client.properties"  # the other file form
    wrong.write_text(
        "\n".join(f"{k}={v}" for k, v in changed(awkward_login, WRONG_PASSWORD).items())
    )
    assert cli.main([*argv, "--count", "1", "--kafka-config", str(wrong)]) == 2
    error = capsys.readouterr().err
    assert f"Kafka configuration file {str(wrong)!r}" in error and "invalid credentials" in error
    assert cli.main([*argv, "--count", "1", "--kafka-config", str(settings)]) == 0
    assert commit.newest(archiver.storage(cfg), topic_name) is None


@pytest.mark.parametrize("case", REFUSALS)
def test_refused_access_fails_the_run_naming_the_connection_and_changes_nothing(
    case, kafka_secured, spark, make_cfg, topic_name
) -> None:
    change, cause, java_cause = REFUSALS[case]
    create_and_fill(kafka_secured, topic_name, per_partition=5)
    cfg = make_cfg(topic_name)
    good = Archiver(spark, KafkaConf(kafka_secured, LABEL), {})
    bad = KafkaConf(changed(kafka_secured, change), LABEL)
    storage = good.storage(cfg)
    before = sorted(storage.list())

    started = time.monotonic()
    with pytest.raises(KafkaAccessDenied) as planner:  # the planner's client (librdkafka)
        Archiver(spark, bad, {}).run(cfg)
    assert time.monotonic() - started < 8, "a refusal must not wait out the metadata timeout"
    message = str(planner.value)
    assert message.startswith(f"{LABEL} (bootstrap servers {kafka_secured['bootstrap.servers']})")
    assert cause in message
    assert sorted(storage.list()) == before  # no claim, no token, no data

    # Planned with the right settings, the Spark job's Java client gets the wrong ones.
    planned = good.plan(cfg)
    with pytest.raises(KafkaAccessDenied) as job:
        Archiver(spark, bad, {}).write(cfg, planned)
    message = str(job.value)
    assert message.startswith(f"{LABEL} (bootstrap servers")
    assert java_cause in message
    assert kafka_secured["sasl.password"] not in message
    assert commit.newest(storage, topic_name) is None
    assert read_archive(storage, topic_name).backup == []
