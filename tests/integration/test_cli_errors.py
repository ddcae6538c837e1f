"""`python -m cairn` as an operator runs it, as a subprocess: each mistake is one line on stderr
naming what is wrong and what to do, with the exit code the CLI documents; `--debug` shows the
traceback. No service is needed: these are the failures of a missing or wrong one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from cairn.config import REPO


def cli(topics: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `python -m cairn --topics-file topics ARGS`."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AIRFLOW_CONN_"))}
    environ |= {
        "PYTHONPATH": f"{REPO / 'include'}{os.pathsep}{REPO}",
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        "AWS_EC2_METADATA_DISABLED": "true",  # no instance role to wait for
        **(env or {}),
    }
    done = subprocess.run(
        [sys.executable, "-m", "cairn", "--topics-file", str(topics), *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )
    return done.returncode, done.stdout, done.stderr


def topics_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topics.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_s3_root_without_credentials_names_the_connection_to_export(tmp_path) -> None:
    topics = topics_file(
        tmp_path,
        """
        topics:
          - topic: t
            format: raw
            archive_root: s3://lake@cairn-bucket/kafka
        """,
    )
    code, out, err = cli(topics, "tokens", "list", "t")
    assert (code, out) == (2, "")
    assert err == (
        "error: no AWS credentials for archive root s3://lake@cairn-bucket/kafka: export the "
        "Airflow connection 'lake' as AIRFLOW_CONN_LAKE (JSON: login, password, extra), or set "
        "AWS_ACCESS_KEY_ID or AWS_PROFILE\n"
    )


def test_unreachable_kafka_is_one_line_within_the_timeout(tmp_path) -> None:
    topics = topics_file(
        tmp_path,
        f"""
        topics:
          - topic: t
            format: raw
            archive_root: {(tmp_path / "archive").as_uri()}
        """,
    )
    servers = f"127.0.0.1:{closed_port()}"
    for command in (["tokens", "rewind", "t", "--count", "1"], ["replay", "t", "--to-topic", "u"]):
        code, out, err = cli(topics, *command, "--bootstrap-servers", servers)
        assert (code, out) == (3, "")
        assert err.count("\n") == 1, err  # none of librdkafka's own log lines
        assert err.startswith(
            "error: Kafka: cannot read metadata of topic "
            f"'{command[3] if command[0] == 'replay' else 't'}' from --bootstrap-servers "
            f"(bootstrap servers {servers}) within 10s: "
        )
        assert err.endswith(
            "; check that the bootstrap servers are right and Kafka is up (--bootstrap-servers, "
            "--kafka-config, CAIRN_KAFKA_CONFIG), then run again\n"
        )

    code, _, err = cli(topics, "--debug", "tokens", "rewind", "t", "--count", "1",
                       "--bootstrap-servers", servers)  # fmt: skip
    assert code == 1
    assert "Traceback (most recent call last)" in err and "KafkaException" in err
    assert "Connection refused" in err  # librdkafka's log, shown when debugging


def test_a_yaml_syntax_error_names_file_line_and_column_and_other_files_still_show(
    tmp_path,
) -> None:
    topics = topics_file(
        tmp_path,
        """
        topics:
          - topic: t
            format: raw
           schedule: "@hourly"
        """,
    )
    folder = tmp_path / "topics.d"
    folder.mkdir()
    topics.rename(folder / "broken.yaml")
    (folder / "fine.yaml").write_text(
        f"topics:\n  - topic: fine\n    format: raw\n"
        f"    archive_root: {(tmp_path / 'archive').as_uri()}\n"
    )
    code, out, err = cli(folder, "status")
    assert code == 2
    assert "fine" in out
    assert err == (
        f"misconfigured: {folder / 'broken.yaml'}, line 5: not valid YAML at column 4: expected "
        "<block end>, but found '<block mapping start>'; fix the file there\n"
    )


def test_an_invalid_entry_names_file_topic_and_field(tmp_path) -> None:
    topics = topics_file(
        tmp_path,
        """
        topics:
          - topic: t
            format: raw
            new_partition_start: oldest
        """,
    )
    code, out, err = cli(topics, "tokens", "list", "t")
    assert (code, out) == (2, "")
    assert err == (
        f"error: {topics}, line 5: topic 't': new_partition_start: Input should be 'earliest' or "
        "'latest'; fix the entry\n"
    )


def test_an_unreachable_storage_endpoint_and_a_missing_topics_file(tmp_path) -> None:
    topics = topics_file(
        tmp_path,
        """
        topics:
          - topic: t
            format: raw
            archive_root: s3://lake@cairn-bucket/kafka
        """,
    )
    endpoint = f"http://127.0.0.1:{closed_port()}"
    connection = f'{{"login": "k", "password": "s", "extra": {{"endpoint_url": "{endpoint}"}}}}'
    code, out, err = cli(topics, "tokens", "list", "t", env={"AIRFLOW_CONN_LAKE": connection})
    assert (code, out) == (3, "")
    assert err.startswith(
        "error: archive root s3://lake@cairn-bucket/kafka cannot be reached: Could not connect "
        f'to the endpoint URL: "{endpoint}/cairn-bucket?'
    )
    assert err.endswith('"; check its endpoint\n') and err.count("\n") == 1

    missing = tmp_path / "nope.yaml"
    assert cli(missing, "status") == (2, "", f"error: {missing}: no such file; check the path\n")


def test_status_shows_the_topics_it_can_and_one_line_for_each_it_cannot(tmp_path) -> None:
    topics = topics_file(
        tmp_path,
        f"""
        topics:
          - topic: fine
            format: raw
            archive_root: {(tmp_path / "archive").as_uri()}
          - topic: lake
            format: raw
            archive_root: s3://lake@cairn-bucket/kafka
          - topic: broken
            format: raw
            codec: lz4
        """,
    )
    code, out, err = cli(topics, "status")
    assert code == 2
    assert "fine" in out and "lake" not in out
    assert err.splitlines() == [
        f"misconfigured: {topics}, line 11: topic 'broken': codec: Input should be 'deflate', "
        "'snappy', 'zstandard' or 'null'",
        "topic lake: error: no AWS credentials for archive root s3://lake@cairn-bucket/kafka: "
        "export the Airflow connection 'lake' as AIRFLOW_CONN_LAKE (JSON: login, password, "
        "extra), or set AWS_ACCESS_KEY_ID or AWS_PROFILE",
    ]
