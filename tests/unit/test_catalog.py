"""One catalog description, two consumers: the Spark settings and pyiceberg's properties say the
same thing, and a topic's table name is stable, legal everywhere and one per topic."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cairn.table.catalog import (
    NAMESPACE,
    Catalog,
    S3Access,
    pyiceberg_properties,
    spark_conf,
    spark_table,
    table_name,
)

SEAWEEDFS = S3Access(
    region="us-east-1",
    endpoint="http://127.0.0.1:8333",
    access_key_id="cairn",
    secret_access_key="s3-secret",
    path_style_access=True,
)


def jdbc(warehouse: str = "s3://archive/iceberg", s3: S3Access | None = SEAWEEDFS) -> Catalog:
    return Catalog(
        type="jdbc",
        uri="jdbc:postgresql://127.0.0.1:5432/cairn_catalog",
        user="cairn",
        password="p@ss:word/1",
        warehouse=warehouse,
        s3=s3,
    )


def test_a_jdbc_catalog_on_seaweedfs_for_spark():
    assert spark_conf(jdbc()) == {
        "spark.sql.catalog.cairn": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.cairn.type": "jdbc",
        "spark.sql.catalog.cairn.uri": "jdbc:postgresql://127.0.0.1:5432/cairn_catalog",
        "spark.sql.catalog.cairn.jdbc.user": "cairn",
        "spark.sql.catalog.cairn.jdbc.password": "p@ss:word/1",
        "spark.sql.catalog.cairn.jdbc.schema-version": "V1",
        "spark.sql.catalog.cairn.warehouse": "s3://archive/iceberg",
        "spark.sql.catalog.cairn.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        "spark.sql.catalog.cairn.client.region": "us-east-1",
        "spark.sql.catalog.cairn.s3.endpoint": "http://127.0.0.1:8333",
        "spark.sql.catalog.cairn.s3.path-style-access": "true",
        "spark.sql.catalog.cairn.s3.access-key-id": "cairn",
        "spark.sql.catalog.cairn.s3.secret-access-key": "s3-secret",
    }


def test_the_same_catalog_for_pyiceberg():
    assert pyiceberg_properties(jdbc()) == {
        "type": "sql",
        # the login is in the one URL SqlCatalog takes, escaped
        "uri": "postgresql+psycopg2://cairn:p%40ss%3Aword%2F1@127.0.0.1:5432/cairn_catalog",
        "schema_version": "v1",
        "warehouse": "s3://archive/iceberg",
        "s3.endpoint": "http://127.0.0.1:8333",
        "s3.access-key-id": "cairn",
        "s3.secret-access-key": "s3-secret",
        # always given: without a region pyarrow's S3 would ask AWS where the bucket is
        "s3.region": "us-east-1",
        "client.region": "us-east-1",
        "s3.force-virtual-addressing": "false",
    }


def test_a_local_warehouse_uses_hadoops_file_system_and_no_s3_settings():
    local = jdbc("file:///var/cairn/warehouse", s3=None)
    conf = spark_conf(local)
    assert conf["spark.sql.catalog.cairn.io-impl"] == "org.apache.iceberg.hadoop.HadoopFileIO"
    assert not [key for key in conf if ".s3." in key or "region" in key]
    assert not [key for key in pyiceberg_properties(local) if key.startswith(("s3.", "client."))]


def test_aws_keys_left_out_leave_the_clients_own_credential_chain():
    aws = S3Access(region="eu-west-1")
    conf = spark_conf(jdbc(s3=aws))
    assert not [key for key in conf if key.endswith(("endpoint", "key-id", "access-key"))]
    assert conf["spark.sql.catalog.cairn.s3.path-style-access"] == "false"
    assert pyiceberg_properties(jdbc(s3=aws))["s3.force-virtual-addressing"] == "true"


def test_jdbc_url_parameters_and_a_missing_login_carry_over():
    cat = Catalog(
        type="jdbc",
        uri="jdbc:postgresql://db.internal:6432/catalog?sslmode=require",
        warehouse="file:///w",
    )
    assert pyiceberg_properties(cat)["uri"] == (
        "postgresql+psycopg2://db.internal:6432/catalog?sslmode=require"
    )
    assert not [key for key in spark_conf(cat) if ".jdbc.user" in key or ".jdbc.password" in key]


def test_a_rest_catalog_with_a_client_credential():
    rest = Catalog(
        name="lake",
        type="rest",
        uri="https://catalog.internal/api/catalog",
        user="cairn",
        password="secret",
        warehouse="s3://lake/warehouse",
        s3=S3Access(region="eu-west-1"),
    )
    conf = spark_conf(rest)
    assert conf["spark.sql.catalog.lake.type"] == "rest"
    assert conf["spark.sql.catalog.lake.credential"] == "cairn:secret"
    assert "spark.sql.catalog.lake.jdbc.schema-version" not in conf
    props = pyiceberg_properties(rest)
    assert (props["type"], props["uri"]) == ("rest", "https://catalog.internal/api/catalog")
    assert props["credential"] == "cairn:secret"


def test_a_glue_catalog_is_on_s3_in_its_region():
    glue = Catalog(type="glue", warehouse="s3://lake/warehouse", s3=S3Access(region="eu-west-1"))
    conf = spark_conf(glue)
    assert conf["spark.sql.catalog.cairn.type"] == "glue"
    assert conf["spark.sql.catalog.cairn.client.region"] == "eu-west-1"
    assert pyiceberg_properties(glue)["type"] == "glue"
    assert pyiceberg_properties(glue)["client.region"] == "eu-west-1"


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"type": "jdbc", "warehouse": "file:///w"}, "jdbc:postgresql://"),
        ({"type": "jdbc", "uri": "jdbc:mysql://h/db", "warehouse": "file:///w"}, "postgresql"),
        ({"type": "rest", "uri": "thrift://h:9083", "warehouse": "file:///w"}, "http"),
        ({"type": "glue", "warehouse": "file:///w"}, "glue catalog's warehouse is on S3"),
        ({"type": "glue", "uri": "http://h", "warehouse": "s3://b/w"}, "takes no uri"),
        (
            {"type": "jdbc", "uri": "jdbc:postgresql://h/db", "warehouse": "s3://b/w"},
            "give s3",
        ),
        ({"name": "my-catalog", "type": "glue", "warehouse": "s3://b/w"}, "pattern"),
    ],
)
def test_an_incomplete_catalog_is_refused(fields, problem):
    with pytest.raises(ValidationError, match=problem):
        Catalog(**fields)


def test_secrets_do_not_show_in_the_models_text():
    text = repr(jdbc())
    assert "p@ss:word/1" not in text and "s3-secret" not in text


@pytest.mark.parametrize(
    ("topic", "table"),
    [
        ("orders", "orders"),
        ("orders_v2", "orders_v2"),
        ("e2e.orders", "e2e_orders"),  # Kafka never has e2e_orders beside it
        ("my-topic", "my_topic_50918d47"),
        ("Orders", "orders_b7e8acdd"),
    ],
)
def test_a_topics_table_name(topic, table):
    assert table_name(topic) == table


def test_topics_that_map_alike_get_tables_of_their_own():
    topics = ["a_b", "a-b", "A_b", "A-B", "a-b-", "a_b_"]
    assert len({table_name(t) for t in topics}) == len(topics)
    assert table_name("a.b") == table_name("a_b")  # Kafka refuses the second of these two


def test_every_table_name_is_legal_unquoted_and_fits_the_catalog():
    for topic in ["x" * 249, "X" * 249, "y-" * 124 + "z", "0.starts-with.a-digit"]:
        name = table_name(topic)
        assert len(name) <= 255 and name == name.lower()
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789_")
    assert len(table_name("Y" * 249)) == 255  # cut to fit, hash kept
    assert table_name("Y" * 249) != table_name("Y" * 248 + "y")


def test_a_topic_kafka_would_refuse_has_no_table():
    with pytest.raises(ValueError, match="invalid Kafka topic name"):
        table_name("orders/2024")


def test_spark_names_the_table_catalog_namespace_table():
    assert spark_table(jdbc(), "e2e.orders") == f"cairn.{NAMESPACE}.e2e_orders"
