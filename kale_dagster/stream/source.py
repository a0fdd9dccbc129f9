"""The stream a trainer consumes, declared once.

A :class:`KafkaSource` is the single declaration of a pipeline's Kafka
stream.  Everything that talks to Kafka is derived from it: the telemetry
resource (``KafkaStreamResource.from_source``), the local trainer's workers
(``TrainerSettings``) and the Kubernetes manifests (``render``), so no
field is ever copied by hand.

Secrets never live in the declaration: ``sasl_password_env`` names an
environment variable.  Workers receive the connection settings through the
environment (``WORKER_ENV``), never on a command line.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from kale_dagster.errors import KaleConfigError

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")
_PASSWORD_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

#: Environment variables a worker reads its Kafka security settings from
#: (``trainer.worker.kafka_config``), with the kafka-python keyword each sets.
#: On Kubernetes the password comes from the pipeline's Secret under the same name.
WORKER_ENV = {
    "KAFKA_SECURITY_PROTOCOL": "security_protocol",
    "KAFKA_SASL_MECHANISM": "sasl_mechanism",
    "KAFKA_SASL_USERNAME": "sasl_plain_username",
    "KAFKA_SASL_PASSWORD": "sasl_plain_password",
    "KAFKA_SSL_CAFILE": "ssl_cafile",
}


def check_kafka_settings(
    *,
    bootstrap_servers: str,
    topics: Sequence[str],
    group_id: str,
    security_protocol: str,
    sasl_mechanism: str | None,
    sasl_username: str | None,
    has_password: bool,
    samples_per_record: int,
    request_timeout_ms: int,
) -> tuple[str, tuple[str, ...], str, str]:
    """Validate Kafka connection settings; returns normalised (servers, topics, group, protocol).

    The one validation path for ``KafkaSource`` and ``KafkaStreamResource``:
    each error names the field and says what to fix.
    """
    servers = [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
    if not servers:
        raise KaleConfigError("bootstrap_servers", "is empty; give host:port[,host:port...]")
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host:
            raise KaleConfigError("bootstrap_servers", f"{server!r} is not host:port")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise KaleConfigError("bootstrap_servers", f"{server!r}: port must be a number in 1..65535")
    if isinstance(topics, str) or not topics or any(not t or not t.strip() for t in topics):
        raise KaleConfigError("topics", f"needs a list of at least one non-empty topic name, got {topics!r}")
    if not group_id or not group_id.strip():
        raise KaleConfigError("group_id", "must not be empty")
    protocol = (security_protocol or "").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise KaleConfigError(
            "security_protocol", f"unknown {security_protocol!r}; use one of {', '.join(SECURITY_PROTOCOLS)}"
        )
    if protocol.startswith("SASL"):
        if sasl_mechanism not in SASL_MECHANISMS:
            raise KaleConfigError(
                "sasl_mechanism", f"{protocol} needs one of {', '.join(SASL_MECHANISMS)}, got {sasl_mechanism!r}"
            )
        if sasl_mechanism in _PASSWORD_MECHANISMS and not (sasl_username and has_password):
            raise KaleConfigError(
                "sasl_username", f"SASL {sasl_mechanism} needs a username and a password (from an environment variable)"
            )
    if samples_per_record < 1:
        raise KaleConfigError("samples_per_record", f"must be >= 1, got {samples_per_record}")
    if request_timeout_ms < 100:
        raise KaleConfigError("request_timeout_ms", f"must be >= 100 ms, got {request_timeout_ms}")
    return ",".join(servers), tuple(t.strip() for t in topics), group_id.strip(), protocol


@dataclass(frozen=True)
class KafkaSource:
    """The topics a trainer consumes and its consumer group.

    ``samples_per_record`` > 1 when each record carries a micro-batch of
    samples (lag and rates are then counted in samples).  Secrets: pass
    ``sasl_password_env`` (an environment variable's name), never a value.
    """

    bootstrap_servers: str
    topics: tuple[str, ...]
    group_id: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password_env: str | None = None
    ssl_cafile: str | None = None
    samples_per_record: int = 1
    request_timeout_ms: int = 10_000

    def __post_init__(self):
        servers, topics, group, protocol = check_kafka_settings(
            bootstrap_servers=self.bootstrap_servers,
            topics=self.topics,
            group_id=self.group_id,
            security_protocol=self.security_protocol,
            sasl_mechanism=self.sasl_mechanism,
            sasl_username=self.sasl_username,
            has_password=bool(self.sasl_password_env),
            samples_per_record=self.samples_per_record,
            request_timeout_ms=self.request_timeout_ms,
        )
        for name, value in (
            ("bootstrap_servers", servers),
            ("topics", topics),
            ("group_id", group),
            ("security_protocol", protocol),
        ):
            object.__setattr__(self, name, value)

    @property
    def topic(self) -> str:
        """The one topic of a single-topic source (what the kale trainer consumes)."""
        if len(self.topics) != 1:
            raise KaleConfigError(
                "topics",
                f"the kale trainer consumes one topic; this source declares {len(self.topics)}: "
                f"{', '.join(self.topics)}",
            )
        return self.topics[0]

    def worker_env(self, include_password: bool) -> dict[str, str]:
        """The ``WORKER_ENV`` variables for a worker process.

        ``include_password`` reads the password from ``sasl_password_env`` in
        this process's environment (local workers); on Kubernetes it stays
        out and the pod gets it from the pipeline's Secret.
        """
        env = {"KAFKA_SECURITY_PROTOCOL": self.security_protocol}
        for name, value in (
            ("KAFKA_SASL_MECHANISM", self.sasl_mechanism),
            ("KAFKA_SASL_USERNAME", self.sasl_username),
            ("KAFKA_SSL_CAFILE", self.ssl_cafile),
        ):
            if value:
                env[name] = value
        if include_password and self.sasl_password_env:
            password = os.environ.get(self.sasl_password_env)
            if password is None:
                raise KaleConfigError("sasl_password_env", f"environment variable {self.sasl_password_env} is not set")
            env["KAFKA_SASL_PASSWORD"] = password
        return env
