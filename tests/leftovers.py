"""What the tests check is left after a sequence: nothing that no token, live attempt or table
snapshot refers to, in the data folders, the staging area and the table's location."""

from __future__ import annotations

from pyiceberg.table import Table

from cairn.protocol import tokens
from cairn.storage.layout import (
    attempts_folder,
    data_prefixes,
    parse_data_key,
    publishing_folder,
)
from cairn.storage.objects import Storage
from cairn.table.offset_index import POINTER
from cairn.views.finder import ArchiveIndex


def staging(storage: Storage, topic: str) -> list[str]:
    """What is in the topic's staging area and pending marks."""
    return storage.list(attempts_folder(topic)) + storage.list(publishing_folder(topic))


def unnamed_data_files(storage: Storage, topic: str) -> set[str]:
    """Data files of the topic that no token's publication names."""
    named = {key for t in tokens.list_tokens(storage, topic) for key in t.adds}
    found = {key for prefix in data_prefixes(topic) for key in storage.list(prefix)}
    return {key for key in found if parse_data_key(key) is not None} - named


def rewound_publications(storage: Storage, topic: str) -> set[str]:
    """Data files a rebuild or seal published before a rewind deleted its token: the only copy
    of their records, which stay (`ArchiveIndex.rewound`)."""
    index = ArchiveIndex(storage, topic)
    found = {f.key for r in index.rebuilds() if r.seq is None for f in r.files}
    return found | {
        f.key for s in index.seals() if s.seq is None for folder in s.folders for f in folder.files
    }


def table_leftovers(table: Table, location: Storage) -> set[str]:
    """Files in the table's location that its metadata does not refer to: not its metadata file
    or one its log names, its offset index, nor a manifest list, manifest or data file of a
    snapshot it keeps."""
    io = table.io
    referenced = {table.metadata_location, table.properties.get(POINTER)}
    referenced |= {entry.metadata_file for entry in table.metadata.metadata_log}
    for snapshot in table.snapshots():
        referenced.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            referenced.add(manifest.manifest_path)
            referenced |= {e.data_file.file_path for e in manifest.fetch_manifest_entry(io)}
    root = location.url.rstrip("/")
    return {f"{root}/{key}" for key in location.list()} - referenced
