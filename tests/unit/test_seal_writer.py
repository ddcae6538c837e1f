"""The seal's writer tells a sealed input's records apart by the backup file its header lists
(sealing through the lifecycle, its table files and its inputs read whole or not are in
test_seal.py)."""

from __future__ import annotations

import json

import pytest

from cairn.datafiles.avro_file import Header
from cairn.datafiles.seal_writer import SealRefused, _Sources
from cairn.datafiles.sealed_file import SOURCES, SourceSpan


def test_records_of_a_sealed_input_are_told_apart_by_the_backup_file_its_header_lists():
    spans = [
        SourceSpan(
            source=f"b{n}", processing_time=f"t{n}", partition=p, first=f, last=la, records=1
        )
        for n, (p, f, la) in enumerate([(0, 0, 9), (0, 20, 29), (1, 0, 99)])
    ]
    header = Header(
        schema="{}",
        codec="null",
        metadata={SOURCES: json.dumps([s.model_dump() for s in spans])},
        sync=b"0" * 16,
    )
    sources = _Sources(header, "sealed.avro", "partitioned")
    records = [{"_kafka_partition": p, "_kafka_offset": o} for p, o in [(0, 25), (1, 5), (0, 9)]]

    split = {
        source: list(zip(p.tolist(), o.tolist(), strict=True))
        for source, p, o in sources.split(records)
    }

    assert split == {("b0", "t0"): [(0, 9)], ("b1", "t1"): [(0, 25)], ("b2", "t2"): [(1, 5)]}
    for outside in [(0, 15), (0, 30), (2, 0)]:
        record = {"_kafka_partition": outside[0], "_kafka_offset": outside[1]}
        with pytest.raises(SealRefused, match=f"record {outside[0]}@{outside[1]} is in no"):
            list(sources.split([*records, record]))
