"""The one Kafka configuration: librdkafka settings in, confluent-kafka and Spark options out."""

from __future__ import annotations

import json
import time

import pytest

from cairn.kafka.connection import (
    ENV_VARIABLE,
    LIBRDKAFKA_LOG,
    KafkaConf,
    KafkaConfigError,
    jaas_quote,
)
from cairn_stack import certs

LABEL = "Airflow connection 'cairn_kafka'"
SECRET = "s3cr3t-pa55"
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB-the-ca\n-----END CERTIFICATE-----\n"
CERT_PEM = "-----BEGIN CERTIFICATE-----\nMIIB-the-client\n-----END CERTIFICATE-----\n"
KEY_PEM = "-----BEGIN PRIVATE KEY-----\nMIIE-the-key\n-----END PRIVATE KEY-----\n"
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


def sasl_ssl(**more: object) -> dict:
    return {
        "bootstrap.servers": "b1:9094,b2:9094",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "cairn",
        "sasl.password": SECRET,
        **more,
    }


def test_plaintext_needs_only_bootstrap_servers():
    kafka = KafkaConf.from_bootstrap("h:9092")
    assert kafka.spark_options() == {
        "kafka.bootstrap.servers": "h:9092",
        "kafka.security.protocol": "PLAINTEXT",
    }
    assert kafka.client_config() == {"bootstrap.servers": "h:9092", "logger": LIBRDKAFKA_LOG}


