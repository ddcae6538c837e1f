"""Where a topic's Iceberg table lives: one catalog description → what Spark and pyiceberg need.

Sealed dates go into an Apache Iceberg table per topic in a real catalog, written by Spark and
read (and committed to) by pyiceberg. Both must see the same catalog, so one `Catalog` model is
the single description and the two mappings below are derived from it, never written by hand:

- `spark_conf`: the `spark.sql.catalog.<name>.*` entries of a Spark session (runtime settings:
  a Spark Connect session may set them itself, so no secret sits on the server's command line).
  Spark reads them when the session first uses the catalog; later changes are not seen.
- `pyiceberg_properties`: the properties of `pyiceberg.catalog.load_catalog(catalog.name, ...)`.
  The name matters: the JDBC catalog stores it in each row, so a pyiceberg catalog loaded under
  another name than Spark's sees none of Spark's tables.

The JDBC catalog's database schema is pinned to V1 on both sides (`jdbc.schema-version`,
`schema_version`). pyiceberg 0.12 creates missing catalog tables in V1 (with the
`iceberg_type` column, needed for views) while Iceberg 1.10's Java `JdbcCatalog` creates them in
V0 and adds the column only when told V1; each side detects an existing column and then works
in V1. Pinned, the database ends up the same whichever client touches it first, and both read
and write the same rows (`iceberg_type` = `TABLE`, or NULL for rows written under V0).

A table's files are reached through the catalog's FileIO: Iceberg's `S3FileIO` (the
iceberg-aws-bundle jar) on S3, Hadoop's local file system for a folder. pyiceberg reads S3 with
pyarrow, which needs the region given: without one it asks AWS where the bucket is.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from cairn.storage.layout import check_topic

NAMESPACE = "cairn"
SEALS_AT_ONCE = 2
"""Seal runs of one topic at once (the seal DAG's `max_active_runs`): what its table takes.
Each retries a commit another one beat (`cairn.table.iceberg.replace_date`), so two seals of
different dates cost each other at most a try, and a backlog of dates is sealed two by two."""
"""The namespace of Cairn's tables: Spark SQL names a topic's table `<catalog>.cairn.<table>`."""

SPARK_CATALOG = "org.apache.iceberg.spark.SparkCatalog"
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
HADOOP_FILE_IO = "org.apache.iceberg.hadoop.HadoopFileIO"

_TABLE_NAME_MAX = 255
"""The JDBC catalog's `table_name` column (and Glue's limit): a hashed name is cut to fit."""
_UNCHANGED = re.compile(r"[a-z0-9_]+")


class TableTarget(BaseModel):
    """Where a topic's table is: its identifier and location (`file:///…` or `s3://…`)."""

    identifier: str
    location: str


class S3Access(BaseModel):
    """How a warehouse on S3 is reached. Keys left out: the client's own credential chain."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str
    endpoint: str | None = None
    """An S3-compatible server's URL (`http://127.0.0.1:8333`); None for AWS."""
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    path_style_access: bool = False
    """Buckets in the path, not the host name: SeaweedFS, MinIO and other local servers."""


class Catalog(BaseModel):
    """One Iceberg catalog and its warehouse, as Cairn's Spark jobs and pyiceberg reach it.

    - `jdbc`: `uri` is a PostgreSQL JDBC URL (`jdbc:postgresql://host:5432/cairn_catalog`),
      `user`/`password` its login.
    - `rest`: `uri` is the REST catalog's URL; `user`/`password` become its OAuth2 client
      credential (`user:password`), if given.
    - `glue`: AWS Glue in `s3.region`; no `uri`, and the warehouse is on S3.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("cairn", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    type: Literal["jdbc", "rest", "glue"]
    uri: str | None = None
    user: str | None = None
    password: SecretStr | None = None
    warehouse: str
    """Where new tables go: `s3://bucket/prefix` or a local `file:///folder` (a REST catalog
    may instead take the name of a warehouse it knows)."""
    s3: S3Access | None = None
    """Given: the tables' files are on S3, read and written with it. None: a local folder."""

    @model_validator(mode="after")
    def _complete(self) -> Catalog:
        if self.type == "jdbc" and not (self.uri or "").startswith("jdbc:postgresql://"):
            raise ValueError("a jdbc catalog needs uri jdbc:postgresql://host:port/database")
        if self.type == "rest" and not (self.uri or "").startswith(("http://", "https://")):
            raise ValueError("a rest catalog needs an http(s) uri")
        if self.type == "glue" and self.uri is not None:
            raise ValueError("a glue catalog takes no uri (its region is s3.region)")
        if self.type == "glue" and self.s3 is None:
            raise ValueError("a glue catalog's warehouse is on S3: give s3 (at least region)")
        if self.warehouse.startswith(("s3://", "s3a://")) and self.s3 is None:
            raise ValueError(f"warehouse {self.warehouse} is on S3: give s3 (at least region)")
        return self


def connection_extra(catalog: Catalog) -> dict[str, Any]:
    """The catalog as an Airflow connection's extra (`cairn_airflow.hooks.catalog`), secrets as
    they are: its login and password go in the connection's own fields."""
    extra = catalog.model_dump(mode="json", exclude={"user", "password", "s3"}, exclude_none=True)
    if catalog.s3 is not None:
        s3 = catalog.s3.model_dump(mode="json", exclude_none=True)
        if catalog.s3.secret_access_key is not None:
            s3["secret_access_key"] = catalog.s3.secret_access_key.get_secret_value()
        extra["s3"] = s3
    return extra


