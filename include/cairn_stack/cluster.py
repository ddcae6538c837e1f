"""The distributed shape of the stack (`make up CLUSTER=1`): what a team that outgrew one machine
runs, as plain processes on this one.

- **Redis** (Debian's `redis-server`), the broker of Airflow's CeleryExecutor, and
  `celery_workers` **Celery workers**, each its own process with its own log folder and name (its
  tasks' `hostname`); task logs go to S3 (remote logging), so nothing a task needs lives on
  another worker's disk.
- A **Spark standalone cluster** from PySpark's own jars: a master and `spark_workers` workers,
  each its own process and work folder. Their executors run `cluster_python`, a virtualenv of
  requirements-cluster.txt only, and cannot see the checkout: each Spark daemon starts in a
  mount namespace where this repository's code folders and the topics folder are empty
  (`hidden`), so Cairn reaches the executors only as each job's code artifact.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

from cairn_stack.process import Service, StackError, port_open
from cairn_stack.settings import REPO, StackSettings

log = logging.getLogger(__name__)

CODE_FOLDERS = ("include", "spark_jobs", "dags", "plugins", "tests")
"""This repository's code: what the cluster's daemons must not see."""


def redis(settings: StackSettings) -> Service:
    """Redis on `host`, nothing persisted: Celery's queue holds only messages of runs the
    scheduler re-creates if lost."""
    state = settings.state_dir / "redis"
    state.mkdir(parents=True, exist_ok=True)
    argv = ["redis-server", "--port", str(settings.redis_port), "--bind", settings.host]
    argv += ["--save", "", "--appendonly", "no", "--dir", str(state)]

    def prepare() -> None:
        if shutil.which("redis-server") is None:
            raise StackError(
                "redis: no redis-server found; install Debian's package: apt-get install "
                "redis-server (make test does, as root)"
            )

    return Service(
        "redis",
        argv,
        settings.state_dir,
        [settings.redis_port],
        lambda: _redis_ping(settings),
        prepare=prepare,
    )


def _redis_ping(settings: StackSettings) -> bool:
    import redis as client

    try:
        return bool(client.Redis(settings.host, settings.redis_port, socket_timeout=2).ping())
    except Exception:
        return False


def celery_env(settings: StackSettings) -> dict[str, str]:
    """What every Airflow process of the distributed shape adds to its configuration."""
    db = settings.postgres_url.replace("postgresql://", "db+postgresql+psycopg2://", 1)
    return {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": settings.redis_url,
        "AIRFLOW__CELERY__RESULT_BACKEND": db,
        "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
        "AIRFLOW__LOGGING__REMOTE_LOGGING": "True",
        "AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER": f"s3://{settings.bucket}/_airflow/logs",
        "AIRFLOW__LOGGING__REMOTE_LOG_CONN_ID": settings.s3_conn_id,
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(settings.task_heartbeat_timeout),
    }


def worker_name(index: int) -> str:
    return f"airflow-worker-{index}"


def celery_workers(settings: StackSettings, env: dict[str, str]) -> list[Service]:
    """`celery_workers` Celery workers of Airflow, each as if on its own machine: its own log
    folder, and its name as the hostname its tasks record (`worker_hostname`)."""
    exe = str(Path(sys.executable).parent / "airflow")
    found = []
    for index in range(1, settings.celery_workers + 1):
        name = worker_name(index)
        home = settings.state_dir / "workers" / name
        own = {
            **env,
            "CAIRN_WORKER_NAME": name,
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "cairn_stack.cluster.worker_hostname",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        }
        argv = [exe, "celery", "worker", "--celery-hostname", f"{name}@{settings.host}"]
        argv += ["--concurrency", str(settings.celery_concurrency), "--skip-serve-logs"]
        found.append(
            Service(
                name,
                argv,
                settings.state_dir,
                [],
                functools.partial(_celery_ping, settings, f"{name}@{settings.host}"),
                env=own,
            )
        )
    return found


def worker_hostname() -> str:
    """The hostname a Celery worker's tasks record (`[core] hostname_callable`): the worker's
    name, so the stack's workers on one machine are told apart as separate machines are."""
    import socket

    return os.environ.get("CAIRN_WORKER_NAME") or socket.getfqdn()


