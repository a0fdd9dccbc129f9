"""Production storage: a real PostgreSQL server holds Dagster's instance and the metrics history.

A throwaway server (Debian's postgresql package, run as its own user on a loopback port, its
socket in a temporary directory) backs a Dagster instance on dagster-postgres and the pipeline's
metrics history.  A real ``dagster-daemon`` runs the pipeline's metrics sensor against the
embedded broker and launches its rescale runs, which drive stand-in workers behind the real
local trainer service.  The daemon is killed and restarted (cursor, HPA state and history
survive), then the server is killed mid-run and started again (the daemon survives and
resumes; a sensor whose history is on the dead server skips with the reason).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from kale_dagster.processes import stop_process_group
from kale_dagster.stream.broker import free_loopback_port
from support import StandInWorkers, descendants, prerequisite_missing, produce_events, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(900)]


def _postgres_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        prerequisite_missing("PostgreSQL is not installed (bash .ci/install installs Debian's postgresql package)")
    return found


class PostgresServer:
    """A PostgreSQL server of its own: data, socket and log in a temporary directory, loopback TCP only."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="kale-pg-"))
        self.port = free_loopback_port()
        # initdb refuses to run as root: run the server as the package's postgres user.
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user:
            account = pwd.getpwnam(self.user)
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self.root.chmod(0o700)
        self._run(
            _postgres_bin("initdb"), "-D", self.root / "data", "-U", "kale", "-A", "trust", "-E", "UTF8", "--no-sync"
        )

    def _run(self, *args, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(a) for a in args]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {proc.stdout}{proc.stderr}")
        return proc

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        self._run(
            _postgres_bin("pg_ctl"),
            "-D",
            self.root / "data",
            "-l",
            self.root / "server.log",
            "-o",
            options,
            "-w",
            "start",
        )

    def kill(self) -> None:
        """Stop at once, as a crash would (no checkpoint; the next start recovers from the WAL)."""
        self._run(_postgres_bin("pg_ctl"), "-D", self.root / "data", "-m", "immediate", "-w", "stop", check=False)

    def url(self, database: str) -> str:
        return f"postgresql://kale@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> None:
        import psycopg2

        conn = psycopg2.connect(self.url("postgres"))
        conn.autocommit = True
        conn.cursor().execute(f"CREATE DATABASE {name}")
        conn.close()

    def close(self) -> None:
        self._run(_postgres_bin("pg_ctl"), "-D", self.root / "data", "-m", "fast", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def postgres():
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


CODE_LOCATION = '''
"""The pipeline under test; where its parts are comes from the environment."""
import os

from kale_dagster import (
    KafkaSource, Limits, LocalLauncherConfig, OnlineTrainingPipeline, ThroughputModel, build_definitions,
)
from kale_dagster.control.clock import PipelineClock

pipeline = OnlineTrainingPipeline(
    name="pg",
    source=KafkaSource(os.environ["KALE_TEST_BROKER"], ("events",), "pg-trainer", request_timeout_ms=3000),
    limits=Limits(max_workers=8), policy="hpa", throughput_prior=ThroughputModel.linear(100.0), forecaster="ewma",
    policy_options={"behavior": {"scaleDown": {"stabilizationWindowSeconds": 3600}}},
    clock=PipelineClock(30.0, wall_start=float(os.environ["KALE_TEST_WALL_START"])),
    launcher=LocalLauncherConfig(os.environ["KALE_TEST_TRAINER_URL"]),
    advisory=False,
    history_url=os.environ["KALE_TEST_HISTORY_URL"],
    record_every_minutes=0,  # every decision an event: recovery is timed to the first decision after a fault
)
defs = build_definitions(pipeline)
'''


def _produce_until(servers: str, stop: threading.Event) -> None:
    while not stop.is_set():
        produce_events(servers, 20)
        stop.wait(0.5)


def test_dagster_and_the_history_on_postgres_survive_daemon_and_server_restarts(
    kafka_broker, postgres, tmp_path, fault_record
):
    from dagster import (
        AssetKey,
        DagsterInstance,
        DagsterRunStatus,
        RunsFilter,
        SkipReason,
        build_sensor_context,
        instance_for_test,
    )
    from sqlalchemy.exc import DBAPIError

    from kale_dagster import (
        KafkaSource,
        OnlineTrainingPipeline,
        ThroughputModel,
        build_definitions,
    )
    from kale_dagster.launchers.service import LauncherService
    from kale_dagster.stream.history import MetricsHistory
    from kale_dagster.stream.producer import ensure_topic

    postgres.create_database("dagster")
    postgres.create_database("kale")
    home = tmp_path / "home"
    home.mkdir()
    # As the Dagster Helm chart writes it (docs/kubernetes/values.yaml): psycopg2 named in the scheme,
    # since SQLAlchemy 2.1 reads a bare postgresql:// with psycopg 3, which dagster-postgres does not install.
    (home / "dagster.yaml").write_text(
        "storage:\n  postgres:\n    postgres_db:\n      username: kale\n      hostname: 127.0.0.1\n      port: "
        f"{postgres.port}\n"
        "      db_name: dagster\n      scheme: postgresql+psycopg2\n"
        "run_coordinator:\n  module: dagster.core.run_coordinator\n  class: DefaultRunCoordinator\n"
        "telemetry:\n  enabled: false\n"
    )
    (tmp_path / "location.py").write_text(CODE_LOCATION)
    ensure_topic(kafka_broker.bootstrap_servers, "events", 2)
    workers = StandInWorkers(workers=1)
    service = LauncherService(workers, port=0).start()
    history_url = postgres.url("kale")
    env = dict(
        os.environ,
        DAGSTER_HOME=str(home),
        KALE_TEST_BROKER=kafka_broker.bootstrap_servers,
        KALE_TEST_WALL_START=str(time.time()),
        KALE_TEST_TRAINER_URL=service.url,
        KALE_TEST_HISTORY_URL=history_url,
    )
    stop = threading.Event()
    producer = threading.Thread(target=_produce_until, args=(kafka_broker.bootstrap_servers, stop), daemon=True)
    producer.start()
    daemon_log = tmp_path / "daemon.log"
    history = MetricsHistory(history_url)

    def start_daemon() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "dagster._daemon", "run", "-f", str(tmp_path / "location.py")],
            cwd=tmp_path,
            env=env,
            stdout=open(daemon_log, "a"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def decisions(instance) -> list[dict]:
        try:
            records = instance.fetch_materializations(AssetKey(["pg", "gpu_allocation"]), limit=1000).records
        except DBAPIError:  # the server is coming back; ask again
            return []
        rows = [{k: v.value for k, v in r.asset_materialization.metadata.items()} for r in records]
        return sorted(rows, key=lambda d: d["time"])

    def history_rows() -> int:
        return len(history.stream("pg"))

    daemon = start_daemon()
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            # Phase 1: the daemon ticks the sensor, decides, and a rescale run succeeds, all stored in Postgres.
            wait_for(
                lambda: instance.get_runs(RunsFilter(job_name="pg_rescale", statuses=[DagsterRunStatus.SUCCESS])),
                240,
                "a successful rescale run",
                daemon_log,
            )
            assert workers.workers > 1
            before = decisions(instance)
            rows_before = history_rows()
            assert len(before) >= 2 and rows_before >= len(before)  # one history row per reading

            # Phase 2: the daemon dies and comes back; cursor, policy state and history carry over.
            # As a lost node would: the daemon and the code server it started (its own session) die together.
            doomed = descendants(daemon.pid)
            os.killpg(daemon.pid, signal.SIGKILL)
            for pid in doomed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            daemon.wait()
            restarted_at = max(d["time"] for d in before)
            daemon = start_daemon()
            daemon_back = time.monotonic()
            after = wait_for(
                lambda: [d for d in decisions(instance) if d["time"] > restarted_at],
                180,
                "a decision after the restart",
                daemon_log,
            )
            first = after[0]
            assert "held" not in first, first  # the kept cursor gives a rate at once: no "no arrival rate yet"
            remembered = [t for _, t in first["policy_state"]["recommendations"]]
            assert min(remembered) <= restarted_at  # the HPA's window still holds what it saw before the restart
            assert history_rows() > rows_before
            fault_record(
                fault="Dagster daemon killed (SIGKILL) and restarted, Postgres storage",
                injected=1,
                survived=1,
                recovery_s=round(time.monotonic() - daemon_back, 1),
            )

            # Phase 3: the server dies mid-run. A sensor whose history is there skips with the reason;
            # the daemon survives and resumes when the server returns.
            orphan = OnlineTrainingPipeline(
                name="pg",
                source=KafkaSource(kafka_broker.bootstrap_servers, ("events",), "pg-trainer"),
                throughput_prior=ThroughputModel.linear(100.0),
                history_url=history_url,
            )
            repo = build_definitions(orphan).get_repository_def()
            sensor = {s.name: s for s in repo.sensor_defs}["pg_stream_metrics"]
            postgres.kill()
            with instance_for_test() as scratch:
                skipped = sensor(build_sensor_context(instance=scratch))
            assert isinstance(skipped, SkipReason)
            assert skipped.skip_message.startswith(
                'the metrics history did not answer (OperationalError: connection to server at "127.0.0.1"'
            )
            time.sleep(10)
            assert daemon.poll() is None, daemon_log.read_text()[-3000:]
            postgres.start()
            server_back = time.monotonic()
            back = wait_for(
                lambda: [d for d in decisions(instance) if d["time"] > max(d["time"] for d in after)],
                240,
                "a decision after the server came back",
                daemon_log,
            )
            assert "held" not in back[-1]
            assert daemon.poll() is None
            fault_record(
                fault="Postgres (Dagster storage and metrics history) killed for 10 s",
                injected=1,
                survived=1,
                recovery_s=round(time.monotonic() - server_back, 1),
            )
    finally:
        stop.set()
        # The daemon's code server runs in its own session, out of the daemon's group: it outlived the stop (CI, once).
        spawned = descendants(daemon.pid) if daemon.poll() is None else set()
        stop_process_group(daemon, timeout=30)
        for pid in spawned:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        producer.join(timeout=10)
        history.dispose()
        service.close()
