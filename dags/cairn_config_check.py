"""Shows mistakes in include/topics.yaml in the Airflow UI as a DAG import error.

Each error names the entry (topic or pattern) and the field. The archive DAGs are built in
another file from the valid entries only, so one bad entry never takes the other topics' DAGs
down. This file defines no DAG; it fails to import exactly when the topics file has errors.
"""

from __future__ import annotations

from cairn.config import TOPICS_FILE, load_topics

_errors = load_topics(TOPICS_FILE).errors
if _errors:
    raise ValueError(
        f"{TOPICS_FILE} has {len(_errors)} error(s); the archive DAGs of these entries are "
        "not loaded:\n" + "\n".join(f"  - {error}" for error in _errors)
    )
