"""Cairn's core: the rules of archiving Kafka into object storage.

Imports neither Airflow nor Spark, so every rule here is unit-tested on its own and shared by
the DAGs (`dags/`) and the Spark job (`spark_jobs/`).
"""
