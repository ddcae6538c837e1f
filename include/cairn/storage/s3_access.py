"""How Cairn reaches S3: an AWS connection's resolved values → s3fs options.

The edges resolve the connection with the Amazon provider's `AwsBaseHook` (access keys, session
token, assumed role, profile, endpoint, region: whatever the connection says) and hand the plain
result here, so one mapping serves Airflow tasks, Spark jobs and the CLI and this package never
imports Airflow. Cairn's own S3 settings sit in the connection's extra under `cairn`:

    {"role_arn": "arn:aws:iam::123456789012:role/cairn",
     "cairn": {"server_side_encryption": "aws:kms",
               "sse_kms_key_id": "arn:aws:kms:eu-west-1:123456789012:key/...",
               "spark_credentials": "instance"}}

- `server_side_encryption` (`AES256`, `aws:kms` or `aws:kms:dsse`) and `sse_kms_key_id` go into
  s3fs's `s3_additional_kwargs`, which s3fs adds to every request that accepts them: each PUT
  (`Storage.write`, `open_write`, and `create` beside its `If-None-Match`), the start of each
  multipart upload (its parts inherit it), and the server-side copy of `Storage.move`. A bucket
  policy that refuses unencrypted writes therefore never sees one from Cairn.
- `spark_credentials`: `connection` (the default) ships the resolved keys to the Spark job;
  `instance` ships none, so the job's driver and executors use their own credential chain (an EC2
  instance profile, EKS pod identity or IRSA, EMR's role) and still get the endpoint, region and
  encryption settings.

Shipped keys are frozen when the task starts. Keys of an assumed role (`role_arn`: an hour
unless `assume_role_kwargs.DurationSeconds` says more, up to the role's maximum session) or of
the Airflow worker's own instance role expire, and a Spark job that outlives them fails on its
next S3 request; its task's retry starts it again with fresh keys, redoing the work. Keep a
run's Kafka cap small enough to finish well within the lifetime, raise the lifetime, or let the
cluster use its own role (`instance`), whose credentials refresh themselves.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from cairn.errors import PermanentError

SETTINGS_KEY = "cairn"
"""The key of Cairn's own settings in an AWS connection's extra."""


class S3SettingsInvalid(PermanentError):
    """The `cairn` settings of an AWS connection are unusable; a retry would read them again."""


class ConnectionMissing(PermanentError):
    """An `s3://<conn_id>@…` archive root names an Airflow connection that does not exist: a
    retry would look for it in vain (and falling back to the worker's own credentials would
    write where nobody chose)."""

    def __init__(self, topic: str, conn_id: str) -> None:
        super().__init__(
            f"topic {topic!r}: no Airflow connection {conn_id!r} for its s3:// archive root; "
            f"create it (`airflow connections add {conn_id} --conn-type aws --conn-login <key> "
            f"--conn-password <secret> --conn-extra '{{\"region_name\": …}}'`, or the variable "
            f'AIRFLOW_CONN_{conn_id.upper()} as JSON; docs/operating.md "AWS"), then clear the task'
        )


class S3Settings(BaseModel):
    """Cairn's settings from an AWS connection's extra (`{"cairn": {...}}`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server_side_encryption: Literal["AES256", "aws:kms", "aws:kms:dsse"] | None = None
    sse_kms_key_id: str | None = None
    spark_credentials: Literal["connection", "instance"] = "connection"

    @model_validator(mode="after")
    def _kms_key_needs_kms(self) -> S3Settings:
        if self.sse_kms_key_id and not (self.server_side_encryption or "").startswith("aws:kms"):
            raise ValueError("sse_kms_key_id needs server_side_encryption aws:kms or aws:kms:dsse")
        return self

    @classmethod
    def from_extra(cls, conn_id: str | None, extra: dict[str, Any]) -> S3Settings:
        """The settings of connection `conn_id` (defaults when its extra has no `cairn` key)."""
        try:
            return cls.model_validate(extra.get(SETTINGS_KEY) or {})
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or SETTINGS_KEY}: {e['msg']}" for e in err.errors()
            )
            raise S3SettingsInvalid(
                f"AWS connection {conn_id!r}: extra {SETTINGS_KEY!r} is invalid ({problems}); "
                f"fix the connection (keys: {', '.join(cls.model_fields)})"
            ) from None

    def write_kwargs(self) -> dict[str, str]:
        """boto3 arguments every write carries."""
        kwargs: dict[str, str] = {}
        if self.server_side_encryption:
            kwargs["ServerSideEncryption"] = self.server_side_encryption
        if self.sse_kms_key_id:
            kwargs["SSEKMSKeyId"] = self.sse_kms_key_id
        return kwargs


