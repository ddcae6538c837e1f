"""`python -m cairn_stack sql "SELECT …"`: Spark SQL on the stack's Spark Connect server, with
the stack's Iceberg catalog, so a topic's table is read by name (`cairn.cairn.<table>`).

The catalog's settings (its login among them) are set on this session only: the server's own
command line holds no secret (`cairn_stack.services.spark_connect`).
"""

from __future__ import annotations

import logging

from rich.console import Console
from rich.table import Table

from cairn.table.catalog import spark_conf
from cairn_stack import services
from cairn_stack.process import StackError, port_open
from cairn_stack.settings import StackSettings

SHOWN = 100
"""Rows printed at most."""


def query(settings: StackSettings, statement: str) -> tuple[list[str], list[tuple]]:
    """The statement's columns and its first `SHOWN` rows; a statement Spark refuses is a
    StackError naming Spark's reason (its first line, without the JVM's stack)."""
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession  # the Spark Connect client: only when a query runs

    if not port_open(settings.spark_connect_port, settings.host):
        raise StackError(
            f"no Spark Connect server at {settings.spark_connect_url}: start the stack (make up)"
        )
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)  # raised below
    spark = SparkSession.builder.remote(settings.spark_connect_url).getOrCreate()
    try:
        stack_catalog = services.iceberg_catalog(settings, settings.catalog_warehouse)
        for key, value in spark_conf(stack_catalog).items():
            spark.conf.set(key, value)
        result = spark.sql(statement)
        return result.columns, [tuple(row) for row in result.limit(SHOWN).collect()]
    except PySparkException as err:
        reason = str(err).strip().splitlines()[0]
        raise StackError(f"Spark SQL refused {statement!r}: {reason}") from None
    finally:
        spark.stop()


def show(settings: StackSettings, statement: str, console: Console) -> None:
    columns, rows = query(settings, statement)
    table = Table(*columns)
    for row in rows:
        table.add_row(*(str(v) for v in row))
    console.print(table)
