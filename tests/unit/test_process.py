"""The local stack's process promises, proved with tiny real Python processes (no Kafka/S3/Airflow).

A service is started in its own process group with a pid file and a log; start waits for health
and leaves nothing running when it fails; stop kills the whole group and only a group it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cairn_stack import __main__ as cli
from cairn_stack import process, services
from cairn_stack.process import (
    Service,
    StackError,
    free_port_block,
    port_free,
    port_open,
    share_ports,
)
from cairn_stack.settings import StackSettings

# Appends its pid to argv[1], optionally waits for a child that ignores SIGTERM (pid written to
# argv[4]), sleeps argv[3] seconds, then listens on port argv[2] until killed.
SERVE = """
import os, socket, subprocess, sys, time
marker, port, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with open(marker, "a") as f:
    f.write(f"{os.getpid()}\\n")
if len(sys.argv) > 4:
    subprocess.Popen([sys.executable, "-c", CHILD, sys.argv[4]])
    while not os.path.exists(sys.argv[4]):
        time.sleep(0.02)
time.sleep(delay)
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", port))
sock.listen()
print("listening", flush=True)
while True:
    time.sleep(1)
"""
CHILD = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(30)
"""


def py(code: str, *args: object) -> list[str]:
    """argv running `code` with this interpreter."""
    return [sys.executable, "-c", textwrap.dedent(code), *map(str, args)]


def serve(marker: Path, port: int, delay: float = 0.0, child: Path | None = None) -> list[str]:
    prelude = f"CHILD = {textwrap.dedent(CHILD)!r}\n"
    return py(prelude + SERVE, marker, port, delay, *([child] if child else []))


def alive(pid: int) -> bool:
    """True if `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def pids(marker: Path) -> list[int]:
    return [int(line) for line in marker.read_text().split()] if marker.exists() else []


@pytest.fixture
def cleanup() -> Iterator[Callable[[Service | int], None]]:
    """Register services and pids; whatever a failing test left behind is killed afterwards."""
    owned: list[Service | int] = []
    yield owned.append
    for thing in reversed(owned):
        if isinstance(thing, Service):
            thing.stop(timeout=2)
        elif alive(thing):
            with contextlib.suppress(ProcessLookupError):
                os.kill(thing, signal.SIGKILL)


@pytest.fixture
def port() -> int:
    return free_port_block(1)[0]


def test_port_blocks_lie_below_the_ephemeral_range_and_are_never_given_twice() -> None:
    """A session starts some services minutes after choosing their ports: from the kernel's
    ephemeral range, a client connection could take one first (seen: SeaweedFS refused to
    start)."""
    start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    blocks = [free_port_block(15, step=2) for _ in range(20)]
    taken = [{p + j for p in block for j in range(2)} for block in blocks]
    assert all(max(ports) < start for ports in taken)
    assert len(set().union(*taken)) == 20 * 30  # no port in two blocks
    assert all(port_free(p) for p in taken[0])


def test_processes_given_different_port_shares_never_choose_the_same_port(monkeypatch) -> None:
    """The suite's two workers choose ports at the same moment; probing cannot tell them apart."""
    monkeypatch.setattr(process, "_SHARE", process._SHARE)  # restored afterwards
    chosen = []
    for index in range(2):
        share_ports(index, 2)
        blocks = [free_port_block(15, step=2) for _ in range(10)]
        chosen.append({p + j for block in blocks for p in block for j in (0, 1)})
    assert max(chosen[0]) < min(chosen[1])
    with pytest.raises(ValueError, match="port share 2 of 2"):
        share_ports(2, 2)


def web(
    tmp_path: Path, port: int, name: str = "web", delay: float = 0.0, child: Path | None = None
) -> Service:
    """A service listening on `port`; its pids are appended to tmp_path/<name>.started."""
    return Service(
        name=name,
        argv=serve(tmp_path / f"{name}.started", port, delay, child),
        state_dir=tmp_path / "state",
        ports=[port],
        healthy=lambda: port_open(port),
    )


