"""Each topic's archive root, remembered in Airflow: the witness of a changed root that needs no
consumer group.

A mistyped or moved `archive_root` would archive a topic again from its first offset into the
wrong place. Its consumer group shows it was archived, unless `commit_consumer_group` is false;
so a commit also leaves its root in the Variable `cairn_archive_root.<topic>` (`remember_root`),
and a topic's first run at another root checks whether that root still holds the topic's tokens
(`earlier_roots`, `cairn.pipeline.archive_run.check_new_archive`). A topic with a consumer group
records its root at its first token there; one without records it at every commit, as its only
witness. Each write is one request to Airflow, on the triggerer's busiest path (reading first,
to write only a changed root, took two: the read and the mask of its value). Nothing that grows
with history.
"""

from __future__ import annotations

import logging

from airflow.sdk import Variable

from cairn.config import TopicConfig
from cairn.storage.objects import Storage
from cairn_airflow.hooks.connections import storage

log = logging.getLogger(__name__)

ROOT_VARIABLE_PREFIX = "cairn_archive_root."


def root_variable(topic: str) -> str:
    """The Airflow Variable holding the archive root `topic`'s last commit went to."""
    return f"{ROOT_VARIABLE_PREFIX}{topic}"


def remember_root(cfg: TopicConfig, first: bool) -> None:
    """Record the root a run committed to, if it is the topic's `first` token there or the
    topic commits no consumer group. Best effort: a run that committed must not fail here (the
    consumer group is still a witness)."""
    if not first and cfg.commit_consumer_group:
        return
    try:
        Variable.set(
            root_variable(cfg.topic),
            cfg.archive_root,
            description="Written by Cairn's archive runs: the archive root the topic's last "
            "commit went to; a first run at another root is refused while this one holds "
            "the topic's tokens (docs/configuration.md, A changed archive root is refused).",
        )
    except Exception as err:
        log.warning(
            "topic %s: archive root not remembered: %s: %s", cfg.topic, type(err).__name__, err
        )


def earlier_roots(cfg: TopicConfig) -> dict[str, Storage]:
    """The root the topic was last committed to, if not `cfg`'s, opened with the entry's
    settings (an s3:// root names its own connection)."""
    earlier = Variable.get(root_variable(cfg.topic), default=None)
    if earlier is None or earlier == cfg.archive_root:
        return {}
    return {earlier: storage(cfg.model_copy(update={"archive_root": earlier}))}
