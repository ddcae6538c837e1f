"""The arguments every Spark job (`spark_jobs/<job>.py`) takes, from spark-submit or from the
Airflow operator on a Spark Connect session: the topic, and the key of the claim that holds the
job's work (its plan or selection), so no work travels on a command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from cairn.topics_file import TOPICS_FILE


def job_args(description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--claim", required=True, help="key of the claim holding the job's work")
    parser.add_argument("--topics-file", default=str(TOPICS_FILE))
    return parser.parse_args(argv)
