"""The promises every storage backend keeps, as one set of tests each backend must pass.

A backend's test class subclasses `StoragePromises` and supplies a fixture `storage`: a fresh,
empty root of that backend. Local disk and memory run in the unit suite
(`tests/unit/test_storage.py`), S3 against the real SeaweedFS in the integration suite
(`tests/integration/test_storage_s3.py`).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from cairn.storage.objects import ObjectExists, Storage

RACERS = 8


class StoragePromises:
    def test_write_read_list_delete(self, storage: Storage) -> None:
        storage.write("backup/t/partition=0/a.avro", b"one")
        storage.write("backup/t/partition=1/b.avro", b"two")
        storage.write("backup/t/partition=0/a.avro", b"one again")

        assert storage.read("backup/t/partition=0/a.avro") == b"one again"
        assert storage.exists("backup/t/partition=0/a.avro")
        assert storage.size("backup/t/partition=0/a.avro") == len(b"one again")
        assert storage.list("backup/t") == [
            "backup/t/partition=0/a.avro",
            "backup/t/partition=1/b.avro",
        ]
        assert storage.list("nothing/here") == []

        storage.delete("backup/t/partition=0/a.avro")
        storage.delete("backup/t/partition=0/a.avro")  # deleting twice is fine
        assert storage.list() == ["backup/t/partition=1/b.avro"]
        assert not storage.exists("backup/t/partition=0/a.avro")
        with pytest.raises(FileNotFoundError):
            storage.read("backup/t/partition=0/a.avro")

    def test_lists_children_and_keys_after_a_bound(self, storage: Storage) -> None:
        for gen, offset in ((1, 0), (1, 5), (1, 12), (1, 40), (10, 7)):
            storage.write(f"backup/t/partition=0/{gen}_0_{offset:020d}.avro", b"x")
        storage.write("backup/t/partition=0/sub/deeper.avro", b"x")

        after = storage.list_after("backup/t/partition=0", f"1_0_{12:020d}")
        assert after == [
            f"backup/t/partition=0/1_0_{12:020d}.avro",
            f"backup/t/partition=0/1_0_{40:020d}.avro",
        ]  # only direct children, from the bound on (`10_…` sorts before `1_…`)
        assert storage.list_after("backup/t/partition=0/", "10_0_", beginning="10_") == [
            f"backup/t/partition=0/10_0_{7:020d}.avro"
        ]
        assert storage.list_after("backup/t/partition=0/", "", beginning="2_") == []
        assert storage.name_heads("backup/t/partition=0", "_") == {"1_", "10_"}
        assert storage.children("backup/t/") == ["backup/t/partition=0/"]
        assert storage.children("backup/t/partition=0/")[-1] == "backup/t/partition=0/sub/"
        assert storage.holds_any("backup/t") and not storage.holds_any("backup/other")
        assert storage.list_after("nothing/here", "") == [] and storage.children("nothing/") == []
        assert storage.name_heads("nothing/here", "_") == set()

    def test_moves_reads_heads_and_deletes_folders(self, storage: Storage) -> None:
        storage.write("_attempts/t/a1/backup/t/partition=0/x.avro", b"0123456789")
        staged = storage.child("_attempts/t/a1")
        assert staged.url == f"{storage.url}/_attempts/t/a1"
        assert staged.read("backup/t/partition=0/x.avro") == b"0123456789"
        assert storage.read_head("_attempts/t/a1/backup/t/partition=0/x.avro", 4) == b"0123"
        with storage.open_read("_attempts/t/a1/backup/t/partition=0/x.avro") as f:
            assert f.read() == b"0123456789"

        storage.move("_attempts/t/a1/backup/t/partition=0/x.avro", "backup/t/partition=0/x.avro")
        storage.move("_attempts/t/a1/backup/t/partition=0/x.avro", "backup/t/partition=0/x.avro")

        assert storage.read("backup/t/partition=0/x.avro") == b"0123456789"
        storage.write("_attempts/t/a1/other/y", b"y")
        storage.delete_prefix("_attempts/t/a1/")
        storage.delete_prefix("_attempts/t/a1/")  # twice is fine
        assert storage.list() == ["backup/t/partition=0/x.avro"]
        with pytest.raises(FileNotFoundError):
            storage.move("_attempts/t/a2/missing", "backup/t/partition=0/missing.avro")
        sizes = storage.sizes(["backup/t/partition=0/x.avro", "backup/t/partition=0/gone.avro"])
        assert sizes == {"backup/t/partition=0/x.avro": 10, "backup/t/partition=0/gone.avro": None}

    def test_create_is_create_if_absent(self, storage: Storage) -> None:
        storage.create("_tokens/t/000000000001.json", b'{"seq": 1}')
        with pytest.raises(ObjectExists):
            storage.create("_tokens/t/000000000001.json", b'{"seq": "impostor"}')
        assert storage.read("_tokens/t/000000000001.json") == b'{"seq": 1}'
        assert storage.list("_tokens/t") == ["_tokens/t/000000000001.json"]

    def test_of_racing_creates_exactly_one_wins(self, storage: Storage) -> None:
        """However the racers interleave, one creates each key and every other one is told."""
        start = threading.Barrier(RACERS)

        def race(racer: int, key: str) -> bool:
            start.wait()
            try:
                storage.create(key, f"racer {racer}".encode())
            except ObjectExists:
                return False
            return True

        with ThreadPoolExecutor(RACERS) as pool:
            for seq in range(3):
                key = f"_tokens/t/{seq:012d}.json"
                won = list(pool.map(race, range(RACERS), [key] * RACERS))
                assert won.count(True) == 1
                assert storage.read(key) == f"racer {won.index(True)}".encode()

    def test_a_streamed_object_appears_whole_or_not_at_all(self, storage: Storage) -> None:
        with storage.open_write("backup/t/partition=0/x.avro") as out:
            out.write(b"partial" * 1000)
            assert not storage.exists("backup/t/partition=0/x.avro")
            assert storage.list() == []
        assert storage.read("backup/t/partition=0/x.avro") == b"partial" * 1000

        with pytest.raises(RuntimeError), storage.open_write("backup/t/partition=0/y.avro") as out:
            out.write(b"partial" * 1000)
            raise RuntimeError("writer crashed")
        assert storage.list() == ["backup/t/partition=0/x.avro"]

    def test_listings_see_what_another_client_did_just_before(self, storage: Storage) -> None:
        """Nothing is cached: a listing after another client's write or delete sees it."""
        other = Storage(storage.url, **storage.options)
        storage.write("backup/t/partition=0/1_0_00000000000000000000.avro", b"x")
        assert storage.list_after("backup/t/partition=0", "") and storage.children("backup/t/")

        other.write("backup/t/partition=0/1_0_00000000000000000009.avro", b"y")
        other.write("backup/t/partition=1/1_1_00000000000000000000.avro", b"z")
        assert len(storage.list("backup/t")) == 3
        assert len(storage.list_after("backup/t/partition=0", "")) == 2
        assert len(storage.children("backup/t/")) == 2

        other.delete_prefix("backup/t/")  # (a store may keep the empty folders: SeaweedFS does)
        assert storage.list("backup/t") == [] and not storage.holds_any("backup/t")
        assert storage.list_after("backup/t/partition=0", "") == []
        assert not storage.exists("backup/t/partition=1/1_1_00000000000000000000.avro")

    def test_the_version_changes_with_every_write_of_other_bytes(self, storage: Storage) -> None:
        storage.write("_claims/t/a.json", b"first")
        first = storage.version("_claims/t/a.json")
        storage.write("_claims/t/a.json", b"other")  # the same size
        second = storage.version("_claims/t/a.json")

        assert first != second
        assert storage.versions("_claims") == {"_claims/t/a.json": second}
        with pytest.raises(FileNotFoundError):
            storage.version("_claims/t/missing.json")

    def test_a_listing_says_when_each_object_was_last_written(self, storage: Storage) -> None:
        """What table upkeep ages orphan files by (a store's clock, to the second)."""
        before = datetime.now(UTC) - timedelta(seconds=2)
        storage.write("t/metadata/a.json", b"a")
        storage.write("t/metadata/deep/b.json", b"b")
        found = storage.modified("t/metadata")
        after = datetime.now(UTC) + timedelta(seconds=2)

        assert list(found) == ["t/metadata/a.json", "t/metadata/deep/b.json"]
        assert all(before <= when <= after for when in found.values())
        assert storage.modified("nothing/here") == {}

    def test_keys_escaping_the_root_are_refused(self, storage: Storage) -> None:
        for key in ("../outside", "backup/../../x", "a//b", ""):
            with pytest.raises(ValueError, match="invalid storage key"):
                storage.write(key, b"x")
