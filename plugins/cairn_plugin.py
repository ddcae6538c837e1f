"""Registers Cairn's one Airflow plugin (`cairn_airflow.plugin`): the pages, `/cairn/metrics` and
the archive task's priority weight rule. Cairn's Airflow side is the importable package
`cairn_airflow` (hooks, operators, notifications, pages), installed with Cairn. (Not named
`cairn.py`: Airflow puts this folder on `sys.path`, where that would hide the `cairn` package.)"""

from cairn_airflow.plugin import CairnPlugin

__all__ = ["CairnPlugin"]
