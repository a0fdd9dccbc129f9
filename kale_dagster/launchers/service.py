"""A long-lived home for the local launcher, controlled over loopback HTTP.

Dagster runs each rescale in its own short-lived run process, while local
workers must outlive it: ``kale trainer serve`` (or ``kale demo``) owns the
``LocalLauncher`` and serves

* ``GET  /status``  -> the launcher's ``LauncherStatus`` and its rescale records;
* ``POST /rescale`` ``{"workers": m, "reason": "..."}`` -> the rescale record
  (``{"changed": false}`` when already at m); 409 while another rescale runs;
* ``POST /retarget`` ``{"workers": m, "reason": "..."}`` -> ``{"accepted": bool}``
  at once: the rescale under way forms m workers instead (``Launcher.retarget``).

``LocalTrainerClient`` speaks it with the launcher's ``workers`` and
``rescale``, so the Dagster rescale job drives local workers exactly as it
drives a Kubernetes Job; ``LocalLauncherConfig`` is what a pipeline
declares to use it.

Whoever can reach a loopback port is not necessarily the operator: any web
page open in their browser can post to it, and DNS rebinding can even read
the answers.  So the service binds loopback only, and every request must
carry the bearer token the service writes at start-up to a file only its
user can read (``default_token_file``), name the service's own loopback
address in ``Host`` (a rebound name does not), and, for POST, say
``Content-Type: application/json`` (a cross-site form cannot).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import re
import secrets
import stat
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kale_dagster.errors import KaleConfigError
from kale_dagster.launchers.base import Launcher, LauncherConfig, LauncherStatus, RescaleRecord
from kale_dagster.launchers.local import LocalLauncher
from kale_dagster.model.limits import MAX_WORKERS
from kale_dagster.rules import check, setting
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.api import TrainerSpec

DEFAULT_URL = "http://127.0.0.1:8765"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")


def default_token_file(port: int) -> Path:
    """Where the trainer service on ``port`` keeps its token: the user's runtime directory ($XDG_RUNTIME_DIR/kale),
    else a directory of the user's own under the temp directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    root = Path(runtime) / "kale" if runtime else Path(tempfile.gettempdir()) / f"kale-{os.getuid()}"
    return root / f"trainer-{port}.token"


#: What a token this service wrote looks like (``secrets.token_urlsafe(32)``): a file at the token path that
#: holds anything else is not ours, and is never overwritten or deleted.
_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")


def _holds_a_token(path: Path) -> bool:
    """Whether ``path`` is a token file a trainer service of this user wrote (a stale one, after a crash)."""
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            return False
        return info.st_size <= 64 and bool(_TOKEN_SHAPE.fullmatch(path.read_text().strip()))
    except (OSError, UnicodeDecodeError):
        return False


