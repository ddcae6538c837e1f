"""What Airflow must discover about Cairn, in one plugin: the pages and `/cairn/metrics` (a
FastAPI app the api-server mounts, its nav entry, and the `/cairn` → `/cairn/` redirect), and the
archive task's priority weight rule, which every process that serializes or schedules DAGs must
know; loading it also mends the DAG processor's parse times (`dag_processor_fix`).
`plugins/cairn_plugin.py` registers it; everything else is imported where it is used."""

from __future__ import annotations

from typing import ClassVar

from airflow.plugins_manager import AirflowPlugin

from cairn_airflow import dag_processor_fix
from cairn_airflow.pages.app import PREFIX, PrefixSlash, app
from cairn_airflow.priority import TimeLagFirst

dag_processor_fix.install()  # in the DAG processor, which loads plugins as it starts


class CairnPlugin(AirflowPlugin):
    name = "cairn"
    fastapi_apps: ClassVar = [{"app": app, "url_prefix": PREFIX, "name": "Cairn overview"}]
    fastapi_root_middlewares: ClassVar = [{"middleware": PrefixSlash, "name": "Cairn /cairn/"}]
    external_views: ClassVar = [
        {
            "name": "Cairn",
            "href": f"{PREFIX}/",
            "url_route": "cairn",
            "destination": "nav",
            "nav_top_level": True,
        }
    ]
    priority_weight_strategies: ClassVar = [TimeLagFirst]
