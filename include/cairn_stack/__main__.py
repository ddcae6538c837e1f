"""`python -m cairn_stack up | down | status | demo | sql … | airflow …` — the local stack.

`CAIRN_CLUSTER=1` (`make up CLUSTER=1`) starts its distributed shape (`cairn_stack.cluster`):
Airflow's CeleryExecutor with Redis and two workers, and a Spark standalone cluster with two
workers that the Spark Connect server and spark-submitted jobs run on. `down` and `status` cover
both shapes.

`airflow …` runs the Airflow CLI against the stack (its home, database and connections), e.g.
`python -m cairn_stack airflow backfill create --dag-id … --from-date … --to-date …`.
`sql "SELECT …"` runs Spark SQL on the stack's Spark Connect server with its Iceberg catalog
(`cairn_stack.sql`), e.g. `sql "SELECT count(*) FROM cairn.cairn.cairn_demo_events"`.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from cairn.kafka.connection import LIBRDKAFKA_LOG
from cairn_stack import cluster, demo, services, sql
from cairn_stack.process import StackError
from cairn_stack.settings import StackSettings

console = Console(stderr=True)


def up(settings: StackSettings) -> None:
    """Start every service (idempotent); if one fails, stop all that this call started."""
    started = []
    try:
        for service in services.all_services(settings):
            was_running = service.pid() is not None
            with console.status(f"starting {service.name} …"):
                service.start(settings.start_timeout)
            if not was_running:
                started.append(service)
            console.print(f"[green]✓[/] {service.name} (log: {service.log})")
    except BaseException:
        for service in reversed(started):
            service.stop()
        raise
    console.print(
        f"Kafka      {settings.bootstrap_servers}  (SASL_SSL: {settings.host}:"
        f"{settings.kafka_sasl_port}, SCRAM-SHA-512 user {settings.kafka_sasl_user}, "
        f"CA {settings.kafka_ca_file})\n"
        f"S3         {settings.s3_endpoint}  bucket {settings.bucket}\n"
        f"Spark      {settings.spark_connect_url}  (Spark Connect on "
        f"{cluster.spark_master_url(settings)})\n"
        f"Iceberg    catalog {settings.catalog_name}: {settings.catalog_jdbc_url}  login "
        f"{settings.catalog_user} / {settings.catalog_password}\n"
        f"Airflow UI {settings.airflow_url}  login {settings.airflow_user} / "
        f"{settings.airflow_password}"
        + (
            f"  (CeleryExecutor, {settings.celery_workers} workers, Redis {settings.redis_url}; "
            f"Spark cluster UI http://{settings.host}:{settings.spark_cluster_ui_port})"
            if settings.cluster
            else ""
        )
    )


def down(settings: StackSettings) -> None:
    for service in reversed(services.every_service(settings)):
        if service.stop():
            console.print(f"stopped {service.name}")


def status(settings: StackSettings) -> int:
    """Print each service's state; exit 1 unless all are healthy."""
    table = Table("service", "state", "pid", "log")
    all_healthy = True
    shape = {service.name for service in services.all_services(settings)}
    for service in services.every_service(settings):
        pid = service.pid()
        if pid is None and service.name not in shape:
            continue  # the other shape's, not running
        healthy = pid is not None and service.healthy()
        all_healthy &= healthy
        state = "healthy" if healthy else ("unhealthy" if pid else "stopped")
        table.add_row(service.name, state, str(pid or "-"), str(service.log))
    Console().print(table)
    return 0 if all_healthy else 1


def main(argv: list[str] | None = None) -> int:
    # librdkafka's retries while Kafka warms up (e.g. "Coordinator load in progress") are
    # handled: only its errors are worth a line here.
    LIBRDKAFKA_LOG.setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(prog="python -m cairn_stack", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status", "demo", "sql", "airflow"])
    parser.add_argument(
        "args", nargs=argparse.REMAINDER, help="for `airflow`: its arguments; for `sql`: a query"
    )
    args = parser.parse_args(argv)
    settings = StackSettings()
    if args.command == "airflow":
        exe = str(Path(sys.executable).parent / "airflow")
        env = {**os.environ, **services.airflow_env(settings)}
        return subprocess.run([exe, *args.args], env=env, check=False).returncode
    try:
        if args.command == "up":
            up(settings)
        elif args.command == "down":
            down(settings)
        elif args.command == "status":
            return status(settings)
        elif args.command == "sql":
            if not args.args:
                parser.error('sql needs a statement: sql "SELECT …"')
            sql.show(settings, " ".join(args.args), Console())
        else:
            up(settings)
            demo.run(settings, console)
    except StackError as err:
        console.print(f"[red]error:[/] {err}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
