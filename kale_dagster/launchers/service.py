"""A long-lived home for the local launcher, controlled over loopback HTTP.

Dagster runs each rescale in its own short-lived run process, while local
workers must outlive it: ``kale trainer serve`` (or ``kale demo``) owns the
``LocalLauncher`` and serves

* ``GET  /status``  -> the launcher's ``LauncherStatus`` and its rescale records;
* ``POST /rescale`` ``{"workers": m, "reason": "..."}`` -> the rescale record
  (``{"changed": false}`` when already at m); 409 while another rescale runs.

``LocalTrainerClient`` speaks it with the launcher's ``workers`` and
``rescale``, so the Dagster rescale job drives local workers exactly as it
drives a Kubernetes Job; ``LocalLauncherConfig`` is what a pipeline
declares to use it.  Only loopback addresses are served.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

from kale_dagster.errors import KaleConfigError
from kale_dagster.launchers.base import LauncherConfig, LauncherStatus, RescaleRecord
from kale_dagster.launchers.local import LocalLauncher
from kale_dagster.stream.source import KafkaSource

DEFAULT_URL = "http://127.0.0.1:8765"


class LauncherService:
    """Serve a LocalLauncher on 127.0.0.1:``port`` in a background thread."""

    def __init__(self, launcher: LocalLauncher, port: int = 8765):
        self.launcher = launcher
        self._busy = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the terminal for the status line
                pass

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path != "/status":
                    return self._reply(404, {"error": f"unknown path {self.path}"})
                launcher = service.launcher
                self._reply(200, {**launcher.status().to_dict(), "records": [asdict(r) for r in launcher.records]})

            def do_POST(self):
                if self.path != "/rescale":
                    return self._reply(404, {"error": f"unknown path {self.path}"})
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                    workers = int(body["workers"])
                except (ValueError, KeyError, TypeError):
                    return self._reply(400, {"error": 'expected JSON {"workers": <int>, "reason": "..."}'})
                if not service._busy.acquire(blocking=False):
                    return self._reply(409, {"error": "another rescale is in progress"})
                try:
                    record = service.launcher.rescale(workers, reason=str(body.get("reason", "rescale"))[:500])
                except Exception as exc:  # reported to the caller, who fails its run with it
                    return self._reply(500, {"error": f"{type(exc).__name__}: {exc}", "workers": service.launcher.workers})
                finally:
                    service._busy.release()
                self._reply(200, {"changed": record is not None, **(asdict(record) if record else {"to_workers": workers})})

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="launcher-service")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "LauncherService":
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self.server.shutdown()
        self.server.server_close()


def check_loopback_url(url: str) -> str:
    if not url.startswith(("http://127.", "http://localhost", "http://[::1]")):
        raise KaleConfigError("trainer_url", f"must be a loopback http:// URL (the local trainer service), got {url!r}")
    return url.rstrip("/")


class LocalTrainerClient:
    """``workers`` and ``rescale`` of a LocalLauncher, over its LauncherService's HTTP API."""

    def __init__(self, url: str, timeout_s: float = 600.0):
        self.url = check_loopback_url(url)
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: Optional[dict] = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = json.loads(exc.read() or b"{}").get("error", exc.reason)
            raise RuntimeError(f"trainer service at {self.url} answered {exc.code}: {detail}") from exc
        except urllib.error.URLError as exc:
            raise RuntimeError(f"no trainer service at {self.url} ({exc.reason}); start it with `kale demo` or `kale trainer serve`") from exc

    @property
    def workers(self) -> int:
        return self.status().workers

    def status(self) -> LauncherStatus:
        return LauncherStatus.from_dict(self._call("GET", "/status"))

    def rescale(self, m: int, reason: str = "rescale") -> Optional[RescaleRecord]:
        answer = self._call("POST", "/rescale", {"workers": m, "reason": reason})
        if not answer.pop("changed"):
            return None
        return RescaleRecord(**answer)


@dataclass(frozen=True)
class LocalLauncherConfig(LauncherConfig):
    """Workers run on this machine under the local trainer service (``kale trainer serve``, ``kale demo``)."""

    trainer_url: str = DEFAULT_URL

    def __post_init__(self):
        check_loopback_url(self.trainer_url)

    def build(self, pipeline: str, source: KafkaSource) -> LocalTrainerClient:
        return LocalTrainerClient(self.trainer_url)

    def describe(self) -> str:
        return f"the local trainer service at {self.trainer_url}"