def test_start_waits_for_health_writes_pid_file_and_is_idempotent(tmp_path, port, cleanup):
    service = web(tmp_path, port, delay=0.7)
    cleanup(service)

    service.start(timeout=10)

    assert port_open(port)  # the listener binds only after 0.7 s: start waited for it
    (pid,) = pids(tmp_path / "web.started")
    assert service.pidfile.read_text().split()[0] == str(pid)
    assert service.pid() == pid and alive(pid)
    assert "listening" in service.log.read_text()

    service.start(timeout=10)

    assert service.pid() == pid
    assert pids(tmp_path / "web.started") == [pid]  # no second process


def test_port_in_use_names_service_and_port_and_starts_nothing(tmp_path, port, cleanup):
    prepared = []
    service = web(tmp_path, port)
    service.prepare = lambda: prepared.append(True)
    cleanup(service)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()

        with pytest.raises(StackError, match=rf"^web: port {port} is already in use"):
            service.start(timeout=5)

    assert not service.pidfile.exists() and service.pid() is None
    assert not (tmp_path / "web.started").exists() and not prepared


def test_exit_during_start_names_service_code_and_log_with_its_tail(tmp_path, port, cleanup):
    code = "import sys; print('reading config', flush=True); sys.exit('bad setting: answer=42')"
    service = Service("crashy", py(code), tmp_path / "state", [port], lambda: False)
    cleanup(service)

    with pytest.raises(StackError) as caught:
        service.start(timeout=10)

    message = str(caught.value)
    assert message.startswith("crashy: exited with code 1 during start")
    assert str(service.log) in message
    assert "reading config" in message and "bad setting: answer=42" in message
    assert not service.pidfile.exists()


def test_children_of_a_leader_that_exits_during_start_are_killed(tmp_path, port, cleanup):
    code = """
    import os, subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", CHILD, sys.argv[1]])
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.02)
    sys.exit(3)
    """
    child_file = tmp_path / "child.pid"
    argv = py(f"CHILD = {textwrap.dedent(CHILD)!r}\n" + textwrap.dedent(code), child_file)
    service = Service("forky", argv, tmp_path / "state", [port], lambda: False)
    cleanup(service)

    with pytest.raises(StackError, match="forky: exited with code 3"):
        service.start(timeout=10)

    child = int(child_file.read_text())
    cleanup(child)
    assert wait_dead(child), "a child of the failed service was left running"


def test_never_healthy_times_out_and_stops_the_process(tmp_path, port, cleanup):
    service = Service(
        "sleepy",
        serve(tmp_path / "sleepy.started", port),
        tmp_path / "state",
        [port],
        healthy=lambda: False,
    )
    cleanup(service)

    started = time.monotonic()
    with pytest.raises(StackError) as caught:
        service.start(timeout=1)

    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert message.startswith("sleepy: not healthy after 1s") and str(service.log) in message
    (pid,) = pids(tmp_path / "sleepy.started")
    cleanup(pid)
    assert wait_dead(pid) and not service.pidfile.exists() and port_free(port)


def test_stop_kills_the_whole_process_group_and_removes_the_pid_file(tmp_path, port, cleanup):
    child_file = tmp_path / "child.pid"
    service = web(tmp_path, port, child=child_file)
    cleanup(service)
    service.start(timeout=10)
    (leader,) = pids(tmp_path / "web.started")
    child = int(child_file.read_text())
    cleanup(child)
    assert alive(child)

    assert service.stop(timeout=5) is True

    assert wait_dead(leader) and wait_dead(child)  # the child ignored SIGTERM: KILL got it
    assert not service.pidfile.exists() and service.pid() is None
    assert service.stop() is False


def test_stop_does_not_wait_for_a_reaped_leader_named_with_spaces(tmp_path, port, cleanup):
    # Airflow's setproctitle gives processes names such as "airflow schedul" (a space in comm):
    # the dead leader (a zombie of ours) must not be mistaken for a live one.
    code = """
    import socket, sys, time
    with open("/proc/self/comm", "w") as comm:
        comm.write("cairn svc (x)")
    sock = socket.socket()
    sock.bind(("127.0.0.1", int(sys.argv[1])))
    sock.listen()
    while True:
        time.sleep(1)
    """
    service = Service("spaced", py(code, port), tmp_path / "state", [port], lambda: port_open(port))
    cleanup(service)
    service.start(timeout=10)

    started = time.monotonic()
    assert service.stop(timeout=5) is True

    assert time.monotonic() - started < 3


