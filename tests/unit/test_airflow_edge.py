"""The Airflow edge: errors a retry would only repeat fail without retries; connections become
the plain values the core takes."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from cairn.config import TopicConfig
from cairn.fence import Fenced
from cairn.manifest import VerificationFailed
from cairn.plan import RetentionGap, TopicRecreated
from cairn.tokens import RewindRefused
from cairn_airflow import fail_fast, schema_registries


@pytest.mark.parametrize(
    "error", [Fenced, RetentionGap, VerificationFailed, TopicRecreated, RewindRefused]
)
def test_permanent_errors_fail_the_task_without_retries_keeping_the_message(error):
    with pytest.raises(AirflowFailException, match="topic 'orders'"), fail_fast():
        raise error("topic 'orders': what went wrong")


def test_other_errors_stay_retryable():
    with pytest.raises(ConnectionError), fail_fast():
        raise ConnectionError("broker not reachable")


def test_schema_registry_connections_become_client_configs(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_CAIRN_SCHEMA_REGISTRY",
        '{"conn_type": "http", "host": "https://sr.example.com", "port": 8081,'
        ' "login": "key", "password": "secret", "extra": {"timeout": 5}}',
    )
    cfg = TopicConfig.model_validate(
        {"topic": "t", "format": "avro", "avro": {"registry": "cairn_schema_registry"}}
    )
    assert schema_registries(cfg) == {
        "cairn_schema_registry": {
            "url": "https://sr.example.com:8081",
            "basic.auth.user.info": "key:secret",
            "timeout": 5,
        }
    }
    assert schema_registries(TopicConfig(topic="r", format="raw")) == {}
