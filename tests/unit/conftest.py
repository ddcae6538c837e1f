"""Fixtures and factories the unit tests share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cairn.storage import Storage
from cairn.tokens import Token

T0 = datetime(2024, 5, 1, tzinfo=UTC)


@pytest.fixture
def storage(tmp_path) -> Storage:
    """A fresh local archive root."""
    return Storage(f"file://{tmp_path}/archive")


def make_token(seq: int, next_offsets: dict[int, int], previous=None, run_id="run") -> Token:
    """Token `seq` of topic `orders`, created `seq` hours after T0."""
    return Token(
        seq=seq,
        topic="orders",
        generation=1,
        next_offsets=next_offsets,
        previous_offsets=previous or {},
        run_id=run_id,
        created_at=T0 + timedelta(hours=seq),
        planned_at=T0 + timedelta(hours=seq),
    )
