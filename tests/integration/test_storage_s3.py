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


def test_storages_of_one_process_share_a_client_and_still_see_every_change(
    s3, stack_settings
) -> None:
    """A client per storage cost the triggerer's one I/O thread S3's service model each time
    (`s3_bucket._filesystem`): storages with the same options share one. Sharing must not make
    them see the bucket as it was: a change another writer (another client) made is seen at
    once, in listings, reads and existence checks."""
    root = f"s3://{stack_settings.bucket}/shared-{uuid.uuid4().hex[:8]}"
    one, two = Storage(root, **s3), Storage(root, **s3)
    other = Storage(root, **s3, config_kwargs={"connect_timeout": 7})  # a client of its own
    assert one.backend.fs is two.backend.fs
    assert other.backend.fs is not one.backend.fs

    assert one.list("d") == []
    other.write("d/a.json", b"1")
    assert one.list("d") == ["d/a.json"] and one.read("d/a.json") == b"1"
    other.write("d/a.json", b"2")
    assert two.read("d/a.json") == b"2"
    other.delete("d/a.json")
    assert one.list("d") == [] and not two.exists("d/a.json")
