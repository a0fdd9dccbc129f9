"""The trainer service at the door: it holds the keys to restart training, so a bad or hostile client gets a
clear status, never a hang, a traceback or a thread per connection without end."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import time

import pytest

from kale_dagster.errors import KaleConfigError
from kale_dagster.launchers.service import MAX_BODY_BYTES, MAX_CONNECTIONS, LauncherService
from support import wait_for as _wait_for
from test_local_service import RecordingLauncher


def wait_for(predicate, timeout: float, what: str):
    return _wait_for(predicate, timeout, what, poll_s=0.05)


@pytest.fixture()
def service(tmp_path):
    svc = LauncherService(RecordingLauncher(workers=2), port=0, token_file=tmp_path / "token").start()
    yield svc
    svc.close()


def _raw(svc, head: str, body: bytes = b"", timeout: float = 15.0) -> str:
    token = svc.token_file.read_text().strip()
    with socket.create_connection(("127.0.0.1", svc.port), timeout=timeout) as sock:
        sock.sendall((head.format(port=svc.port, token=token) + "\r\n").encode() + body)
        return sock.recv(65536).decode(errors="replace")


AUTH = "Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
POST = "POST /rescale HTTP/1.1\r\n" + AUTH + "Content-Type: application/json\r\n"


@pytest.mark.parametrize(
    "headers, body, status",
    [
        ("", b'{"workers": 3}', "411"),  # no Content-Length
        ("Content-Length: -5\r\n", b"", "400"),
        ("Content-Length: abc\r\n", b"", "400"),
        (f"Content-Length: {MAX_BODY_BYTES + 1}\r\n", b"", "413"),  # refused before a byte of it is read
        (f"Content-Length: {10**12}\r\n", b"", "413"),
        ("Content-Length: 2001\r\n", b"[" * 1000 + b"]" * 1000 + b" ", "400"),  # nesting past any use
        ("Content-Length: 15\r\n", b'{"workers": 3}\n', "200"),
    ],
)
def test_bodies(service, headers, body, status):
    answer = _raw(service, POST + headers, body)
    assert answer.split()[1] == status, answer[:200]


def test_a_client_that_stops_mid_request_is_let_go(service):
    started = time.monotonic()
    answer = _raw(service, POST + "Content-Length: 100\r\n", b'{"work', timeout=30.0)  # 6 of 100 bytes, then silence
    assert answer == "" or answer.split()[1] == "400"
    assert time.monotonic() - started < 20  # the request timeout, not forever


def test_connections_are_bounded_and_the_service_answers_after_them(service):
    idle = [socket.create_connection(("127.0.0.1", service.port), timeout=5) for _ in range(MAX_CONNECTIONS + 8)]
    try:
        wait_for(lambda: service.server._slots._value == 0, 10, "every slot held by an idle client")

        def closed_unanswered() -> list:
            readable, _, _ = select.select(idle, [], [], 0.1)
            return [sock for sock in readable if sock.recv(1, socket.MSG_PEEK) == b""]

        # The 8 past the limit are closed at once, unanswered: no thread of their own waits on them.
        wait_for(lambda: len(closed_unanswered()) >= 8, 10, "the connections past the limit closed")
        assert len(closed_unanswered()) == 8
    finally:
        for sock in idle:
            sock.close()
    wait_for(lambda: service.server._slots._value == MAX_CONNECTIONS, 20, "the idle clients' slots released")
    assert (
        _raw(service, "GET /status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n").split()[1]
        == "200"
    )


def test_a_client_that_disconnects_leaves_no_traceback(service, capfd):
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", service.port), timeout=5) as sock:
            sock.sendall(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # half a request, then gone
    time.sleep(0.5)
    assert "Traceback" not in capfd.readouterr().err


def test_a_rescale_past_the_launchers_bound_is_refused(tmp_path):
    launcher = RecordingLauncher(workers=2)
    launcher.max_workers = 4  # what `kale trainer serve --max-workers 4` gives the LocalLauncher
    svc = LauncherService(launcher, port=0, token_file=tmp_path / "token").start()
    try:
        for workers, status in ((4, "200"), (5, "400"), (10**6, "400")):
            body = f'{{"workers": {workers}}}'.encode()
            assert _raw(svc, POST + f"Content-Length: {len(body)}\r\n", body).split()[1] == status
        assert launcher.workers == 4
    finally:
        svc.close()


@pytest.mark.parametrize(
    "content",
    [b"my notes\n", b"", b"x" * 43 + b"\n" * 100, bytes(range(256))],
    ids=["a user's file", "empty", "token-like but long", "binary"],
)
def test_a_token_file_it_did_not_write_is_never_overwritten_nor_deleted(tmp_path, content):
    (tmp_path / "d").mkdir(mode=0o700)
    path = tmp_path / "d" / "token"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(KaleConfigError, match="is not a token this service wrote"):
        LauncherService(RecordingLauncher(), port=0, token_file=path)
    assert path.read_bytes() == content
    assert sorted(p.name for p in path.parent.iterdir()) == ["token"]  # no partial file left either


def test_a_stale_token_is_replaced_and_a_token_replaced_by_hand_survives_close(tmp_path):
    path = tmp_path / "token"
    first = LauncherService(RecordingLauncher(), port=0, token_file=path)
    first.server.server_close()  # a service that crashed: its token stays behind
    stale = path.read_text()
    second = LauncherService(RecordingLauncher(), port=0, token_file=path).start()
    assert path.read_text() != stale
    path.write_text("someone else's file now")
    second.close()
    assert path.read_text() == "someone else's file now"


def test_a_busy_port_is_one_line_before_any_worker(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(KaleConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            LauncherService(RecordingLauncher(), port=port, token_file=tmp_path / "token")
        assert not (tmp_path / "token").exists()
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "kale_dagster.cli", "trainer", "serve", "--topic", "t", "--group-id", "g"]
            + ["--checkpoint-dir", str(tmp_path / "ckpt"), "--port", str(port), "--token-file", str(tmp_path / "t")],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().count("\n") == 0 and f"127.0.0.1:{port}" in done.stderr, done.stderr
    assert not (tmp_path / "ckpt" / "logs").exists()  # the launcher, which spawns standbys, was never built
    assert time.monotonic() - started < 30


def test_workers_above_max_workers_is_refused_by_the_cli(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kale_dagster.cli", "trainer", "serve", "--topic", "t", "--group-id", "g"]
        + ["--checkpoint-dir", str(tmp_path), "--workers", "5", "--max-workers", "4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--workers 5 is more than --max-workers 4" in done.stderr
