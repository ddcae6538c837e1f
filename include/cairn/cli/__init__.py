"""`python -m cairn`: look into a topic's archive, check it, replay from it, and manage tokens.

    status                                   every configured topic: position, lag, last run
    files TOPIC --date D                     a date's partitioned and quarantine files
    find TOPIC PARTITION OFFSET              a record's backup copy and where it was filed
    cat TOPIC (--date D | --file KEY)        quarantined records with their reasons
    verify TOPIC --date D                    check a date against the backup: every record once
    replay TOPIC --to-topic T [--from P:O] [--to P:O]   re-produce records from the backup
    tokens list|rewind TOPIC                 a topic's offset tokens
    config-reference                         every key of a topics file: type, default, meaning

Exit status: 0 done; 1 a mismatch, a record or file not found, a refused rewind or a failed
delivery; 2 a usage or configuration error (the topics file, an argument, credentials, Kafka
settings); 3 Kafka or the archive's storage could not be reached. An error is one line on stderr
naming what is wrong and what to do; `--debug` shows its traceback (and librdkafka's log).

Topics come from the topics file or folder of them (`--topics-file`, else `CAIRN_TOPICS_FILE`,
else include/topics.yaml). Storage credentials for an `s3://<conn_id>@bucket/prefix` root come
from the AWS connection `<conn_id>` given as the variable `AIRFLOW_CONN_<CONN_ID>` (JSON: keys,
session token, profile, endpoint, region, Cairn's encryption settings; a `role_arn` is refused,
see `cairn.storage.s3_access.env_connection_options`); without it, the usual AWS variables,
profile or instance role apply.
Kafka's configuration (librdkafka settings, as a `kafka` Airflow connection's extra holds them,
e.g. for SASL_SSL), for `replay` and `tokens rewind`, comes from `--kafka-config FILE` (JSON, or
`key=value` lines), else `--bootstrap-servers` (plaintext), else the variable
`CAIRN_KAFKA_CONFIG` (JSON `{"config": {...}}`), else `CAIRN_BOOTSTRAP_SERVERS`.
"""

from __future__ import annotations

import argparse

from rich.markup import escape

from cairn.cli import inspect_commands, replay_command, tokens_command
from cairn.cli.common import OK, err
from cairn.cli.error_lines import explain
from cairn.config import TopicConfig
from cairn.topics_file import TOPICS_FILE, find_topic
from cairn.views.config_reference import reference

_PER_TOPIC = {
    "files": inspect_commands.files,
    "find": inspect_commands.find,
    "cat": inspect_commands.cat,
    "verify": inspect_commands.verify,
    "replay": replay_command.run,
    "tokens": tokens_command.run,
}


def parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    made = argparse.ArgumentParser(
        prog="python -m cairn",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    made.add_argument("--topics-file", default=str(TOPICS_FILE))
    made.add_argument("--debug", action="store_true", help="on an error, show its traceback")
    groups = made.add_subparsers(dest="group", required=True)
    inspect_commands.add_parsers(groups)
    replay_command.add_parser(groups)
    tokens_command.add_parsers(groups)
    groups.add_parser("config-reference", help="every key of a topics file")
    return made


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    cfg: TopicConfig | None = None
    try:
        if args.group == "status":
            return inspect_commands.status(args.topics_file, args.debug)
        if args.group == "config-reference":
            print(reference(), end="")
            return OK
        cfg = find_topic(args.topic, args.topics_file)
        return _PER_TOPIC[args.group](cfg, args)
    except Exception as why:
        if args.debug:
            raise
        code, line = explain(why, cfg)
        err().print(escape(line), soft_wrap=True)
        return code