def spark_conf(catalog: Catalog) -> dict[str, str]:
    """The Spark settings that make `catalog` Spark SQL's catalog `catalog.name`."""
    props: dict[str, str] = {"warehouse": catalog.warehouse}
    if catalog.type == "jdbc":
        props |= {"type": "jdbc", "uri": _uri(catalog), "jdbc.schema-version": "V1"}
        props |= _login({"jdbc.user": catalog.user, "jdbc.password": catalog.password})
    elif catalog.type == "rest":
        props |= {"type": "rest", "uri": _uri(catalog)} | _credential(catalog)
    else:
        props["type"] = "glue"
    if (s3 := catalog.s3) is not None:
        props |= {"io-impl": S3_FILE_IO, "client.region": s3.region} | _s3_login(s3)
        props["s3.path-style-access"] = str(s3.path_style_access).lower()
    elif catalog.type == "jdbc":
        props["io-impl"] = HADOOP_FILE_IO
    prefix = f"spark.sql.catalog.{catalog.name}"
    return {prefix: SPARK_CATALOG} | {f"{prefix}.{key}": value for key, value in props.items()}


def pyiceberg_properties(catalog: Catalog) -> dict[str, str]:
    """The properties of `load_catalog(catalog.name, **properties)` for the same catalog."""
    props: dict[str, str] = {"warehouse": catalog.warehouse}
    if catalog.type == "jdbc":
        props |= {"type": "sql", "uri": _sqlalchemy_url(catalog), "schema_version": "v1"}
    elif catalog.type == "rest":
        props |= {"type": "rest", "uri": _uri(catalog)} | _credential(catalog)
    else:
        props["type"] = "glue"
    if (s3 := catalog.s3) is not None:
        props |= {"s3.region": s3.region, "client.region": s3.region} | _s3_login(s3)
        props["s3.force-virtual-addressing"] = str(not s3.path_style_access).lower()
    return props


def table_name(topic: str) -> str:
    """The name of `topic`'s table in namespace `NAMESPACE`: stable, and one per topic.

    Table names keep to `[a-z0-9_]`, which every engine accepts unquoted and Glue, Hive and
    Trino (which fold names to lower case) keep as written. A topic's name is mapped by
    replacing `.` and `-` with `_` and folding to lower case. Of these, only `.` → `_` can never
    make two topics of one cluster collide: Kafka refuses a topic whose name differs from an
    existing one's only by `.` against `_`. `-` and capitals can (`a-b` beside `a_b`, `Orders`
    beside `orders`), so a topic that has either gets the first 8 hex digits of its name's
    SHA-256 appended (`a_b_<hash>`). The rule reads the topic alone, so a table's name never
    changes when other topics come and go.
    """
    mapped = check_topic(topic).replace(".", "_")
    if _UNCHANGED.fullmatch(mapped):
        return mapped
    digest = hashlib.sha256(topic.encode()).hexdigest()[:8]
    base = mapped.replace("-", "_").lower()
    return f"{base[: _TABLE_NAME_MAX - len(digest) - 1]}_{digest}"


def spark_table(catalog: Catalog, topic: str) -> str:
    """`topic`'s table as Spark SQL names it: `<catalog>.cairn.<table>`."""
    return f"{catalog.name}.{NAMESPACE}.{table_name(topic)}"


def _login(values: dict[str, str | SecretStr | None]) -> dict[str, str]:
    """The given values as plain strings, secrets revealed, absent ones left out."""
    return {
        key: value.get_secret_value() if isinstance(value, SecretStr) else value
        for key, value in values.items()
        if value is not None
    }


def _s3_login(s3: S3Access) -> dict[str, str]:
    """The S3 endpoint and keys: the same property names in Iceberg's Java and pyiceberg."""
    return _login(
        {
            "s3.endpoint": s3.endpoint,
            "s3.access-key-id": s3.access_key_id,
            "s3.secret-access-key": s3.secret_access_key,
        }
    )


def _uri(catalog: Catalog) -> str:
    """The uri of a jdbc or rest catalog, which `Catalog` requires of them."""
    if catalog.uri is None:
        raise ValueError(f"catalog {catalog.name}: a {catalog.type} catalog needs a uri")
    return catalog.uri


def _credential(catalog: Catalog) -> dict[str, str]:
    if catalog.user is None:
        return {}
    password = catalog.password.get_secret_value() if catalog.password else ""
    return {"credential": f"{catalog.user}:{password}"}


def _sqlalchemy_url(catalog: Catalog) -> str:
    """The JDBC URL as SQLAlchemy's (psycopg2), with the login in it: pyiceberg's SqlCatalog
    takes one URL. Query parameters pass through; they must be ones libpq knows."""
    parts = urlsplit(_uri(catalog).removeprefix("jdbc:"))
    login = ""
    if catalog.user is not None:
        password = catalog.password.get_secret_value() if catalog.password else ""
        login = f"{quote(catalog.user, safe='')}:{quote(password, safe='')}@"
    query = f"?{parts.query}" if parts.query else ""
    return f"postgresql+psycopg2://{login}{parts.netloc}{parts.path}{query}"
