"""The proof's tally: counting a backup file's records column-wise gives exactly what counting
them one by one gives (spans, records, checksum), for any partition and offset Kafka allows."""

from __future__ import annotations

import random

import numpy as np

from cairn.pipeline.proof import CHECKSUM_MODULUS, SourceTally, checksum_share, checksum_sum

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


def test_counting_a_file_at_once_equals_counting_it_record_by_record():
    rng = random.Random(11)
    files = {
        f"backup/t/partition={n}/1_{n}_x.avro": [
            {"_kafka_partition": rng.choice([n, n + 1]), "_kafka_offset": rng.randrange(10**12)}
            for _ in range(rng.randrange(1, 300))
        ]
        for n in range(4)
    }
    one, many = SourceTally("partitioned"), SourceTally("partitioned")
    for key, records in files.items():
        for record in records:
            one.add(record, (key, "2024-06-02T10:00:00+00:00"))
        many.add_all(records, (key, "2024-06-02T10:00:00+00:00"))

    assert (many.records, many.checksum, many.spans()) == (one.records, one.checksum, one.spans())
    assert many.records == sum(len(r) for r in files.values())
