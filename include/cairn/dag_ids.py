"""The Airflow DAG id of a topic's DAG of each kind: `<kind>__<topic>`, the topic as Kafka names it.

Operators type these ids in the Airflow CLI, in REST calls and in URLs, so the topic stays as it
is: `archive__orders.eu`, `rebuild__orders.eu`. Airflow 3 allows ASCII letters, digits, `-`, `_`
and `.` in a DAG id, at most 250 characters (`airflow.sdk.DAG`); a Kafka topic name uses only
those characters, so every topic of at most `MAX_TOPIC_LENGTH` characters has its DAGs. The kind
never contains `__`, so the first `__` splits an id back into kind and topic, however many `__`
or dots the topic holds.

Before, dots were spelled `__dot__` (`archive__orders__dot__eu`); docs/configuration.md, "DAG
ids", says what an existing deployment does about the change.
"""

from __future__ import annotations

from typing import Literal, get_args

from cairn.storage.layout import check_topic

Kind = Literal["archive", "rebuild", "seal"]
KINDS: tuple[str, ...] = get_args(Kind)

SEPARATOR = "__"
MAX_DAG_ID_LENGTH = 250
"""Airflow's limit on a DAG id."""
MAX_TOPIC_LENGTH = MAX_DAG_ID_LENGTH - max(len(k) for k in KINDS) - len(SEPARATOR)
"""The longest topic whose DAG ids fit Airflow's limit (Kafka allows 249 characters)."""


def dag_id(kind: Kind, topic: str) -> str:
    """The id of `topic`'s DAG of `kind`, e.g. `dag_id("archive", "orders.eu")` is
    `archive__orders.eu`."""
    if kind not in KINDS:
        raise ValueError(f"unknown DAG kind {kind!r}; expected one of {', '.join(KINDS)}")
    return f"{kind}{SEPARATOR}{check_dag_topic(topic)}"


def parse_dag_id(value: str) -> tuple[Kind, str] | None:
    """`(kind, topic)` of one of Cairn's per-topic DAG ids; None for any other DAG."""
    kind, sep, topic = value.partition(SEPARATOR)
    if not sep or kind not in KINDS:
        return None
    try:
        return kind, check_dag_topic(topic)  # type: ignore[return-value]
    except ValueError:
        return None


def check_dag_topic(topic: str) -> str:
    """Return `topic` if it is a Kafka topic name short enough for its DAG ids."""
    check_topic(topic)
    if len(topic) > MAX_TOPIC_LENGTH:
        raise ValueError(
            f"topic {topic!r} is {len(topic)} characters; its DAG ids ({KINDS[0]}{SEPARATOR}…) "
            f"would pass Airflow's {MAX_DAG_ID_LENGTH}: at most {MAX_TOPIC_LENGTH} characters"
        )
    return topic
