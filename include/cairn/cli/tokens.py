"""`tokens list|rewind`: inspect a topic's offset tokens, and rewind (refused past retention)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime

from cairn import kafka_meta, tokens
from cairn.cli.common import FOUND_PROBLEM, OK, USAGE, add_kafka_args, kafka_for, storage_for
from cairn.config import TopicConfig
from cairn.kafka_conf import KafkaAccessDenied, KafkaConfigError


def add_parsers(groups: argparse._SubParsersAction) -> None:
    commands = groups.add_parser("tokens", help="list or rewind a topic's offset tokens")
    sub = commands.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list a topic's tokens").add_argument("topic")
    back = sub.add_parser("rewind", help="delete the newest tokens (refused past retention)")
    back.add_argument("topic")
    add_kafka_args(back)
    how = back.add_mutually_exclusive_group(required=True)
    how.add_argument("--count", type=int, help="delete the newest COUNT tokens")
    how.add_argument("--to-seq", type=int, help="keep tokens up to this seq (0: delete all)")
    how.add_argument("--before", help="delete tokens created at or after this ISO time")


def run(cfg: TopicConfig, args: argparse.Namespace) -> int:
    return list_tokens(cfg) if args.command == "list" else rewind(cfg, args)


def list_tokens(cfg: TopicConfig) -> int:
    found = tokens.list_tokens(storage_for(cfg), cfg.topic)
    if not found:
        print(f"topic {cfg.topic}: no tokens (the next run starts from the beginning)")
    for token in found:
        print(
            f"{token.seq:>6}  {token.created_at:%Y-%m-%d %H:%M:%S}  "
            f"records={token.counts.read:<8} next={json.dumps(token.next_offsets)}"
            + (f"  gaps={len(token.gaps)}" if token.gaps else "")
        )
    return OK


def rewind(cfg: TopicConfig, args: argparse.Namespace) -> int:
    try:
        state = kafka_meta.fetch_topic(kafka_for(args, "rewind"), cfg.topic)
    except (KafkaConfigError, KafkaAccessDenied) as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE
    try:
        deleted = tokens.rewind(
            storage_for(cfg),
            cfg.topic,
            low_watermarks={p: w.low for p, w in state.watermarks.items()},
            compacted=state.compacted,
            count=args.count,
            to_seq=args.to_seq,
            before=datetime.fromisoformat(args.before) if args.before else None,
        )
    except (tokens.RewindRefused, ValueError) as err:
        print(f"refused: {err}", file=sys.stderr)
        return FOUND_PROBLEM
    for key in deleted:
        print(f"deleted {key}")
    print(f"topic {cfg.topic}: the next run re-reads from the newest remaining token")
    return OK