def _celery_ping(settings: StackSettings, name: str) -> bool:
    from celery import Celery

    try:
        app = Celery(broker=settings.redis_url)
        return bool(app.control.ping(destination=[name], timeout=1.0))
    except Exception:
        return False


def spark_master_url(settings: StackSettings) -> str:
    """Where the stack's jobs run: the cluster in the distributed shape, else `spark_master`."""
    return settings.spark_cluster_url if settings.cluster else settings.spark_master


def spark_cluster(settings: StackSettings) -> list[Service]:
    """A Spark standalone master and `spark_workers` workers on loopback, from PySpark's own
    scripts, each worker with its own work folder and web UI port."""
    bin_dir = Path(sys.executable).parent
    host, port = settings.host, settings.spark_cluster_port
    env = {"SPARK_LOCAL_IP": host, "SPARK_HOME": spark_home()}
    master_argv = [str(bin_dir / "spark-class"), "org.apache.spark.deploy.master.Master"]
    master_argv += ["--host", host, "--port", str(port)]
    master_argv += ["--webui-port", str(settings.spark_cluster_ui_port)]
    services = [
        Service(
            "spark-master",
            [*hidden(settings), *master_argv],
            settings.state_dir,
            [port, settings.spark_cluster_ui_port],
            lambda: port_open(port, host),
            env=env,
            prepare=lambda: _cluster_python(settings),
        )
    ]
    for index in range(1, settings.spark_workers + 1):
        ui = settings.spark_worker_ui_port + index - 1
        work = settings.state_dir / "spark" / f"worker-{index}"
        argv = [str(bin_dir / "spark-class"), "org.apache.spark.deploy.worker.Worker"]
        argv += ["--host", host, "--webui-port", str(ui), "--work-dir", str(work)]
        argv += ["--cores", str(settings.spark_worker_cores)]
        argv += ["--memory", settings.spark_worker_memory, settings.spark_cluster_url]
        services.append(
            Service(
                f"spark-worker-{index}",
                [*hidden(settings), *argv],
                settings.state_dir,
                [ui],
                functools.partial(_workers_alive, settings, index),
                env=env,
            )
        )
    return services


def spark_home() -> str:
    """PySpark's own Spark distribution (its jars and scripts), which the daemons run from."""
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin is not None, "pyspark is a pinned requirement"
    return str(Path(spec.origin).parent)


def _workers_alive(settings: StackSettings, at_least: int) -> bool:
    url = f"http://{settings.host}:{settings.spark_cluster_ui_port}/json/"
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:
            return int(json.load(reply).get("aliveworkers", 0)) >= at_least
    except (OSError, ValueError):
        return False


def _cluster_python(settings: StackSettings) -> None:
    if not settings.cluster_python.exists():
        raise StackError(
            f"spark-master: the executors' Python {settings.cluster_python} is missing; "
            "`make setup` builds it from requirements-cluster.txt"
        )


def hidden(settings: StackSettings) -> list[str]:
    """A command prefix that runs a process where this repository's code and the topics folder
    look empty (a private mount namespace: as root, or mapped to root in a user namespace);
    nothing, with a warning, where this machine allows no mount namespace."""
    unshare = _unshare()
    if unshare is None:
        log.warning("no mount namespace here: the cluster's daemons can see the checkout")
        return []
    folders = [str(REPO / name) for name in CODE_FOLDERS]
    topics = settings.topics_file
    folders.append(str(topics if topics.is_dir() else topics.parent))
    script = (
        'while [ "$1" != -- ]; do [ -d "$1" ] && mount -t tmpfs -o size=64k,mode=0555 '
        'cairn-hidden "$1"; shift; done; shift; exec "$@"'
    )
    return [*unshare, "sh", "-c", script, "sh", *folders, "--"]


@functools.cache
def _unshare() -> list[str] | None:
    """`unshare` making a private mount namespace, if this process may (root may; others need
    user namespaces); None if it may not."""
    unshare = ["unshare", "--mount", "--propagation", "private", "--"]
    if os.geteuid() != 0:
        unshare[1:1] = ["--user", "--map-root-user"]
    probe = [*unshare, "sh", "-c", "mount -t tmpfs cairn-probe /mnt"]
    ok = subprocess.run(probe, capture_output=True, check=False).returncode == 0
    return unshare if ok else None
