"""The storage promises (`tests/storage_promises.py`) on S3: the real SeaweedFS, each test in a
fresh prefix of the stack's bucket."""

from __future__ import annotations

import uuid

import pytest

from cairn.storage.objects import Storage
from tests.storage_promises import StoragePromises


class TestS3Bucket(StoragePromises):
    @pytest.fixture
    def storage(self, s3, stack_settings) -> Storage:
        return Storage(f"s3://{stack_settings.bucket}/t-{uuid.uuid4().hex[:8]}", **s3)
