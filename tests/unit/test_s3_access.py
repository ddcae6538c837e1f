"""An AWS connection → s3fs options: Cairn's settings, the mapping, and the Amazon provider's
resolution of keys, session token, profile, endpoint and region (no network: nothing here
assumes a role)."""

from __future__ import annotations

import json
import os

import pytest
from airflow.sdk.exceptions import AirflowFailException

from cairn.config import TopicConfig
from cairn.errors import PermanentError
from cairn.storage.s3_access import (
    ConnectionMissing,
    Credentials,
    S3Settings,
    S3SettingsInvalid,
    connection_options,
    env_connection_options,
    s3_options,
)
from cairn_airflow.failures import fail_fast
from cairn_airflow.hooks.connections import storage_options

KEYS = Credentials("AKIAEXAMPLEKEY", "secret-access-key", "session-token-123")


def test_no_cairn_settings_means_no_encryption_and_shipped_keys():
    settings = S3Settings.from_extra("s3", {"region_name": "eu-west-1"})
    assert settings == S3Settings()
    assert settings.write_kwargs() == {}
    assert settings.spark_credentials == "connection"


@pytest.mark.parametrize(
    ("cairn", "write_kwargs"),
    [
        ({"server_side_encryption": "AES256"}, {"ServerSideEncryption": "AES256"}),
        (
            {"server_side_encryption": "aws:kms", "sse_kms_key_id": "arn:aws:kms:k"},
            {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "arn:aws:kms:k"},
        ),
        ({"server_side_encryption": "aws:kms"}, {"ServerSideEncryption": "aws:kms"}),
    ],
)
def test_encryption_settings_become_boto_write_arguments(cairn, write_kwargs):
    assert S3Settings.from_extra("s3", {"cairn": cairn}).write_kwargs() == write_kwargs


@pytest.mark.parametrize(
    ("cairn", "blamed"),
    [
        ({"server_side_encrytion": "AES256"}, "server_side_encrytion"),
        ({"server_side_encryption": "aes256"}, "server_side_encryption"),
        ({"server_side_encryption": "AES256", "sse_kms_key_id": "k"}, "sse_kms_key_id"),
        ({"spark_credentials": "instance-role"}, "spark_credentials"),
    ],
)
def test_invalid_settings_fail_naming_the_connection_and_the_key(cairn, blamed):
    with pytest.raises(S3SettingsInvalid, match=rf"AWS connection 'prod_s3'.*{blamed}"):
        S3Settings.from_extra("prod_s3", {"cairn": cairn})


def test_options_carry_keys_token_endpoint_region_and_encryption():
    settings = S3Settings(server_side_encryption="AES256")
    options = s3_options(KEYS, "http://127.0.0.1:8333", "eu-west-1", settings)
    assert options == {
        "key": "AKIAEXAMPLEKEY",
        "secret": "secret-access-key",
        "token": "session-token-123",
        "endpoint_url": "http://127.0.0.1:8333",
        "client_kwargs": {"region_name": "eu-west-1"},
        "s3_additional_kwargs": {"ServerSideEncryption": "AES256"},
    }


def test_options_without_credentials_leave_them_to_s3fs():
    assert s3_options(None) == {}
    assert s3_options(Credentials("AKIA", "secret")) == {"key": "AKIA", "secret": "secret"}


def test_credentials_never_show_their_secrets():
    assert "secret-access-key" not in repr(KEYS)
    assert "session-token-123" not in repr(KEYS)


def test_spark_on_an_instance_role_gets_no_keys_and_no_role_is_assumed_for_it():
    extra = {"cairn": {"spark_credentials": "instance", "server_side_encryption": "AES256"}}

    def credentials():
        raise AssertionError("credentials resolved for a job that ships none")

    options = connection_options("s3", extra, "http://s3", "eu-west-1", credentials, for_spark=True)
    assert options == {
        "endpoint_url": "http://s3",
        "client_kwargs": {"region_name": "eu-west-1"},
        "s3_additional_kwargs": {"ServerSideEncryption": "AES256"},
    }
    # Airflow's own tasks still use the connection's keys.
    tasks = connection_options("s3", extra, None, None, lambda: KEYS)
    assert (tasks["key"], tasks["token"]) == ("AKIAEXAMPLEKEY", "session-token-123")


# Through the Amazon provider: the plugin resolves the connection with AwsBaseHook.


def s3_topic(conn_id: str = "archive_s3") -> TopicConfig:
    return TopicConfig(topic="orders", format="raw", archive_root=f"s3://{conn_id}@bucket/x")


def set_connection(monkeypatch, conn_id: str, **conn) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "aws", **conn}))