def write_token(path: Path) -> str:
    """A fresh token in ``path`` (mode 0600, written whole then renamed), in a directory only this user can enter.

    Refuses a path that holds a file the service did not write: a mistyped ``--token-file`` must not destroy it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.parent.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise KaleConfigError(
            "token_file",
            f"{path.parent} must belong to you and be closed to others (chmod 700), "
            f"since the token in it controls the trainer",
        )
    if os.path.lexists(path) and not _holds_a_token(path):
        raise KaleConfigError(
            "token_file",
            f"{path} exists and is not a token this service wrote; it is left as it is: "
            "choose a path that does not exist yet",
        )
    token = secrets.token_urlsafe(32)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # O_EXCL: never truncates a file
    with os.fdopen(fd, "w") as f:
        f.write(token)
    os.replace(partial, path)
    return token


def _url_port(url: str) -> int:
    return urllib.parse.urlsplit(url).port or 80


#: Limits of the trainer service, which holds the keys to restart training.
REQUEST_TIMEOUT_S = 10.0
MAX_BODY_BYTES = 4096
MAX_CONNECTIONS = 16


class _BoundedServer(ThreadingHTTPServer):
    """At most ``MAX_CONNECTIONS`` requests at once (one more is closed unanswered), and a client that goes away
    mid-answer is no traceback."""

    daemon_threads = True
    service: LauncherService  # what the requests are to

    def __init__(self, *args, **kwargs):
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    """One request to the service (``server.service``): its address and token checked first, then the status, a
    rescale (one at a time) or a retarget (answered at once: the rescale under way takes it)."""

    server: _BoundedServer
    timeout = REQUEST_TIMEOUT_S  # a client that stops sending mid-request holds a thread this long at most

    def log_message(self, *args):  # keep the terminal for the status line
        pass

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _refused(self) -> bool:
        """Answer and return True unless the request names this service and holds its token."""
        service = self.server.service
        if self.headers.get("Host", "") not in service.hosts:
            host = self.headers.get("Host", "")
            self._reply(
                403,
                {
                    "error": f"Host {host!r} is not this service's address ({', '.join(service.hosts)}); refused "
                    "(DNS rebinding protection)"
                },
            )
            return True
        given = self.headers.get("Authorization", "")
        if not (
            given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip().encode(), service.token.encode())
        ):
            self._reply(
                401,
                {"error": f"missing or wrong bearer token; it is in {service.token_file}, readable by its user only"},
            )
            return True
        return False

    def do_GET(self):
        if self._refused():
            return
        if self.path != "/status":
            return self._reply(404, {"error": f"unknown path {self.path}"})
        launcher = self.server.service.launcher
        settings = getattr(launcher, "settings", None)
        runs = {"trainer": settings.trainer.trainer} if settings is not None else {}
        self._reply(200, {**launcher.status().to_dict(), **runs, "records": [asdict(r) for r in launcher.records]})

    def do_POST(self):
        if self._refused():
            return
        asked = self._workers_asked()
        if asked is None:
            return
        workers, reason = asked
        service = self.server.service
        if self.path == "/retarget":  # answered at once: the rescale under way takes it
            return self._reply(200, {"accepted": service.launcher.retarget(workers, reason=reason)})
        if not service.busy.acquire(blocking=False):
            return self._reply(409, {"error": "another rescale is in progress"})
        try:
            record = service.launcher.rescale(workers, reason=reason)
        except Exception as exc:  # reported to the caller, who fails its run with it
            return self._reply(500, {"error": f"{type(exc).__name__}: {exc}", "workers": service.launcher.workers})
        finally:
            service.busy.release()
        self._reply(200, {"changed": record is not None, **(asdict(record) if record else {"to_workers": workers})})

    def _workers_asked(self) -> tuple[int, str] | None:
        """The workers and reason a well-formed POST asks for; None once a malformed one is answered."""
        if self.headers.get("Content-Type", "").split(";")[0].strip().lower() != "application/json":
            return self._reply(415, {"error": "POST needs Content-Type: application/json"})
        if self.path not in ("/rescale", "/retarget"):
            return self._reply(404, {"error": f"unknown path {self.path}"})
        length = self.headers.get("Content-Length")
        if length is None:
            return self._reply(411, {"error": "POST needs a Content-Length"})
        if not length.strip().isdigit():
            return self._reply(400, {"error": "Content-Length must be a whole number of bytes"})
        if int(length) > MAX_BODY_BYTES:
            return self._reply(413, {"error": f"the body may be at most {MAX_BODY_BYTES} bytes"})
        try:
            body = json.loads(self.rfile.read(int(length)) or b"{}")
            workers = body["workers"]
        except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: nesting past any use
            return self._reply(400, {"error": 'expected JSON {"workers": <int>, "reason": "..."}'})
        most = getattr(self.server.service.launcher, "max_workers", None) or MAX_WORKERS
        if not isinstance(workers, int) or isinstance(workers, bool) or not 0 <= workers <= most:
            return self._reply(
                400, {"error": f"workers must be a whole number from 0 to {most}, got {workers!r}"[:300]}
            )
        return workers, str(body.get("reason", self.path[1:]))[:500]


class LauncherService:
    """Serve a LocalLauncher on 127.0.0.1:``port`` in a background thread, to holders of its token.

    The port is bound on construction, so a caller can claim it before spawning any worker and give the
    launcher to ``start``."""

    def __init__(
        self,
        launcher: LocalLauncher | None = None,
        port: int = 8765,
        host: str = "127.0.0.1",
        token_file: Path | None = None,
    ):
        if host not in LOOPBACK_HOSTS:
            raise KaleConfigError(
                "host",
                f"the trainer service binds loopback only ({', '.join(LOOPBACK_HOSTS)}), got {host!r}: "
                "it restarts training on request, so it must not be reachable from other machines",
            )
        self._launcher = launcher
        self.busy = threading.Lock()  # one rescale at a time
        try:
            self.server = _BoundedServer(("127.0.0.1", port), _Handler)
        except OSError as exc:
            raise KaleConfigError(
                "port", f"cannot listen on 127.0.0.1:{port} ({exc.strerror}): stop what holds it or choose another"
            ) from None
        self.server.service = self
        self.port = self.server.server_address[1]
        self.hosts = tuple(f"{h}:{self.port}" for h in LOOPBACK_HOSTS)
        self.token_file = Path(token_file) if token_file else default_token_file(self.port)
        try:
            self.token = write_token(self.token_file)
        except BaseException:
            self.server.server_close()
            raise
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="launcher-service")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, launcher: LocalLauncher | None = None) -> LauncherService:
        self._launcher = launcher or self._launcher
        if self._launcher is None:
            raise ValueError("LauncherService.start needs the launcher it serves")
        self._thread.start()
        return self

    @property
    def launcher(self) -> LocalLauncher:
        assert self._launcher is not None, "requests are served only after start(launcher)"
        return self._launcher

    def close(self) -> None:
        if self._thread.is_alive():
            self.server.shutdown()
        self.server.server_close()
        try:  # only the token this service wrote: the file may since have been replaced by hand
            if self.token_file.read_text().strip() == self.token:
                self.token_file.unlink()
        except OSError:
            pass


def loopback_url_problem(url: str) -> KaleConfigError | None:
    """Why ``url`` is not an http:// URL of this machine, or None.  The host is parsed, not prefix-matched:
    ``http://127.0.0.1.evil.example`` and ``http://localhost@host`` are not loopback."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        ok = (
            parts.scheme == "http"
            and (host == "localhost" or ipaddress.ip_address(host).is_loopback)
            and (parts.port is None or parts.port > 0)
            and not (parts.username or parts.password)
        )
    except (ValueError, TypeError, AttributeError):  # not a URL, not an address, a port out of range
        ok = False
    if not ok:
        return KaleConfigError("trainer_url", f"must be a loopback http:// URL (the local service), got {url!r}")
    return None


