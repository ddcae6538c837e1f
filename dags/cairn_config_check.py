"""Shows mistakes in the topics files as a DAG import error in the Airflow UI.

Each error names the file, line, entry (topic or pattern) and field. Airflow records import
errors per DAG file, and a DAG file that raises loses all its DAGs (there is no API to report an
error and keep the DAGs, apache/airflow#55475), so the files that build DAGs build them from the
valid entries and never raise; this file defines no DAG and fails to import exactly when the
topics files have errors (a topic that two patterns match among Kafka's topics included).
`cairn_config_watch` alerts on the same errors.
"""

from __future__ import annotations

from cairn.topics_file import TOPICS_FILE
from cairn_airflow.dag_topics import topics_loaded

_errors = topics_loaded().errors
if _errors:
    raise ValueError(
        f"{TOPICS_FILE} has {len(_errors)} error(s); the topics these describe are not "
        "loaded (their archives are untouched, and resume once fixed):\n"
        + "\n".join(f"  - {error}" for error in _errors)
    )
