"""The trainer service at the door: it holds the keys to restart training, so a bad or hostile client gets a
clear status, never a hang, a traceback or a thread per connection without end."""

from __future__ import annotations

import socket
import time

import pytest

from kale_dagster.launchers.service import MAX_BODY_BYTES, MAX_CONNECTIONS, LauncherService
from test_local_service import RecordingLauncher


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
        time.sleep(0.5)
        assert service.server._slots._value == 0  # every slot held by an idle client: no thread beyond them
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.5)
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