def test_stop_on_a_stale_pid_file_returns_false_and_removes_it(tmp_path, port):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    service = web(tmp_path, port)
    service.pidfile.parent.mkdir(parents=True)
    service.pidfile.write_text(str(gone.pid))

    assert service.stop() is False
    assert not service.pidfile.exists()


def test_stop_never_signals_a_process_it_did_not_start(tmp_path, port, cleanup):
    stranger = subprocess.Popen(
        serve(tmp_path / "stranger.started", free_port_block(1)[0]), start_new_session=True
    )
    cleanup(stranger.pid)
    service = web(tmp_path, port)
    cleanup(service)

    assert service.stop() is False  # nothing started yet: no pid file
    service.start(timeout=10)
    (ours,) = pids(tmp_path / "web.started")
    assert service.stop(timeout=5) is True

    assert wait_dead(ours)
    assert stranger.poll() is None and alive(stranger.pid)
    stranger.kill()
    stranger.wait()


def test_stop_does_not_signal_a_process_that_reused_the_pid_in_the_pid_file(
    tmp_path, port, cleanup
):
    stranger = subprocess.Popen(serve(tmp_path / "stranger.started", port), start_new_session=True)
    cleanup(stranger.pid)
    service = web(tmp_path, port)
    service.pidfile.parent.mkdir(parents=True)
    service.pidfile.write_text(str(stranger.pid))  # as if the pid had been reused

    try:
        service.stop(timeout=2)
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_kafka_without_java_names_kafka_and_java_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(services, "java", lambda: None)
    kafka_port, sasl = free_port_block(2, step=2)  # free ports: a running demo stack has 9092-4
    controller = kafka_port + 1
    settings = StackSettings(
        state_dir=tmp_path / "state",
        jars_dir=tmp_path / "jars",
        kafka_port=kafka_port,
        kafka_controller_port=controller,
        kafka_sasl_port=sasl,
    )
    service = services.kafka(settings)

    with pytest.raises(StackError, match=r"^kafka: .*Java"):
        service.start(timeout=5)

    assert not service.pidfile.exists() and service.pid() is None
    assert not service.log.exists()
    assert port_free(kafka_port) and port_free(controller) and port_free(sasl)


def test_spark_connect_server_binds_loopback_runs_cairns_python_and_has_no_secret(tmp_path):
    settings = StackSettings(state_dir=tmp_path / "state", spark_connect_port=15999)
    service = services.spark_connect(settings)

    argv = " ".join(service.argv)
    assert "--class org.apache.spark.sql.connect.service.SparkConnectServer" in argv
    assert f"spark.connect.grpc.binding.address={settings.host}" in argv
    assert "spark.connect.grpc.binding.port=15999" in argv and service.ports == [15999]
    assert f"--jars {settings.jars_dir / 'spark'}/*.jar" in argv  # the Kafka connector
    # runs share one session: an idle hour must not close it
    timeout = f"spark.connect.session.manager.defaultSessionTimeout={services.SESSION_TIMEOUT}"
    assert timeout in argv and services.SESSION_TIMEOUT != "60m"
    assert "--conf spark.driver.extraJavaOptions=-XX:+UseParallelGC" in argv  # SERVER_JVM
    assert "--conf spark.python.daemon.module=cairn_stack.pyspark_daemon" in argv  # PYTHON_DAEMON
    assert service.env["PYSPARK_PYTHON"] == sys.executable
    assert "PYTHONPATH" not in service.env  # Cairn's code comes with each run's session
    secrets = (settings.kafka_sasl_password, settings.s3_secret_key)
    assert not [s for s in secrets if s in argv or s in str(service.env)]
    assert "spark-connect" in [s.name for s in services.all_services(settings)]