def test_plugin_resolves_keys_session_token_s3_endpoint_and_region(monkeypatch):
    set_connection(
        monkeypatch,
        "archive_s3",
        login="AKIAEXAMPLEKEY",
        password="secret-access-key",
        extra={
            "aws_session_token": "session-token-123",
            "region_name": "eu-central-1",
            "endpoint_url": "http://elsewhere:1",
            "service_config": {"s3": {"endpoint_url": "http://127.0.0.1:8333"}},
            "cairn": {"server_side_encryption": "AES256"},
        },
    )
    assert storage_options(s3_topic()) == {
        "key": "AKIAEXAMPLEKEY",
        "secret": "secret-access-key",
        "token": "session-token-123",
        "endpoint_url": "http://127.0.0.1:8333",
        "client_kwargs": {"region_name": "eu-central-1"},
        "s3_additional_kwargs": {"ServerSideEncryption": "AES256"},
    }


def test_the_cli_maps_a_connection_variable_as_the_plugin_resolves_it(monkeypatch):
    """Outside Airflow (the CLI) the same connection gives the same options, with no hook."""
    extra = {
        "aws_session_token": "session-token-123",
        "region_name": "eu-central-1",
        "service_config": {"s3": {"endpoint_url": "http://127.0.0.1:8333"}},
        "cairn": {"server_side_encryption": "AES256"},
    }
    set_connection(
        monkeypatch, "archive_s3", login="AKIAEXAMPLEKEY", password="secret-access-key", extra=extra
    )
    assert env_connection_options("archive_s3", os.environ) == storage_options(s3_topic())


def test_the_cli_passes_a_profile_and_refuses_a_role_it_cannot_assume():
    profile = {"AIRFLOW_CONN_S3": json.dumps({"extra": {"profile_name": "archiver"}})}
    assert env_connection_options("s3", profile) == {"profile": "archiver"}
    role = {"AIRFLOW_CONN_S3": json.dumps({"extra": {"role_arn": "arn:aws:iam::1:role/r"}})}
    with pytest.raises(S3SettingsInvalid, match=r"'s3' assumes a role.*profile_name"):
        env_connection_options("s3", role)
    with pytest.raises(S3SettingsInvalid, match="AIRFLOW_CONN_S3: expected a JSON"):
        env_connection_options("s3", {"AIRFLOW_CONN_S3": "aws://key:secret@"})
    assert env_connection_options("s3", {}) == {}


def test_plugin_resolves_a_named_profile(monkeypatch, tmp_path):
    shared = tmp_path / "credentials"
    shared.write_text(
        "[archiver]\naws_access_key_id = AKIAPROFILEKEY\naws_secret_access_key = profile-secret\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(shared))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    set_connection(monkeypatch, "archive_s3", extra={"profile_name": "archiver"})
    options = storage_options(s3_topic())
    assert (options["key"], options["secret"]) == ("AKIAPROFILEKEY", "profile-secret")


def test_plugin_ships_no_keys_to_spark_on_an_instance_role(monkeypatch):
    extra = {"region_name": "eu-west-1", "cairn": {"spark_credentials": "instance"}}
    set_connection(
        monkeypatch, "archive_s3", login="AKIAEXAMPLEKEY", password="s3cr3t!", extra=extra
    )
    shipped = json.dumps(storage_options(s3_topic(), for_spark=True))
    assert "AKIAEXAMPLEKEY" not in shipped and "s3cr3t!" not in shipped
    assert storage_options(s3_topic())["key"] == "AKIAEXAMPLEKEY"


def test_a_root_whose_connection_does_not_exist_fails_the_task_at_once(monkeypatch):
    """A missing connection stays missing however often the task retries: a permanent error,
    one line naming the connection and how to create it."""
    monkeypatch.delenv("AIRFLOW_CONN_MISSING_S3", raising=False)
    with pytest.raises(ConnectionMissing) as caught:
        storage_options(s3_topic("missing_s3"))
    assert isinstance(caught.value, PermanentError)
    message = str(caught.value)
    assert "topic 'orders': no Airflow connection 'missing_s3'" in message
    assert "airflow connections add missing_s3 --conn-type aws" in message
    assert "AIRFLOW_CONN_MISSING_S3" in message and "\n" not in message
    failed = pytest.raises(AirflowFailException, match="ConnectionMissing: topic 'orders'")
    with failed, fail_fast():
        storage_options(s3_topic("missing_s3"))
    # a missing connection is not remembered: created, the next use finds it
    set_connection(monkeypatch, "missing_s3", login="AKIAEXAMPLEKEY", password="secret")
    assert storage_options(s3_topic("missing_s3"))["key"] == "AKIAEXAMPLEKEY"


def test_local_roots_need_no_connection():
    assert storage_options(TopicConfig(topic="orders", format="raw")) == {}