def test_sasl_ssl_scram_with_a_ca_file_maps_to_jaas_and_a_pem_truststore(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text(CA_PEM)
    kafka = KafkaConf(sasl_ssl(**{"ssl.ca.location": str(ca), "client.id": "cairn"}), LABEL)
    assert kafka.spark_options() == {
        "kafka.bootstrap.servers": "b1:9094,b2:9094",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.client.id": "cairn",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": f'{SCRAM} required username="cairn" password="{SECRET}";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.certificates": CA_PEM,  # inline: executors need no file
        "kafka.ssl.endpoint.identification.algorithm": "https",
    }
    # confluent-kafka takes the librdkafka settings as they are
    assert kafka.client_config()["ssl.ca.location"] == str(ca)


@pytest.mark.parametrize(
    ("mechanism", "module"),
    [
        ("PLAIN", "org.apache.kafka.common.security.plain.PlainLoginModule"),
        ("SCRAM-SHA-256", SCRAM),
        ("scram-sha-512", SCRAM),
    ],
)
def test_each_supported_mechanism_gets_its_login_module(mechanism, module):
    settings = sasl_ssl(**{"security.protocol": "sasl_plaintext"})
    del settings["sasl.mechanism"]
    settings["sasl.mechanisms"] = mechanism  # librdkafka's older spelling
    options = KafkaConf(settings).spark_options()
    assert options["kafka.security.protocol"] == "SASL_PLAINTEXT"
    assert options["kafka.sasl.mechanism"] == mechanism.upper()
    assert options["kafka.sasl.jaas.config"].startswith(f"{module} required ")
    assert not any(key.startswith("kafka.ssl.") for key in options)


def test_jaas_values_are_quoted_for_kafkas_parser():
    assert jaas_quote('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    options = KafkaConf(sasl_ssl(**{"sasl.username": 'o"brien', "sasl.password": "x\\y"}))
    jaas = options.spark_options()["kafka.sasl.jaas.config"]
    assert 'username="o\\"brien" password="x\\\\y";' in jaas


def test_pem_settings_make_the_truststore_and_keystore_and_none_turns_off_host_checks():
    settings = sasl_ssl(
        **{
            "ssl.ca.pem": CA_PEM,
            "ssl.certificate.pem": CERT_PEM,
            "ssl.key.pem": KEY_PEM,
            "ssl.key.password": "kp",
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    options = KafkaConf(settings).spark_options()
    assert options["kafka.ssl.truststore.certificates"] == CA_PEM
    assert options["kafka.ssl.keystore.type"] == "PEM"
    assert options["kafka.ssl.keystore.certificate.chain"] == CERT_PEM
    assert options["kafka.ssl.keystore.key"] == KEY_PEM
    assert options["kafka.ssl.key.password"] == "kp"
    assert options["kafka.ssl.endpoint.identification.algorithm"] == ""


def test_key_files_are_read_and_a_pkcs12_keystore_is_passed_on(tmp_path):
    (tmp_path / "c.pem").write_text(CERT_PEM)
    (tmp_path / "k.pem").write_text(KEY_PEM)
    files = {"ssl.certificate.location": str(tmp_path / "c.pem")}
    files["ssl.key.location"] = str(tmp_path / "k.pem")
    options = KafkaConf({**sasl_ssl(), **files}).spark_options()
    assert options["kafka.ssl.keystore.key"] == KEY_PEM
    assert "kafka.ssl.truststore.type" not in options  # no CA given: the JVM's default
    p12 = {"ssl.keystore.location": "/etc/k.p12", "ssl.keystore.password": "kp"}
    options = KafkaConf({**sasl_ssl(), **p12}).spark_options()
    assert options["kafka.ssl.keystore.type"] == "PKCS12"
    assert options["kafka.ssl.keystore.location"] == "/etc/k.p12"


def test_ca_probe_means_the_default_truststore():
    options = KafkaConf(sasl_ssl(**{"ssl.ca.location": "probe"})).spark_options()
    assert not any(key.startswith("kafka.ssl.truststore") for key in options)


def test_settings_cairn_owns_are_left_to_cairn():
    kafka = KafkaConf({"bootstrap.servers": "h:1", "group.id": "theirs", "debug": "all"})
    assert kafka.client_config({"group.id": "cairn-planner"}) == {
        "bootstrap.servers": "h:1",
        "group.id": "cairn-planner",
        "debug": "all",
        "logger": LIBRDKAFKA_LOG,  # librdkafka's lines through Python's logging, not raw stderr
    }
    assert set(kafka.spark_options()) == {"kafka.bootstrap.servers", "kafka.security.protocol"}


@pytest.mark.parametrize(
    ("change", "key", "why"),
    [
        ({"sasl.mechanism": None}, "sasl.mechanism", "GSSAPI is not supported"),
        ({"sasl.mechanism": "OAUTHBEARER"}, "sasl.mechanism", "OAUTHBEARER is not supported"),
        ({"sasl.password": None}, "sasl.password", "needs it"),
        ({"sasl.mechanisms": "PLAIN"}, "sasl.mechanisms", "differs"),
        ({"security.protocol": "TLS"}, "security.protocol", "unknown protocol"),
        ({"security.protocol": "PLAINTEXT"}, "sasl.mechanism", "uses no SASL"),
        ({"enable.ssl.certificate.verification": False}, "enable.ssl.", "verification"),
        ({"ssl.endpoint.identification.algorithm": "x"}, "ssl.endpoint", "'https' or 'none'"),
        ({"ssl.certificate.pem": CERT_PEM}, "ssl.key.location", "needs both"),
        ({"ssl.ca.pem": "x", "ssl.ca.location": "/x"}, "ssl.ca.pem", "not both"),
        ({"sasl.oauthbearer.config": "x"}, "sasl.oauthbearer.config", "no mapping"),
        ({"oauth_cb": "my.module.cb"}, "oauth_cb", "no mapping"),
        ({"ssl.cipher.suites": "x"}, "ssl.cipher.suites", "no mapping"),
    ],
)
def test_what_cannot_be_mapped_is_refused_naming_the_key_and_the_connection(change, key, why):
    settings = {k: v for k, v in {**sasl_ssl(), **change}.items() if v is not None}
    with pytest.raises(KafkaConfigError) as refused:
        KafkaConf(settings, LABEL)
    message = str(refused.value)
    assert message.startswith(f"{LABEL}: cannot use '{key}")
    assert why in message
    assert SECRET not in message


def test_unreadable_files_and_pkcs1_keys_are_refused_when_mapping(tmp_path):
    missing = KafkaConf(sasl_ssl(**{"ssl.ca.location": str(tmp_path / "nope.pem")}), LABEL)
    with pytest.raises(KafkaConfigError, match=f"{LABEL}: cannot use 'ssl.ca.location'"):
        missing.spark_options()
    with pytest.raises(KafkaConfigError, match="name a PEM file, not a directory"):
        KafkaConf(sasl_ssl(**{"ssl.ca.location": str(tmp_path)}), LABEL)
    rsa = KEY_PEM.replace("PRIVATE KEY", "RSA PRIVATE KEY")
    pkcs1 = KafkaConf(sasl_ssl(**{"ssl.certificate.pem": CERT_PEM, "ssl.key.pem": rsa}))
    with pytest.raises(KafkaConfigError, match="PKCS#8 keys only"):
        pkcs1.spark_options()


def test_no_bootstrap_servers_is_refused():
    with pytest.raises(KafkaConfigError, match=f"{LABEL}: no 'bootstrap.servers'"):
        KafkaConf({"security.protocol": "SSL"}, LABEL)


def test_secrets_stay_out_of_repr_and_descriptions():
    kafka = KafkaConf(sasl_ssl(), LABEL)
    assert kafka.describe() == f"{LABEL} (bootstrap servers b1:9094,b2:9094)"
    assert SECRET not in repr(kafka) and SECRET not in str(kafka)


def test_the_cli_reads_it_from_the_environment_with_a_bootstrap_only_fallback():
    kafka = KafkaConf(sasl_ssl(), LABEL)
    env = {ENV_VARIABLE: json.dumps({"label": LABEL, "config": sasl_ssl()})}
    again = KafkaConf.from_env(env)
    assert again.label == LABEL
    assert again.spark_options() == kafka.spark_options()
    legacy = KafkaConf.from_env({"CAIRN_BOOTSTRAP_SERVERS": "h:9092"})
    assert legacy.bootstrap_servers == "h:9092"
    assert KafkaConf.from_env({}) is None


def test_files_in_json_or_properties_form(tmp_path):
    as_json = tmp_path / "kafka.json"
    as_json.write_text(json.dumps(sasl_ssl()))
    props = tmp_path / "client.properties"
    props.write_text("# secured\n" + "\n".join(f"{k} = {v}" for k, v in sasl_ssl().items()))
    for path in (as_json, props):
        kafka = KafkaConf.from_file(path)
        assert kafka.label == f"Kafka configuration file {str(path)!r}"
        assert kafka.spark_options() == KafkaConf(sasl_ssl()).spark_options()
    as_json.write_text('{"bootstrap.servers": "h:9092",}')
    with pytest.raises(KafkaConfigError, match=r"kafka.json'\: not valid JSON: Expecting"):
        KafkaConf.from_file(as_json)


def test_stack_ca_is_a_ca_and_the_server_certificate_names_the_host(tmp_path):
    from cryptography import x509

    ca_file, keystore = certs.ensure_server_tls(tmp_path, ["127.0.0.1", "localhost"])
    assert certs.ensure_server_tls(tmp_path, ["127.0.0.1"]) == (ca_file, keystore)  # kept
    text = keystore.read_text()
    assert text.startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8, as Kafka's PEM keystore needs
    server = x509.load_pem_x509_certificates(text.split("-----END PRIVATE KEY-----")[1].encode())
    ca = x509.load_pem_x509_certificate(ca_file.read_bytes())
    assert server[0].issuer == ca.subject
    names = server[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert keystore.stat().st_mode & 0o077 == 0


def test_the_airflow_edge_reads_the_kafka_providers_connection_and_reuses_it_a_minute(
    monkeypatch,
):
    from cairn_airflow.hooks import connections
    from cairn_airflow.hooks.connections import CONNECTION_SECONDS, kafka_conf

    conn = {"conn_type": "kafka", "extra": sasl_ssl()}
    monkeypatch.setenv("AIRFLOW_CONN_CAIRN_KAFKA", json.dumps(conn))
    kafka = kafka_conf()
    assert kafka.describe() == f"{LABEL} (bootstrap servers b1:9094,b2:9094)"
    assert kafka.spark_options() == KafkaConf(sasl_ssl()).spark_options()

    # changed: the process goes on with what it resolved until CONNECTION_SECONDS have passed
    monkeypatch.setenv("AIRFLOW_CONN_CAIRN_KAFKA", json.dumps({**conn, "conn_type": "generic"}))
    assert kafka_conf().describe() == kafka.describe()
    connections._resolved.cache.expire(time.monotonic() + CONNECTION_SECONDS + 1)
    with pytest.raises(KafkaConfigError, match=f"{LABEL} is of type 'generic'"):
        kafka_conf()


EXTRA = json.dumps({"bootstrap.servers": "b1:9092"})


def slow_reads(monkeypatch) -> list[str]:
    """The connections this process reads from Airflow, each read taking a tenth of a second."""
    from airflow.sdk import BaseHook, Connection

    reads: list[str] = []

    def read(conn_id: str) -> Connection:
        reads.append(conn_id)
        time.sleep(0.1)
        return Connection(conn_id=conn_id, conn_type="kafka", extra=EXTRA)

    monkeypatch.setattr(BaseHook, "get_connection", read)
    return reads


def test_threads_that_miss_the_same_connection_wait_for_one_read(monkeypatch):
    """In the triggerer each read of a connection is a request to its supervisor (and one
    more to mask each secret): a burst's steps that find the minute over read it once."""
    import threading

    from cairn_airflow.hooks.connections import kafka_conf

    reads = slow_reads(monkeypatch)
    threads = [threading.Thread(target=kafka_conf) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert reads == ["cairn_kafka"]


def test_the_watchers_of_a_triggerer_read_the_kafka_connection_once(monkeypatch):
    """1,000 topics' triggers start at once: one read, not one request each."""
    import asyncio

    from cairn_airflow.triggers import waiting_records

    reads = slow_reads(monkeypatch)
    monkeypatch.setattr(waiting_records, "_KAFKA", [])

    async def watchers() -> list:
        return await asyncio.gather(*(waiting_records._kafka() for _ in range(50)))

    found = asyncio.run(watchers())
    assert len({id(kafka) for kafka in found}) == 1 and reads == ["cairn_kafka"]


def test_a_process_keeps_one_admin_client_per_kafka_and_remakes_one_refused_access():
    """Plans, commits and watchers of a triggerer share an admin client (librdkafka's start-up is
    paid once); one that saw a refused login is dropped, so a fixed secret is tried anew."""
    from confluent_kafka import KafkaError

    from cairn.kafka import cluster
    from cairn.kafka.connection import KafkaAccessDenied

    servers = "127.0.0.1:1"  # nothing listens: refused at once
    first = cluster._admin(KafkaConf.from_bootstrap(servers, LABEL))
    assert cluster._admin(KafkaConf.from_bootstrap(servers, LABEL)) is first
    assert cluster._admin(KafkaConf.from_bootstrap(servers, "another label")) is not first
    first.errors.append(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication failed"))
    with pytest.raises(KafkaAccessDenied, match=r"check sasl\.username and sasl\.password"):
        first.check_access(poll=False)
    assert cluster._admin(KafkaConf.from_bootstrap(servers, LABEL)) is not first


def test_a_forked_child_makes_its_own_admin_client():
    """librdkafka's threads stay in the parent: a child (a forked task process) that used the
    parent's client would wait for answers no thread reads."""
    import os

    from cairn.kafka import cluster

    kafka = KafkaConf.from_bootstrap("127.0.0.1:2", LABEL)
    parents = id(cluster._admin(kafka))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child answers whether it was handed the parent's client, then exits
        os.write(write, b"same" if id(cluster._admin(kafka)) == parents else b"own")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 4) == b"own"
    assert id(cluster._admin(kafka)) == parents


def test_offsets_are_asked_again_while_a_partitions_leader_is_elected():
    """A topic just created answers 'not leader' for a moment (the replay's target, a new
    partition): asked again with fresh metadata, not failed; any other error fails at once."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import OffsetSpec

    from cairn.kafka import cluster

    def answer(value: object) -> Future:
        future: Future = Future()
        if isinstance(value, KafkaError):
            future.set_exception(KafkaException(value))
        else:
            future.set_result(SimpleNamespace(offset=value))
        return future

    def broker(*answers: dict) -> SimpleNamespace:
        replies, asked = iter(answers), []

        def list_offsets(request: dict, **_: object) -> dict:
            asked.append(sorted(tp.partition for tp in request))
            reply = next(replies)
            return {tp: answer(reply[tp.partition]) for tp in request}

        client = SimpleNamespace(list_offsets=list_offsets, list_topics=lambda *a, **k: None)
        return SimpleNamespace(
            client=client, kafka=KafkaConf.from_bootstrap("b:9"), check_access=lambda: None
        ), asked

    moving = KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)
    admin, asked = broker({0: 7, 1: moving}, {1: 3})
    assert cluster._list_offsets(admin, "t", [0, 1], OffsetSpec.latest(), 5.0) == {0: 7, 1: 3}
    assert asked == [[0, 1], [1]]

    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    admin, asked = broker({0: 7, 1: denied})
    with pytest.raises(KafkaException, match=r"topic 't': no offsets from .* partition 1: "):
        cluster._list_offsets(admin, "t", [0, 1], OffsetSpec.latest(), 5.0)
    assert asked == [[0, 1]]
