"""The proof's tally: counting a backup file's records column-wise gives each file's spans, the
records and the checksum, in one go or in pieces, for any partition and offset Kafka allows."""

from __future__ import annotations

import random

import numpy as np

from cairn.datafiles.sealed_file import (
    CHECKSUM_MODULUS,
    SourceTally,
    checksum_share,
    checksum_sum,
)

BIG = 2**63 - 1  # the largest offset a Kafka log can hold


def test_the_columnwise_checksum_is_the_sum_of_the_shares_even_for_the_largest_offsets():
    rng = random.Random(7)
    pairs = [
        (rng.randrange(0, 2**31), rng.choice([0, BIG, rng.randrange(BIG)])) for _ in range(5000)
    ]
    pairs += [(0, CHECKSUM_MODULUS), (2**31 - 1, BIG), (3, CHECKSUM_MODULUS - 1)]
    p = np.array([a for a, _ in pairs], np.int64)
    o = np.array([b for _, b in pairs], np.int64)

    assert checksum_sum(p, o) == sum(checksum_share(a, b) for a, b in pairs)


def test_counting_files_column_wise_gives_each_files_spans_records_and_checksum():
    rng = random.Random(11)
    files = {
        f"backup/t/partition={n}/1_{n}_x.avro": [
            {"_kafka_partition": rng.choice([n, n + 1]), "_kafka_offset": rng.randrange(10**12)}
            for _ in range(rng.randrange(1, 300))
        ]
        for n in range(4)
    }

    def columns(records: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        return (
            np.array([r["_kafka_partition"] for r in records], np.int64),
            np.array([r["_kafka_offset"] for r in records], np.int64),
        )

    whole, pieces = SourceTally(), SourceTally()
    for key, records in files.items():
        whole.add(*columns(records), (key, "2024-06-02T10:00:00+00:00"))
        cut = rng.randrange(len(records))
        for piece in (records[:cut], records[cut:]):
            part = SourceTally()
            if piece:
                part.add(*columns(piece), (key, "2024-06-02T10:00:00+00:00"))
            pieces.merge(part)

    expected = {}
    for key, records in files.items():
        for r in records:
            p, o = r["_kafka_partition"], r["_kafka_offset"]
            first, last, n = expected.get((key, p), (o, o, 0))
            expected[key, p] = (min(first, o), max(last, o), n + 1)
    spans = {(s.source, s.partition): (s.first, s.last, s.records) for s in whole.spans()}
    assert spans == expected
    shares = sum(
        checksum_share(r["_kafka_partition"], r["_kafka_offset"])
        for records in files.values()
        for r in records
    )
    assert (whole.records, whole.checksum) == (sum(len(r) for r in files.values()), shares)
    assert (pieces.records, pieces.checksum, pieces.spans()) == (
        whole.records,
        whole.checksum,
        whole.spans(),
    )
