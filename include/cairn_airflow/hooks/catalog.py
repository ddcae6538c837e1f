"""The Iceberg catalog that holds the topics' tables, from an Airflow connection.

The connection `cairn_catalog` (another id: `CAIRN_CATALOG_CONN_ID`) describes one catalog as
`cairn.table.catalog.Catalog`: its extra holds `type` (`jdbc`, `rest` or `glue`), `uri`,
`warehouse` and, for a warehouse on S3, `s3` (`region`, `endpoint`, `access_key_id`,
`secret_access_key`, `path_style_access`); its login and password are the catalog's user and
password. The local stack and docker-compose define it for Iceberg's JDBC catalog on their
PostgreSQL. Without the connection, topics are sealed without a table (folders and proof only).
"""

from __future__ import annotations

import os

from airflow.sdk.exceptions import AirflowNotFoundException

from cairn.table.catalog import Catalog
from cairn_airflow.hooks.connections import connection

CATALOG_CONN_ID = os.environ.get("CAIRN_CATALOG_CONN_ID", "cairn_catalog")


def catalog() -> Catalog | None:
    """The catalog the connection describes; None if there is no such connection."""
    try:
        conn = connection(CATALOG_CONN_ID)
    except AirflowNotFoundException:
        return None
    fields = dict(conn.extra)
    if conn.login:
        fields["user"] = conn.login
    if conn.password:
        fields["password"] = conn.password
    return Catalog.model_validate(fields)