def test_the_distributed_shape_runs_celery_workers_and_a_spark_cluster_with_nothing_of_cairn(
    tmp_path,
):
    settings = StackSettings(state_dir=tmp_path / "state", cluster=True, redis_port=16379)
    found = {s.name: s for s in services.all_services(settings)}

    assert list(found) == [
        "kafka", "seaweedfs", "postgres", "redis", "spark-master", "spark-worker-1",
        "spark-worker-2", "spark-connect-cluster", "airflow-api-server", "airflow-scheduler",
        "airflow-dag-processor", "airflow-triggerer", "airflow-worker-1", "airflow-worker-2",
    ]  # fmt: skip
    server = " ".join(found["spark-connect-cluster"].argv)
    assert f"--master spark://{settings.host}:{settings.spark_cluster_port}" in server
    assert f"spark.cores.max={settings.spark_connect_cores}" in server
    assert "spark.python.daemon.module" not in server  # nothing of Cairn on the cluster
    assert found["spark-connect-cluster"].env["PYSPARK_PYTHON"] == str(settings.cluster_python)
    for name in ("spark-master", "spark-worker-1", "spark-worker-2", "spark-connect-cluster"):
        argv = found[name].argv
        if argv[0] == "unshare":  # this machine allows mount namespaces: the code is hidden
            hidden = argv[argv.index("sh", argv.index("-c")) + 1 : argv.index("--", 5)]
            assert str(Path(services.REPO) / "include") in hidden, name
            assert str(settings.topics_file.parent) in hidden, name
    assert "--work-dir" in found["spark-worker-2"].argv
    worker = found["airflow-worker-2"]
    assert worker.argv[1:4] == ["celery", "worker", "--celery-hostname"]
    assert worker.env["CAIRN_WORKER_NAME"] == "airflow-worker-2"
    assert worker.env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert worker.env["AIRFLOW__CELERY__BROKER_URL"] == f"redis://{settings.host}:16379/0"
    assert worker.env["AIRFLOW__LOGGING__REMOTE_LOGGING"] == "True"  # logs in S3, not a disk
    assert worker.env["AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER"].startswith("s3://")
    submit = json.loads(worker.env["AIRFLOW_CONN_CAIRN_SPARK_SUBMIT"])
    assert submit["host"] == settings.spark_cluster_url
    assert submit["extra"]["cairn"]["python"] == str(settings.cluster_python)
    # `down` and `status` cover both shapes, whichever `up` started
    local = {s.name for s in services.all_services(settings.model_copy(update={"cluster": False}))}
    assert {s.name for s in services.every_service(settings)} == local | found.keys()
    assert "spark-connect" in local  # its own pid file: never taken for the other shape's


def test_postgres_starts_once_before_the_server_and_airflow_which_use_it(tmp_path):
    """Airflow's metadata database and the Iceberg catalog's share one PostgreSQL: it is a
    service of its own, so the catalog (Spark jobs, pyiceberg) has it without Airflow."""
    settings = StackSettings(state_dir=tmp_path / "state", postgres_port=15432)
    names = [s.name for s in services.all_services(settings)]
    assert names.count("postgres") == 1
    assert (
        names.index("postgres") < names.index("spark-connect") < names.index("airflow-api-server")
    )
    assert "postgres" not in [s.name for s in services.airflow(settings)]
    assert settings.catalog_jdbc_url == "jdbc:postgresql://127.0.0.1:15432/cairn_catalog"


def test_the_stacks_iceberg_catalog_is_its_postgres_and_for_s3_its_seaweedfs(tmp_path):
    settings = StackSettings(state_dir=tmp_path / "state")
    local = services.iceberg_catalog(settings, "file:///w")
    assert (local.name, local.type, local.uri) == ("cairn", "jdbc", settings.catalog_jdbc_url)
    assert (local.user, local.password.get_secret_value(), local.s3) == (
        settings.catalog_user,
        settings.catalog_password,
        None,
    )
    on_s3 = services.iceberg_catalog(settings, f"s3://{settings.bucket}/iceberg", name="other")
    assert on_s3.name == "other" and on_s3.s3.endpoint == settings.s3_endpoint
    assert on_s3.s3.path_style_access  # SeaweedFS serves buckets in the path
    assert on_s3.s3.secret_access_key.get_secret_value() == settings.s3_secret_key


