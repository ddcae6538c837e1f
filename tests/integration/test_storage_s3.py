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

    def test_a_folder_marker_another_writer_made_is_no_object(self, storage: Storage) -> None:
        """Hadoop's S3A (a Spark table writer) and consoles mark folders with empty `folder/`
        objects: listings never take one for a file (table upkeep would call it an orphan)."""
        storage.write("t/metadata/v1.json", b"{}")
        s3 = storage.backend
        s3.fs.pipe(s3.path("t/metadata") + "/", b"")  # the marker, as S3A writes it
        s3.fs.invalidate_cache()

        assert storage.list("t") == ["t/metadata/v1.json"]
        assert list(storage.modified("t")) == ["t/metadata/v1.json"]
