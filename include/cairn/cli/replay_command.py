"""`replay`: re-produce an exact offset range from the backup to a topic, with progress."""

from __future__ import annotations

import argparse

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cairn.cli.common import OK, UsageError, add_kafka_args, err, kafka_for, out, storage_for
from cairn.config import TopicConfig
from cairn.replay import Range, parse_bound, plan_ranges, replay
from cairn.views.finder import ArchiveIndex

EPILOG = """Ranges: --from P:O is the first offset replayed (inclusive), --to P:O the offset to stop
before (exclusive), as Kafka positions read: --from 0:100 --to 0:200 replays offsets 100..199 of
partition 0. Repeat them for more partitions. A partition with only --from runs to the end of
the archive, one with only --to starts at 0; with neither, every archived partition is replayed
whole. Offsets Kafka never held records at (transaction markers, compaction, accepted gaps) are
skipped. Records keep their partition number, key, headers and timestamp (sent as CreateTime)."""


def add_parser(groups: argparse._SubParsersAction) -> None:
    replay_ = groups.add_parser(
        "replay",
        help="re-produce archived records to a topic",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    replay_.add_argument("topic", help="the archived topic")
    replay_.add_argument("--to-topic", required=True, help="the topic to produce to (must exist)")
    replay_.add_argument("--from", dest="starts", action="append", default=[], metavar="P:O")
    replay_.add_argument("--to", dest="ends", action="append", default=[], metavar="P:O")
    replay_.add_argument(
        "--repartition", action="store_true", help="let the producer pick partitions by key"
    )
    replay_.add_argument("--force", action="store_true", help="allow --to-topic = TOPIC")
    replay_.add_argument(
        "--dry-run", action="store_true", help="show the ranges and files, produce nothing"
    )
    add_kafka_args(replay_)


def run(cfg: TopicConfig, args: argparse.Namespace) -> int:
    if args.to_topic == cfg.topic and not args.force:
        raise UsageError(
            f"--to-topic {args.to_topic!r} is the archived topic itself: its consumers would see "
            "every record twice. Pass --force if that is what you want"
        )
    starts, ends = _bounds(args.starts, "--from"), _bounds(args.ends, "--to")
    index = ArchiveIndex(storage_for(cfg), cfg.topic_name)
    ranges = plan_ranges(starts, ends, index.position())
    if args.dry_run:
        for r in ranges:
            keys = [b.key for b in index.backup_files(r.partition, r.start, r.end)]
            out().print(f"{r}: {len(keys)} backup files")
            for key in keys:
                out().print(f"  {key}")
        return OK
    kafka = kafka_for(args, "replay")
    total = sum(r.end - r.start for r in ranges)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("offsets"),
        TimeRemainingColumn(),
    )
    shown = err()
    with Progress(
        *columns, console=shown, transient=True, disable=not shown.is_terminal
    ) as progress:
        task = progress.add_task(f"replay {cfg.topic} → {args.to_topic}", total=total)
        done = {r: r.start for r in ranges}

        def advance(r: Range, offset: int) -> None:
            progress.advance(task, offset + 1 - done[r])
            done[r] = offset + 1

        result = replay(
            index,
            ranges,
            kafka,
            args.to_topic,
            keep_partitions=not args.repartition,
            progress=advance,
        )
        progress.update(task, completed=total)
    for r in ranges:
        n = result.produced.get(r.partition, 0)
        skipped = r.end - r.start - n
        note = f", {skipped} offsets held no record" if skipped else ""
        out().print(f"{r}: {n} records{note}")
    out().print(
        f"replayed {result.total} records of {cfg.topic} to {escape(args.to_topic)}, "
        "all acknowledged"
    )
    return OK


def _bounds(values: list[str], flag: str) -> dict[int, int]:
    found: dict[int, int] = {}
    for text in values:
        try:
            p, o = parse_bound(text)
        except ValueError as why:
            raise UsageError(f"{flag} {why}") from None
        if p in found:
            raise UsageError(f"{flag} names partition {p} twice")
        found[p] = o
    return found
