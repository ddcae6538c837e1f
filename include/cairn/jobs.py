"""What a Spark job is given: one typed `JobInput` per job (archive, rebuild, seal).

It holds the topic's entry with the files it names (`TopicSnapshot`), the key of the claim that
holds the job's work (its plan or selection, read by reference, so no work is too large to
hand over), the name of the code artifact the job was shipped with, and the settings that reach
Kafka and storage — secrets among them. So a job needs nothing from the machine that started it:
no topics file, no schema on disk, no environment set around it. On a Spark Connect session the
task hands the object to the job's `run`; spark-submit gets it in one environment variable
(`JOB_INPUT_VARIABLE`), never as arguments that show in process listings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from cairn.config import TopicSnapshot
from cairn.errors import PermanentError
from cairn.kafka.connection import KafkaConf

JOB_INPUT_VARIABLE = "CAIRN_JOB_INPUT"
"""The environment variable a spark-submitted job reads its `JobInput` from (JSON)."""


class _Job(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format_version: Literal[1] = 1
    topic: TopicSnapshot
    claim: str
    """Key of the attempt's claim, which holds the job's work."""
    storage_options: dict[str, Any] = {}
    """fsspec options for the archive root (its keys, unless the cluster uses its own role)."""
    artifact: str | None = None
    """The file name of the code artifact (`cairn-<hash>.zip`) the job was shipped with; the
    executors check that they import Cairn from it. None: the code is installed where it runs."""

    def locations(self) -> list[tuple[str, str]]:
        """Where the job's executors write (what, URL): each must be shared storage."""
        return [("archive root", str(self.topic.entry.get("archive_root", "")))]


class ArchiveInput(_Job):
    job: Literal["archive"] = "archive"
    kafka: dict[str, Any]
    """librdkafka settings (`cairn.kafka.connection`), mapped to the Java client's in the job."""
    kafka_label: str
    """Where the Kafka settings came from, for messages (never the settings themselves)."""
    registries: dict[str, dict[str, Any]] = {}
    """Schema Registry client configurations by connection id (avro topics)."""

    def kafka_conf(self) -> KafkaConf:
        return KafkaConf(self.kafka, self.kafka_label)


class RebuildInput(_Job):
    job: Literal["rebuild"] = "rebuild"
    registries: dict[str, dict[str, Any]] = {}


class SealInput(_Job):
    job: Literal["seal"] = "seal"
    table_options: dict[str, Any] = {}
    """fsspec options for the table's location (its warehouse)."""
    table_location: str | None = None
    """The table's warehouse, where the executors write its Parquet files (None: no table)."""

    def locations(self) -> list[tuple[str, str]]:
        found = super().locations()
        if self.table_location is not None:
            found.append(("table warehouse", self.table_location))
        return found


JobInput = Annotated[ArchiveInput | RebuildInput | SealInput, Field(discriminator="job")]
_JOB_INPUT: TypeAdapter[JobInput] = TypeAdapter(JobInput)


def to_env(job: JobInput) -> dict[str, str]:
    """The environment a spark-submitted job reads `job` from."""
    return {JOB_INPUT_VARIABLE: job.model_dump_json()}


def from_env(environ: Mapping[str, str]) -> JobInput:
    """The job's input as `to_env` set it."""
    raw = environ.get(JOB_INPUT_VARIABLE)
    if not raw:
        raise SystemExit(f"no job input: {JOB_INPUT_VARIABLE} is not set (Cairn's operator does)")
    return _JOB_INPUT.validate_json(raw)


class LocalStorageOnCluster(PermanentError):
    """A local folder is used with Spark executors on other machines."""


def check_shared(master: str, locations: Iterable[tuple[str, str]]) -> None:
    """Refuse `file://` locations (what, URL) when Spark's `master` is not local: executors on
    other machines would each write to their own disk, and the commit would find files missing
    or, worse, a driver-side listing that differs from what the executors wrote."""
    if master.startswith("local"):
        return
    for what, url in locations:
        if url.startswith("file:"):
            raise LocalStorageOnCluster(
                f"{what} {url} is a local folder, but Spark runs on {master}, whose executors "
                "on other machines cannot share it: use an s3:// location (docs/operating.md, "
                "Running on your cluster), or a local[N] master"
            )