class Credentials(NamedTuple):
    """Frozen AWS credentials: the parts of botocore's `ReadOnlyCredentials` s3fs takes."""

    access_key: str
    secret_key: str
    token: str | None = None

    def __repr__(self) -> str:
        return f"Credentials(access_key={self.access_key!r}, secret_key=***, token=***)"


def s3_options(
    credentials: Credentials | None,
    endpoint_url: str | None = None,
    region_name: str | None = None,
    settings: S3Settings | None = None,
) -> dict[str, Any]:
    """s3fs options for `Storage`. Without `credentials`, s3fs finds its own (environment,
    profile, instance role)."""
    options: dict[str, Any] = {}
    if credentials:
        options["key"] = credentials.access_key
        options["secret"] = credentials.secret_key
        if credentials.token:
            options["token"] = credentials.token
    if endpoint_url:
        options["endpoint_url"] = endpoint_url
    if region_name:
        options["client_kwargs"] = {"region_name": region_name}
    write_kwargs = (settings or S3Settings()).write_kwargs()
    if write_kwargs:
        options["s3_additional_kwargs"] = write_kwargs
    return options


def connection_options(
    conn_id: str | None,
    extra: dict[str, Any],
    endpoint_url: str | None,
    region_name: str | None,
    credentials: Callable[[], Any],
    *,
    for_spark: bool = False,
) -> dict[str, Any]:
    """s3fs options from a resolved AWS connection: its extra, S3 endpoint and region, and a
    way to get its frozen credentials (anything with `access_key`, `secret_key` and `token`, as
    botocore's), asked only when they are shipped: a Spark job on an `instance` cluster costs
    no role assumption."""
    settings = S3Settings.from_extra(conn_id, extra)
    ships_keys = not (for_spark and settings.spark_credentials == "instance")
    found = None
    if ships_keys:
        frozen = credentials()
        found = Credentials(frozen.access_key, frozen.secret_key, frozen.token)
    return s3_options(found, endpoint_url, region_name, settings)


def env_connection_options(conn_id: str | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """s3fs options for tools outside Airflow (the CLI), from `AIRFLOW_CONN_<CONN_ID>` (JSON) as
    Airflow itself reads it; without that variable, none: s3fs uses the usual AWS chain.

    Keys, session token, profile, endpoint, region and Cairn's settings map directly. Assuming a
    role is Airflow's work (`AwsBaseHook`), which this package does not import: a connection with
    `role_arn` is refused here with the ways that work outside Airflow.
    """
    variable = f"AIRFLOW_CONN_{(conn_id or '').upper()}"
    raw = environ.get(variable)
    if not raw:
        return {}
    try:
        spec = json.loads(raw)
        extra = spec.get("extra") or {}
        extra = json.loads(extra) if isinstance(extra, str) else extra
    except (ValueError, AttributeError):
        raise S3SettingsInvalid(f"{variable}: expected a JSON connection object") from None
    if extra.get("role_arn"):
        raise S3SettingsInvalid(
            f"AWS connection {conn_id!r} assumes a role, which only Airflow resolves; outside "
            "Airflow use an AWS profile with role_arn and source_profile (profile_name in the "
            "connection) or export the role's credentials"
        )
    credentials = None
    if spec.get("login"):
        credentials = Credentials(
            spec["login"], spec.get("password") or "", extra.get("aws_session_token")
        )
    endpoint = ((extra.get("service_config") or {}).get("s3") or {}).get("endpoint_url")
    options = s3_options(
        credentials,
        endpoint or extra.get("endpoint_url"),
        extra.get("region_name"),
        S3Settings.from_extra(conn_id, extra),
    )
    if extra.get("profile_name"):
        options["profile"] = extra["profile_name"]
    return options