def test_the_server_runs_two_task_slots_per_usable_core_unless_told_a_master(tmp_path, monkeypatch):
    # a task waits on Kafka part of its time: one slot per core would leave cores idle
    monkeypatch.delenv("CAIRN_SPARK_MASTER", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    settings = StackSettings(state_dir=tmp_path / "state")
    assert settings.spark_master == "local[6]"
    assert "--master local[6]" in " ".join(services.spark_connect(settings).argv)
    monkeypatch.setenv("CAIRN_SPARK_MASTER", "spark://master:7077")
    assert StackSettings().spark_master == "spark://master:7077"


def test_the_stacks_spark_connection_is_spark_connect_unless_asked_to_spark_submit(tmp_path):
    settings = StackSettings(state_dir=tmp_path / "state", spark_connect_port=15999)
    connection = json.loads(services.airflow_env(settings)["AIRFLOW_CONN_CAIRN_SPARK"])
    assert connection == {"conn_type": "spark_connect", "host": "sc://127.0.0.1", "port": 15999}

    submit = settings.model_copy(update={"spark_conn_type": "spark", "spark_master": "local[2]"})
    connection = json.loads(services.airflow_env(submit)["AIRFLOW_CONN_CAIRN_SPARK"])
    assert connection == {"conn_type": "spark", "host": "local[2]"}


def test_the_scheduler_sleeps_the_settings_idle_sleep_not_airflows_second(tmp_path):
    """Each task of a run waits up to one idle sleep to be scheduled: Airflow's 1 s default
    would add seconds to every small run."""
    settings = StackSettings(state_dir=tmp_path / "state")
    env = services.airflow_env(settings)
    assert env["AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"] == "0.2"
    slower = settings.model_copy(update={"scheduler_idle_sleep": 0.5})
    assert services.airflow_env(slower)["AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"] == "0.5"
    with pytest.raises(ValueError, match="scheduler_idle_sleep"):  # 0 would spin a core
        StackSettings(scheduler_idle_sleep=0)


@pytest.fixture
def two_services(tmp_path, monkeypatch) -> tuple[Service, Service]:
    """`all_services` patched to a healthy `first` and a `second` that exits during start."""
    first_port, second_port = free_port_block(2)
    first = web(tmp_path, first_port, name="first")
    second = Service(
        "second",
        py("import sys; sys.exit('second is broken')"),
        tmp_path / "state",
        [second_port],
        lambda: False,
    )
    monkeypatch.setattr(services, "all_services", lambda settings: [first, second])
    monkeypatch.setenv("CAIRN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CAIRN_START_TIMEOUT", "10")
    return first, second


def test_up_stops_what_it_started_when_a_later_service_fails(tmp_path, two_services, capsys):
    first, second = two_services

    try:
        assert cli.main(["up"]) == 1
    finally:
        first.stop(timeout=2)

    (pid,) = pids(tmp_path / "first.started")
    assert wait_dead(pid)
    assert not first.pidfile.exists() and not second.pidfile.exists()
    assert "second: exited with code 1" in capsys.readouterr().err


def test_up_leaves_running_a_service_it_did_not_start(tmp_path, two_services, cleanup):
    first, second = two_services
    cleanup(first)
    first.start(timeout=10)
    (pid,) = pids(tmp_path / "first.started")

    assert cli.main(["up"]) == 1

    assert first.pid() == pid and alive(pid)
    assert not second.pidfile.exists()


def test_kafka_cluster_ids_never_look_like_an_option(monkeypatch):
    """A base64 id starting with '-' made `kafka-storage format -t <id>` fail (1 start in 64)."""
    ids = iter([b"\xf8" + bytes(15), b"\x10" + bytes(15)])  # '-…' first, then a good one
    monkeypatch.setattr(services.uuid, "uuid4", lambda: type("U", (), {"bytes": next(ids)}))

    found = services.kafka_cluster_id()

    assert found == "EAAAAAAAAAAAAAAAAAAAAA" and len(found) == 22
