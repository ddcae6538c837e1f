"""`python -m cairn tokens list|rewind` — inspect and rewind a topic's offset tokens.

Storage credentials for an `s3://<conn_id>@bucket/prefix` root come from the AWS connection
`<conn_id>` given as the variable `AIRFLOW_CONN_<CONN_ID>` (JSON: keys, session token, profile,
endpoint, region, Cairn's encryption settings; a `role_arn` is refused, see
`cairn.s3_access.env_connection_options`); without it, the usual AWS variables, profile or
instance role apply.
Kafka's configuration (librdkafka settings, as a `kafka` Airflow connection's extra holds them,
e.g. for SASL_SSL) comes from `--kafka-config FILE` (JSON, or `key=value` lines), else
`--bootstrap-servers` (plaintext), else the variable `CAIRN_KAFKA_CONFIG` (JSON
`{"config": {...}}`), else `CAIRN_BOOTSTRAP_SERVERS`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime

from cairn import kafka_meta, tokens
from cairn.config import TOPICS_FILE, TopicConfig, find_topic
from cairn.kafka_conf import KafkaAccessDenied, KafkaConf, KafkaConfigError
from cairn.s3_access import env_connection_options
from cairn.storage import Storage


def storage_for(cfg: TopicConfig) -> Storage:
    root = cfg.root
    return Storage(root.storage_url, **env_connection_options(root.conn_id, os.environ))


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
    return 0


def kafka_for(args: argparse.Namespace) -> KafkaConf:
    """The Kafka configuration the arguments or the environment name (see the module doc)."""
    if args.kafka_config:
        return KafkaConf.from_file(args.kafka_config)
    if args.bootstrap_servers:
        return KafkaConf.from_bootstrap(args.bootstrap_servers, "--bootstrap-servers")
    found = KafkaConf.from_env(os.environ)
    if found is None:
        raise SystemExit(
            "rewind needs Kafka: pass --kafka-config FILE or --bootstrap-servers, or set "
            "CAIRN_KAFKA_CONFIG or CAIRN_BOOTSTRAP_SERVERS"
        )
    return found


def rewind(cfg: TopicConfig, args: argparse.Namespace) -> int:
    try:
        state = kafka_meta.fetch_topic(kafka_for(args), cfg.topic)
    except (KafkaConfigError, KafkaAccessDenied) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
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
        return 1
    for key in deleted:
        print(f"deleted {key}")
    print(f"topic {cfg.topic}: the next run re-reads from the newest remaining token")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cairn", description=__doc__.split("\n")[0])
    parser.add_argument("--topics-file", default=str(TOPICS_FILE))
    sub = parser.add_subparsers(dest="group", required=True).add_parser("tokens")
    commands = sub.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list a topic's tokens").add_argument("topic")
    back = commands.add_parser("rewind", help="delete the newest tokens (refused past retention)")
    back.add_argument("topic")
    kafka = back.add_mutually_exclusive_group()
    kafka.add_argument("--kafka-config", metavar="FILE", help="librdkafka settings (JSON)")
    kafka.add_argument("--bootstrap-servers", help="a plaintext cluster's bootstrap servers")
    how = back.add_mutually_exclusive_group(required=True)
    how.add_argument("--count", type=int, help="delete the newest COUNT tokens")
    how.add_argument("--to-seq", type=int, help="keep tokens up to this seq (0: delete all)")
    how.add_argument("--before", help="delete tokens created at or after this ISO time")
    args = parser.parse_args(argv)
    cfg = find_topic(args.topic, args.topics_file)
    return list_tokens(cfg) if args.command == "list" else rewind(cfg, args)