def check_loopback_url(url: str) -> str:
    problem = loopback_url_problem(url)
    if problem is not None:
        raise problem
    return url.rstrip("/")


class LocalTrainerClient(Launcher):
    """The launcher of a pipeline whose workers run under the local trainer service: ``status``, ``rescale`` and
    ``retarget`` of its LocalLauncher, over the service's HTTP API (so a retarget reaches the restart under way
    from any process).

    The token is read at every call, so a restarted service (with a new token) is followed.  With ``trainer``
    (what the pipeline declares), a rescale of a service that runs another trainer is refused: the pipeline
    would be scaling a job it does not describe."""

    def __init__(
        self, url: str, timeout_s: float = 600.0, token_file: Path | None = None, trainer: TrainerSpec | None = None
    ):
        self.url = check_loopback_url(url)
        self.timeout_s = timeout_s
        self.token_file = Path(token_file) if token_file else default_token_file(_url_port(self.url))
        self.trainer = trainer

    def _token(self) -> str:
        try:
            return self.token_file.read_text().strip()
        except FileNotFoundError:
            raise RuntimeError(
                f"no trainer service at {self.url} (no token at {self.token_file}); start it with `kale demo` or "
                "`kale trainer serve` as this user, or point the launcher's token_file at its token"
            ) from None
        except PermissionError:
            raise RuntimeError(
                f"cannot read the trainer service's token at {self.token_file}: run as the user who started it"
            ) from None

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self._token()}"}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = json.loads(exc.read() or b"{}").get("error", exc.reason)
            raise RuntimeError(f"trainer service at {self.url} answered {exc.code}: {detail}") from exc
        except urllib.error.URLError as exc:
            raise RuntimeError(
                f"no trainer service at {self.url} ({exc.reason}); start it with `kale demo` or `kale trainer serve`"
            ) from exc

    def status(self) -> LauncherStatus:
        return LauncherStatus.from_dict(self._call("GET", "/status"))

    def rescale(self, m: int, reason: str = "rescale") -> RescaleRecord | None:
        if self.trainer is not None:
            runs = self._call("GET", "/status").get("trainer")
            if runs is not None and runs != self.trainer.trainer:
                raise RuntimeError(
                    f"the trainer service at {self.url} runs {runs}, the pipeline declares {self.trainer.trainer}: "
                    f"start it with `kale trainer serve --trainer {self.trainer.trainer}`, or declare {runs}"
                )
        answer = self._call("POST", "/rescale", {"workers": m, "reason": reason})
        if not answer.pop("changed"):
            return None
        return RescaleRecord(**answer)

    @property
    def supports_retarget(self) -> bool:
        return True

    def retarget(self, m: int, reason: str = "retarget") -> bool:
        return bool(self._call("POST", "/retarget", {"workers": m, "reason": reason})["accepted"])


@dataclass(frozen=True)
class LocalLauncherConfig(LauncherConfig):
    """Workers run on this machine under the local trainer service (``kale trainer serve``, ``kale demo``).

    ``token_file``: where that service wrote its token; by default where it writes it for its port."""

    trainer_url: str = setting(DEFAULT_URL, description="the local trainer service's URL (a loopback address)")
    token_file: str | None = setting(None, description="where the service wrote its token; default: for its port")

    def __post_init__(self):
        check(self, lambda: loopback_url_problem(self.trainer_url))

    def build(
        self, pipeline: str, source: KafkaSource, trainer: TrainerSpec, workers_per_pod: int = 1
    ) -> LocalTrainerClient:
        return LocalTrainerClient(
            self.trainer_url, token_file=Path(self.token_file) if self.token_file else None, trainer=trainer
        )

    @property
    def runs_kale_trainer(self) -> bool:
        return True

    def describe(self) -> str:
        return f"the local trainer service at {self.trainer_url}"
