"""`tokens list|rewind`: inspect a topic's token chain, and rewind it (refused when the next run
could not read again what it takes back: `cairn.protocol.rewind.refusal`, the rule the run
applies)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime

from cairn.cli.common import FOUND_PROBLEM, OK, add_kafka_args, kafka_for, storage_for
from cairn.config import TopicConfig
from cairn.kafka import cluster
from cairn.protocol import commit, rewind, tokens


def add_parsers(groups: argparse._SubParsersAction) -> None:
    commands = groups.add_parser("tokens", help="list or rewind a topic's offset tokens")
    sub = commands.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list a topic's tokens").add_argument("topic")
    back = sub.add_parser("rewind", help="delete the newest tokens (refused past retention)")
    back.add_argument("topic")
    add_kafka_args(back)
    how = back.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--count", type=int, help="take back the newest COUNT archive runs (and tokens above them)"
    )
    how.add_argument("--to-seq", type=int, help="keep tokens up to this seq (0: delete all)")
    how.add_argument("--before", help="delete tokens created at or after this ISO time")


def run(cfg: TopicConfig, args: argparse.Namespace) -> int:
    return list_tokens(cfg) if args.command == "list" else rewind_tokens(cfg, args)


def list_tokens(cfg: TopicConfig) -> int:
    found = tokens.list_tokens(storage_for(cfg), cfg.topic_name)
    if not found:
        print(f"topic {cfg.topic}: no tokens (the next run starts from the beginning)")
    previous = None
    for token in found:
        if previous is not None and token.seq != previous + 1:
            print(
                f"{'':>6}  (tokens {previous + 1}..{token.seq - 1} are missing: a hole in the "
                "history, not a rewind; the tokens above it count)"
            )
        previous = token.seq
        what = f"records={token.counts.read:<8}" if token.kind == "archive" else token.kind
        print(
            f"{token.seq:>6}  {token.created_at:%Y-%m-%d %H:%M:%S}  {what:<16} "
            f"next={json.dumps(token.next_offsets)}"
            + (f"  gaps={len(token.gaps)}" if token.gaps else "")
            + (f"  adopted={json.dumps(token.adopted)}" if token.adopted else "")
        )
    return OK


def rewind_tokens(cfg: TopicConfig, args: argparse.Namespace) -> int:
    kafka = kafka_for(args, "rewind")
    state = cluster.fetch_topic(kafka, cfg.topic_name)
    storage = storage_for(cfg)
    try:
        deleted = rewind.rewind(
            storage,
            cfg,
            state,
            count=args.count,
            to_seq=args.to_seq,
            before=datetime.fromisoformat(args.before) if args.before else None,
        )
    except (rewind.RewindRefused, ValueError) as err:
        print(f"refused: {err}", file=sys.stderr)
        return FOUND_PROBLEM
    for key in deleted:
        print(f"deleted {key}")
    print(f"topic {cfg.topic}: the next run re-reads from the newest remaining token")
    newest = commit.newest(storage, cfg.topic_name)
    if cfg.commit_consumer_group and newest is not None:
        # The group follows the tokens back, so lag tools and the triggerer of a run_on: records
        # topic see the rewound records waiting (the archive's commits never move it back).
        cluster.commit_group_offsets(kafka, cfg.group_id, cfg.topic_name, newest.next_offsets)
        print(f"consumer group {cfg.group_id} moved back to {dict(newest.next_offsets)}")
    return OK
