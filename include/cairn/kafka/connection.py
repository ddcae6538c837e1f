"""One Kafka configuration for every client Cairn runs: librdkafka settings in, two dialects out.

Users describe their cluster once, the way the Airflow Kafka provider's `kafka` connection does:
a flat dict of librdkafka settings (`bootstrap.servers`, `security.protocol`, `sasl.*`, `ssl.*`).
The planner, discovery and the CLI use confluent-kafka, which takes that dict as it is; the Spark
job reads through the Java client, which spells the same things differently (a JAAS line for
SASL, PEM truststore and keystore options for TLS). `KafkaConf` holds the dict and derives both,
so there is one mapping to test, and it refuses, when the configuration is loaded, every setting
it cannot carry to both clients, instead of letting one of them connect differently.

Secrets stay inside: `repr` and `describe()` (what error messages use) show only the label (the
Airflow connection id or the file it came from) and the bootstrap servers; the configuration
reaches the Spark job inside its input (`cairn.jobs`), never as arguments.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cairn.errors import PermanentError

ENV_VARIABLE = "CAIRN_KAFKA_CONFIG"
"""JSON `{"label": ..., "config": {librdkafka settings}}`, how the CLI may be given it."""
BOOTSTRAP_VARIABLE = "CAIRN_BOOTSTRAP_SERVERS"
"""The older, plaintext-only way: bootstrap servers alone."""

PROTOCOLS = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}
JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
SAME_IN_JAVA = {
    "client.id",
    "client.rack",
    "metadata.max.age.ms",
    "reconnect.backoff.ms",
    "reconnect.backoff.max.ms",
    "retry.backoff.ms",
    "retry.backoff.max.ms",
    "connections.max.idle.ms",
    "socket.connection.setup.timeout.ms",
    "socket.connection.setup.timeout.max.ms",
}
"""Settings that mean the same to both clients and are passed to Spark under `kafka.`."""
LIBRDKAFKA_ONLY = {
    "debug",
    "log_level",
    "log.connection.close",
    "statistics.interval.ms",
    "socket.keepalive.enable",
    "broker.address.family",
    "api.version.request",
    "topic.metadata.refresh.interval.ms",
}
"""How librdkafka itself logs and behaves; nothing for the Java client to know."""
SET_BY_CAIRN = {
    "group.id",
    "enable.auto.commit",
    "auto.offset.reset",
    "isolation.level",
    "allow.auto.create.topics",
    "enable.partition.eof",
}
"""Cairn reads by assignment, read_committed, never commits offsets nor creates topics: these
come from the code, and a connection's values (its UI suggests a group.id) are ignored."""
SECURITY = {
    "bootstrap.servers",
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.ca.pem",
    "ssl.certificate.location",
    "ssl.certificate.pem",
    "ssl.key.location",
    "ssl.key.pem",
    "ssl.key.password",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
}
"""Mapped one by one in `KafkaConf.spark_options`."""


LIBRDKAFKA_LOG = logging.getLogger("cairn.kafka.librdkafka")
"""Where every Kafka client Cairn makes sends librdkafka's own log lines (its `logger`
setting), instead of printing them raw on stderr: Airflow's task logs, the CLI's handlers."""


class KafkaConfigError(PermanentError):
    """A Kafka setting Cairn cannot use or cannot carry to the Spark job's Java client."""


class KafkaAccessDenied(PermanentError):
    """Kafka refused the credentials, or its certificate is not trusted: a retry cannot help."""


