"""S3 through an `aws`-type Airflow connection, against the stack's real S3 (SeaweedFS).

The connection is resolved by the Amazon provider's `AwsBaseHook` as in Airflow tasks (the CLI
maps the same variable without Airflow), and every kind of write Cairn makes (whole object,
streamed multipart upload, conditional create, server-side copy) is checked on the server to
carry the connection's server-side encryption. The stack's SeaweedFS has a key-encryption key,
so it encrypts `AES256` writes and reports them as AWS does; an object written without the
setting reads back unencrypted, so the header is what made the difference.
"""

from __future__ import annotations

import functools
import json
import uuid

import pytest

from cairn.cli import main as cli
from cairn.config import TopicConfig
from cairn.storage.objects import ObjectExists, Storage
from cairn_airflow.hooks.connections import storage_options
from cairn_stack import services

CONN_ID = "it_aws"
MULTIPART_CHUNK = 5 * 2**20  # S3's smallest part size


@pytest.fixture
def aws_connection(monkeypatch, stack_settings, s3) -> dict:
    """An `aws` connection to the stack's S3 that asks for SSE-S3 on every write."""
    conn = {
        "conn_type": "aws",
        "login": stack_settings.s3_access_key,
        "password": stack_settings.s3_secret_key,
        "extra": {
            "region_name": "us-east-1",
            "service_config": {"s3": {"endpoint_url": stack_settings.s3_endpoint}},
            "cairn": {"server_side_encryption": "AES256"},
        },
    }
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
    return conn


@pytest.fixture
def topic(stack_settings) -> TopicConfig:
    root = f"s3://{CONN_ID}@{stack_settings.bucket}/aws-{uuid.uuid4().hex[:8]}"
    return TopicConfig(topic="orders", format="raw", archive_root=root)


def encryption(storage: Storage, key: str) -> str | None:
    """The server-side encryption S3 reports for `key`."""
    bucket, _, path = storage.backend.path(key).partition("/")
    return storage.backend.fs.call_s3("head_object", Bucket=bucket, Key=path).get(
        "ServerSideEncryption"
    )


def test_every_write_through_an_aws_connection_is_encrypted_on_the_server(
    aws_connection, topic, monkeypatch
) -> None:
    storage = Storage(topic.root.storage_url, **storage_options(topic))

    storage.write("whole/a.json", b"{}")
    storage.create("_tokens/orders/000000000001.json", b'{"seq": 1}')
    with pytest.raises(ObjectExists):
        storage.create("_tokens/orders/000000000001.json", b'{"seq": 2}')
    # The same upload `open_write` makes, with small parts so a multipart upload stays small.
    small_parts = functools.partial(storage.backend.fs.put_file, chunksize=MULTIPART_CHUNK)
    monkeypatch.setattr(storage.backend.fs, "put_file", small_parts)
    big = uuid.uuid4().bytes * (2 * MULTIPART_CHUNK // 16 + 1)
    with storage.open_write("streamed/big.avro") as out:
        out.write(big)
    storage.move("whole/a.json", "moved/a.json")

    assert storage.list() == [
        "_tokens/orders/000000000001.json",
        "moved/a.json",
        "streamed/big.avro",
    ]
    assert storage.read("_tokens/orders/000000000001.json") == b'{"seq": 1}'
    assert storage.read("streamed/big.avro") == big
    assert storage.backend.fs.info(storage.backend.path("streamed/big.avro"))["ETag"].endswith(
        '-3"'
    )
    for key in storage.list():
        assert encryption(storage, key) == "AES256", key


def test_without_the_setting_objects_are_not_encrypted(s3, stack_settings) -> None:
    storage = Storage(f"s3://{stack_settings.bucket}/plain-{uuid.uuid4().hex[:8]}", **s3)
    storage.write("a.json", b"{}")
    storage.move("a.json", "b.json")
    assert encryption(storage, "b.json") is None


def test_the_stacks_own_connection_resolves_through_the_provider(
    monkeypatch, stack_settings, s3
) -> None:
    name = f"AIRFLOW_CONN_{stack_settings.s3_conn_id.upper()}"
    monkeypatch.setenv(name, services.airflow_env(stack_settings)[name])
    root = f"s3://{stack_settings.s3_conn_id}@{stack_settings.bucket}/stack-{uuid.uuid4().hex[:8]}"
    cfg = TopicConfig(topic="orders", format="raw", archive_root=root)
    storage = Storage(cfg.root.storage_url, **storage_options(cfg))
    storage.create("k", b"v")
    assert storage.read("k") == b"v"
    assert encryption(storage, "k") == "AES256"


def test_cli_reaches_s3_through_the_same_connection(
    aws_connection, make_cfg, tmp_path, monkeypatch, stack_settings, capsys
) -> None:
    root = f"s3://{CONN_ID}@{stack_settings.bucket}/cli-{uuid.uuid4().hex[:8]}"
    make_cfg("cli.orders", root=root)
    args = ["--topics-file", str(tmp_path / "cli.orders.yaml"), "tokens", "list", "cli.orders"]

    assert cli(args) == 0
    assert "topic cli.orders: no tokens" in capsys.readouterr().out

    wrong = {**aws_connection, "password": "not-the-secret"}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(wrong))
    assert cli(args) == 2  # one line naming the root, not a traceback
    assert f"archive root {root} refused access" in capsys.readouterr().err
