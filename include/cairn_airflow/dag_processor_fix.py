"""A DAG file keeps its last parse time when the DAG processor only ran its callbacks.

Airflow 3.3's DAG processor records a callback-only run of a file (it runs the file's task
callbacks, stores no DAG) with no parse time, over the file's last real parse
(apache/airflow#73432, open). The file then looks never parsed, so it is parsed again in full
at once, whatever `min_file_process_interval` says. Airflow sends a callback for every task a
trigger ends, and every step of an archive run ends in the triggerer: under load the DAG files
were parsed back to back, every topic's DAGs built and stored again each time (the DAG
processor took 0.5–0.9 of a core in a 1,000-topic burst). Worse, such a parse at that load can
pass `dag_file_processor_timeout`; a killed parse counts as a finished one, and the DAG
processor then marks every DAG of the file stale, mid-run.

`install` makes a callback-only run keep the stats of the file's last real parse (time, DAG
count, errors), which is what its time means. It runs where Cairn's plugin loads, and changes
only the DAG processor's class; once Airflow fixes the bug it changes nothing.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

log = logging.getLogger(__name__)

_MANAGER = "airflow.dag_processing.manager"


def install() -> bool:
    """Wrap the DAG processor's result handling, if this process runs one (its module is
    loaded before plugins are); True once installed."""
    manager = sys.modules.get(_MANAGER)
    if manager is None:
        return False
    cls = manager.DagFileProcessorManager
    if not getattr(cls.handle_parsing_result, "_keeps_parse_time", False):
        cls.handle_parsing_result = _keeping_parse_time(cls.handle_parsing_result)
        log.info("Cairn: a callback-only run keeps its file's last parse time (airflow#73432)")
    return True


def _keeping_parse_time(handle: Any) -> Any:
    @functools.wraps(handle)
    def handle_parsing_result(self: Any, file: Any, proc: Any, **kwargs: Any) -> None:
        parsed = _last_parse(self._file_stats, file.presence_key)
        handle(self, file, proc, **kwargs)
        stat = self._file_stats.get(file)
        if parsed is not None and stat is not None and stat.last_finish_time is None:
            stat.last_finish_time = parsed.last_finish_time
            stat.num_dags, stat.import_errors = parsed.num_dags, parsed.import_errors

    handle_parsing_result._keeps_parse_time = True  # type: ignore[attr-defined]
    return handle_parsing_result


def _last_parse(stats: dict[Any, Any], presence_key: Any) -> Any:
    """The stats of the file's last real parse: a versioned bundle's callbacks keep their own
    entry beside the scan's, so look at every entry of the file."""
    parsed = [s for f, s in stats.items() if f.presence_key == presence_key and s.last_finish_time]
    return max(parsed, key=lambda s: s.last_finish_time, default=None)
