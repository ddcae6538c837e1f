"""The Airflow edge's failure policy: errors a retry would only repeat fail without retries."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from cairn.fence import Fenced
from cairn.manifest import VerificationFailed
from cairn.plan import RetentionGap, TopicRecreated
from cairn.tokens import RewindRefused
from cairn_airflow import fail_fast


@pytest.mark.parametrize(
    "error", [Fenced, RetentionGap, VerificationFailed, TopicRecreated, RewindRefused]
)
def test_permanent_errors_fail_the_task_without_retries_keeping_the_message(error):
    with pytest.raises(AirflowFailException, match="topic 'orders'"), fail_fast():
        raise error("topic 'orders': what went wrong")


def test_other_errors_stay_retryable():
    with pytest.raises(ConnectionError), fail_fast():
        raise ConnectionError("broker not reachable")
