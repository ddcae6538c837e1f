"""Raw input: values are archived verbatim in the backup and never parsed.

For topics whose bytes Cairn cannot (or should not) read: no schema, no event time, no
partitioned or quarantine output. A rebuild has nothing to re-derive for them.
"""

from __future__ import annotations

from cairn.formats.base import FieldError, Format, Topic


class RawFormat(Format):
    name = "raw"

    @classmethod
    def check(cls, topic: Topic) -> None:
        if topic.event_time is not None:
            raise FieldError("event_time", "raw topics are backup only; remove it")
        if topic.schema_path is not None:
            raise FieldError("schema", "raw topics are backup only; remove it")