class KafkaConf:
    """librdkafka settings and where they came from (`label`), checked to be fully mappable."""

    def __init__(self, settings: Mapping[str, Any], label: str = "Kafka configuration") -> None:
        self.label = label
        self._settings = {k: v for k, v in settings.items() if v is not None}
        servers = self._settings.get("bootstrap.servers")
        if not servers or not isinstance(servers, str):
            raise KafkaConfigError(f"{label}: no 'bootstrap.servers'")
        for key in self._settings:
            if key not in SECURITY | SAME_IN_JAVA | LIBRDKAFKA_ONLY | SET_BY_CAIRN:
                raise self._refuse(
                    key, "Cairn has no mapping of it to the Spark job's Java Kafka client"
                )
        self._check_security()

    @classmethod
    def from_bootstrap(cls, servers: str, label: str = "Kafka configuration") -> KafkaConf:
        return cls({"bootstrap.servers": servers}, label)

    @classmethod
    def from_file(cls, path: str | Path) -> KafkaConf:
        """A JSON object, or `key=value` lines as in a librdkafka or Kafka properties file."""
        text = Path(path).read_text()
        label = f"Kafka configuration file {str(path)!r}"
        if text.lstrip().startswith("{"):
            try:
                return cls(json.loads(text), label)
            except json.JSONDecodeError as err:
                raise KafkaConfigError(f"{label}: not valid JSON: {err}") from None
        settings = {}
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "!")):
                key, sep, value = line.partition("=")
                if not sep:
                    raise KafkaConfigError(f"{label}: not a key=value line: {key.strip()!r}")
                settings[key.strip()] = value.strip()
        return cls(settings, label)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> KafkaConf | None:
        """What `to_env` set, else bootstrap servers alone; None when neither is set."""
        if environ.get(ENV_VARIABLE):
            found = json.loads(environ[ENV_VARIABLE])
            return cls(found["config"], found.get("label") or f"${ENV_VARIABLE}")
        if environ.get(BOOTSTRAP_VARIABLE):
            return cls.from_bootstrap(environ[BOOTSTRAP_VARIABLE], f"${BOOTSTRAP_VARIABLE}")
        return None

    @property
    def settings(self) -> dict[str, Any]:
        """The librdkafka settings, as given (secrets included: keep them out of messages)."""
        return dict(self._settings)

    @property
    def bootstrap_servers(self) -> str:
        return self._settings["bootstrap.servers"]

    @property
    def protocol(self) -> str:
        return str(self._settings.get("security.protocol", "PLAINTEXT")).upper()

    def describe(self) -> str:
        """How messages name this Kafka: the label and the bootstrap servers, never a secret."""
        return f"{self.label} (bootstrap servers {self.bootstrap_servers})"

    def __repr__(self) -> str:
        return f"KafkaConf({self.describe()})"

    def identity(self) -> str:
        """Label and settings as one string: equal for confs that would make the same client, so
        a process can keep one client per identity (`cairn.kafka.cluster`)."""
        return json.dumps([self.label, self._settings], sort_keys=True, default=str)

    def quiet(self) -> KafkaConf:
        """The same cluster with librdkafka's own log lines off (`log_level` 0), for the CLI:
        its one-line error says what pages of connection retries would repeat."""
        return KafkaConf({**self._settings, "log_level": 0}, self.label)

    def client_config(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """confluent-kafka configuration: the settings, minus what Cairn sets, plus `overrides`;
        librdkafka's log lines go through Python's logging (`LIBRDKAFKA_LOG`)."""
        mine = {k: v for k, v in self._settings.items() if k not in SET_BY_CAIRN}
        return {**mine, "logger": LIBRDKAFKA_LOG, **(overrides or {})}

    def spark_options(self) -> dict[str, str]:
        """The Spark Kafka source's `kafka.*` options for the same cluster and identity.

        PEM files named by `*.location` settings are read here (where the Spark driver runs) and
        passed inline, so executors on other machines need no copy of them.
        """
        s = self._settings
        out = {"bootstrap.servers": self.bootstrap_servers, "security.protocol": self.protocol}
        out |= {key: _java_value(s[key]) for key in SAME_IN_JAVA if key in s}
        if self.protocol.startswith("SASL_"):
            mechanism = self._mechanism()
            out["sasl.mechanism"] = mechanism
            user, password = (str(s[k]) for k in ("sasl.username", "sasl.password"))
            out["sasl.jaas.config"] = (
                f'{JAAS_MODULES[mechanism]} required username="{jaas_quote(user)}" '
                f'password="{jaas_quote(password)}";'
            )
        if self.protocol.endswith("SSL"):
            out |= self._ssl_options()
        return {f"kafka.{key}": value for key, value in out.items()}

    def _check_security(self) -> None:
        """Refuse, before any client starts, what `spark_options` could not map."""
        s, protocol = self._settings, self.protocol
        if protocol not in PROTOCOLS:
            raise self._refuse("security.protocol", f"unknown protocol {protocol!r}")
        sasl = {"sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password"}
        if protocol.startswith("SASL_"):
            self._mechanism()
            for key in ("sasl.username", "sasl.password"):
                if not s.get(key):
                    raise self._refuse(key, f"{protocol} with {self._mechanism()} needs it")
        elif sasl & s.keys():
            raise self._refuse(min(sasl & s.keys()), f"security.protocol {protocol} uses no SASL")
        ssl = {k for k in SECURITY if k.startswith(("ssl.", "enable.ssl."))}
        if not protocol.endswith("SSL"):
            if ssl & s.keys():
                raise self._refuse(min(ssl & s.keys()), f"security.protocol {protocol} has no TLS")
            return
        if str(s.get("enable.ssl.certificate.verification", "true")).lower() != "true":
            raise self._refuse(
                "enable.ssl.certificate.verification",
                "Cairn does not turn off certificate verification; trust the broker's CA "
                "with ssl.ca.location or ssl.ca.pem instead",
            )
        algorithm = str(s.get("ssl.endpoint.identification.algorithm", "https")).lower()
        if algorithm not in ("https", "none"):
            raise self._refuse("ssl.endpoint.identification.algorithm", "use 'https' or 'none'")
        for kind in ("ca", "certificate", "key"):
            if f"ssl.{kind}.location" in s and f"ssl.{kind}.pem" in s:
                raise self._refuse(f"ssl.{kind}.pem", f"give ssl.{kind}.location or it, not both")
        has_cert = any(k in s for k in ("ssl.certificate.location", "ssl.certificate.pem"))
        has_key = any(k in s for k in ("ssl.key.location", "ssl.key.pem"))
        if has_cert != has_key:
            missing = "ssl.key.location" if has_cert else "ssl.certificate.location"
            raise self._refuse(missing, "a client certificate needs both its certificate and key")
        if "ssl.keystore.location" in s and has_cert:
            raise self._refuse(
                "ssl.keystore.location", "give a keystore or a PEM key pair, not both"
            )
        location = str(s.get("ssl.ca.location", ""))
        if location and location != "probe" and Path(location).is_dir():
            raise self._refuse("ssl.ca.location", "name a PEM file, not a directory")

    def _mechanism(self) -> str:
        s = self._settings
        given = {str(s[k]).upper() for k in ("sasl.mechanism", "sasl.mechanisms") if k in s}
        if len(given) > 1:
            raise self._refuse("sasl.mechanisms", "it differs from sasl.mechanism")
        mechanism = given.pop() if given else "GSSAPI"  # librdkafka's default
        if mechanism not in JAAS_MODULES:
            raise self._refuse(
                "sasl.mechanism",
                f"{mechanism} is not supported by Cairn (use {', '.join(sorted(JAAS_MODULES))})",
            )
        return mechanism

    def _ssl_options(self) -> dict[str, str]:
        s, out = self._settings, {}
        if s.get("ssl.ca.location") == "probe":
            pass  # the system's CAs: the JVM's default truststore is the Java equivalent
        elif "ssl.ca.location" in s or "ssl.ca.pem" in s:
            out["ssl.truststore.type"] = "PEM"
            out["ssl.truststore.certificates"] = self._pem("ssl.ca")
        if "ssl.certificate.location" in s or "ssl.certificate.pem" in s:
            key = self._pem("ssl.key")
            if (
                "PRIVATE KEY-----" in key
                and "BEGIN PRIVATE KEY" not in key
                and ("BEGIN ENCRYPTED PRIVATE KEY" not in key)
            ):
                raise self._refuse(
                    "ssl.key.location" if "ssl.key.location" in s else "ssl.key.pem",
                    "Java reads PKCS#8 keys only ('BEGIN PRIVATE KEY' or 'BEGIN ENCRYPTED "
                    "PRIVATE KEY'); convert it with `openssl pkcs8 -topk8`",
                )
            out["ssl.keystore.type"] = "PEM"
            out["ssl.keystore.certificate.chain"] = self._pem("ssl.certificate")
            out["ssl.keystore.key"] = key
            if "ssl.key.password" in s:
                out["ssl.key.password"] = str(s["ssl.key.password"])
        elif "ssl.keystore.location" in s:  # librdkafka's keystores are PKCS#12
            out["ssl.keystore.type"] = "PKCS12"
            out["ssl.keystore.location"] = str(s["ssl.keystore.location"])
            if "ssl.keystore.password" in s:
                out["ssl.keystore.password"] = str(s["ssl.keystore.password"])
        algorithm = str(s.get("ssl.endpoint.identification.algorithm", "https")).lower()
        out["ssl.endpoint.identification.algorithm"] = "" if algorithm == "none" else "https"
        return out

    def _pem(self, prefix: str) -> str:
        """The PEM text of `<prefix>.pem`, or of the file `<prefix>.location` names."""
        s = self._settings
        if f"{prefix}.pem" in s:
            return str(s[f"{prefix}.pem"])
        path = Path(str(s[f"{prefix}.location"]))
        try:
            return path.read_text()
        except OSError as err:
            raise self._refuse(
                f"{prefix}.location", f"cannot read {path}: {err.strerror}"
            ) from None

    def _refuse(self, key: str, why: str) -> KafkaConfigError:
        return KafkaConfigError(f"{self.label}: cannot use {key!r}: {why}")


def jaas_quote(value: str) -> str:
    """`value` for a double-quoted JAAS option: Kafka's parser (a Java StreamTokenizer) reads
    backslash escapes there, and a raw line break would end the value."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return escaped.replace("\n", "\\n").replace("\r", "\\r")


def _java_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
