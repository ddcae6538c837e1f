"""A topic's DAG ids keep the topic as Kafka names it, are valid Airflow DAG ids, and name their
kind and topic back."""

from __future__ import annotations

import re

import pytest
from airflow.sdk import DAG

from cairn.dag_ids import KINDS, MAX_TOPIC_LENGTH, dag_id, parse_dag_id

TOPICS = ["orders.eu", "a.b.c", "a_b", "a-b", "a__b", "A.b", "archive__x", "a..b", "9", "t" * 241]


@pytest.mark.parametrize("topic", TOPICS)
@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_names_the_topic_as_it_is_and_airflow_accepts_it(kind, topic):
    made = dag_id(kind, topic)
    assert made == f"{kind}__{topic}"
    assert parse_dag_id(made) == (kind, topic)
    assert DAG(dag_id=made).dag_id == made  # Airflow's own check: ASCII [\w.-], <= 250


def test_ids_of_different_topics_or_kinds_never_collide():
    made = [dag_id(kind, topic) for kind in KINDS for topic in TOPICS]
    assert len(set(made)) == len(made)


def test_the_documented_example():
    assert dag_id("archive", "cairn.demo.events") == "archive__cairn.demo.events"


@pytest.mark.parametrize("other", ["cairn_discover_topics", "archive", "backup__x", "archive__a/b"])
def test_other_dags_are_not_taken_for_a_topic_s(other):
    assert parse_dag_id(other) is None


def test_a_topic_too_long_or_not_a_kafka_name_is_refused():
    assert MAX_TOPIC_LENGTH == 241
    with pytest.raises(ValueError, match="at most 241 characters"):
        dag_id("archive", "t" * 242)
    with pytest.raises(ValueError, match="invalid Kafka topic name"):
        dag_id("archive", "a/b")
    with pytest.raises(ValueError, match="unknown DAG kind"):
        dag_id("backup", "orders")  # type: ignore[arg-type]
    assert re.fullmatch(r"[\w.-]+", dag_id("seal", "t" * 241))
