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
import re
from collections.abc import Sequence
from dataclasses import dataclass

from kale_dagster.errors import KaleConfigError
from kale_dagster.rules import check, setting
from kale_dagster.stream.security import PROVIDER_PATH, security_settings

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")
_PASSWORD_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")

#: Environment variables a worker reads its Kafka security settings from
#: (``trainer.worker.kafka_config``), with the kafka-python keyword each sets.
#: On Kubernetes the password comes from the pipeline's Secret under the same name.
WORKER_ENV = {
    "KAFKA_SECURITY_PROTOCOL": "security_protocol",
    "KAFKA_SASL_MECHANISM": "sasl_mechanism",
    "KAFKA_SASL_USERNAME": "sasl_plain_username",
    "KAFKA_SASL_PASSWORD": "sasl_plain_password",
    "KAFKA_SSL_CAFILE": "ssl_cafile",
    "KAFKA_SSL_CERTFILE": "ssl_certfile",
    "KAFKA_SSL_KEYFILE": "ssl_keyfile",
    "KAFKA_SSL_PASSWORD": "ssl_password",
    "KAFKA_SASL_OAUTH_TOKEN_PROVIDER": "sasl_oauth_token_provider",
}


class Secret(str):
    """A password as kafka-python takes it (a str), whose repr says nothing: kafka-python's clients log their
    whole configuration at DEBUG, and a dict's text is its values' reprs."""

    def __repr__(self) -> str:
        return "'[redacted]'"


def secret_variable(holds: str):
    """A field naming the environment variable that holds a secret: the name is checked, a value pasted in its place
    is never repeated in the error."""
    return setting(
        None,
        pattern=r"[A-Za-z_][A-Za-z0-9_]*",
        hint=f"is not an environment variable's name; name the variable that holds {holds.split(',')[0]}, never the "
        "secret itself",
        echo=False,
        description=f"the NAME of the environment variable that holds {holds} (never the secret itself)",
    )


def read_password(variable: str, field: str = "sasl_password_env") -> Secret:
    """The secret in environment variable ``variable`` (named by ``field``): the one way one is read, inside a
    Dagster run or not."""
    value = os.environ.get(variable)
    if value is None:
        raise KaleConfigError(field, f"environment variable {variable} is not set")
    return Secret(value)


def connection_problems(
    *,
    bootstrap_servers: str,
    topics: Sequence[str],
    group_id: str,
    security_protocol: str,
    sasl_mechanism: str | None,
    sasl_username: str | None,
    has_password: bool,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    sasl_oauth_token_provider: str | None = None,
) -> list[KaleConfigError]:
    """What no single field's rule can say about a connection: the server list's shape, what SASL needs, and
    what a client certificate needs.

    Shared by ``KafkaSource`` and ``KafkaStreamResource`` (whose password is a value, not a variable's name)."""
    found = []
    servers = [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
    if not servers:
        found.append(KaleConfigError("bootstrap_servers", "is empty; give host:port[,host:port...]"))
    for server in servers:
        if "@" in server or "//" in server:  # user:password@host, or a URL: never repeated in an error
            found.append(
                KaleConfigError(
                    "bootstrap_servers",
                    "holds credentials or a URL (not repeated here); give host:port only, the user in sasl_username "
                    "and the password's variable in sasl_password_env",
                )
            )
            continue
        host, sep, port = server.rpartition(":")
        if not sep or not host:
            found.append(KaleConfigError("bootstrap_servers", f"{server!r} is not host:port"))
        elif not port.isdigit() or not 0 < int(port) < 65536:
            found.append(KaleConfigError("bootstrap_servers", f"{server!r}: port must be a number in 1..65535"))
    found += _topic_problems(topics)
    if not group_id.strip():
        found.append(KaleConfigError("group_id", "must not be empty"))
    if security_protocol.startswith("SASL"):
        if sasl_mechanism is None:
            found.append(
                KaleConfigError("sasl_mechanism", f"{security_protocol} needs one of {', '.join(SASL_MECHANISMS)}")
            )
        elif sasl_mechanism in _PASSWORD_MECHANISMS and not (sasl_username and has_password):
            found.append(
                KaleConfigError(
                    "sasl_username",
                    f"SASL {sasl_mechanism} needs a username and a password (from an environment variable)",
                )
            )
    found += _credential_problems(
        security_protocol, sasl_mechanism, ssl_certfile, ssl_keyfile, sasl_oauth_token_provider
    )
    return found


def _topic_problems(topics: Sequence[str]) -> list[KaleConfigError]:
    """A list of distinct names Kafka allows."""
    found = []
    if isinstance(topics, str) or not topics or any(not isinstance(t, str) or not t.strip() for t in topics):
        found.append(KaleConfigError("topics", f"needs a list of at least one non-empty topic name, got {topics!r}"))
    else:
        names = [t.strip() for t in topics]
        if bad := [t for t in names if not TOPIC_NAME.fullmatch(t)]:
            found.append(
                KaleConfigError(
                    "topics", f"{', '.join(map(repr, bad))}: a Kafka topic's name is 1-249 of a-z A-Z 0-9 . _ -"
                )
            )
        if twice := sorted({t for t in names if names.count(t) > 1}):
            found.append(KaleConfigError("topics", f"{', '.join(twice)} named more than once"))
    return found


def _credential_problems(
    security_protocol: str,
    sasl_mechanism: str | None,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
    sasl_oauth_token_provider: str | None,
) -> list[KaleConfigError]:
    """What an OAUTHBEARER token provider and a client certificate need."""
    found = []
    oauth = security_protocol.startswith("SASL") and sasl_mechanism == "OAUTHBEARER"
    if oauth and not sasl_oauth_token_provider:
        found.append(
            KaleConfigError(
                "sasl_oauth_token_provider",
                "SASL OAUTHBEARER needs a token provider: the import path of a kafka-python AbstractTokenProvider, "
                "e.g. 'mypkg.auth:MSKTokenProvider'",
            )
        )
    elif sasl_oauth_token_provider and not oauth:
        found.append(KaleConfigError("sasl_oauth_token_provider", "applies only with sasl_mechanism OAUTHBEARER"))
    if ssl_certfile and not ssl_keyfile:
        found.append(KaleConfigError("ssl_certfile", "a client certificate needs its private key: set ssl_keyfile"))
    elif ssl_keyfile and not ssl_certfile:
        found.append(KaleConfigError("ssl_keyfile", "a private key needs its client certificate: set ssl_certfile"))
    elif ssl_certfile and not security_protocol.endswith("SSL"):
        found.append(
            KaleConfigError("ssl_certfile", f"a client certificate needs SSL or SASL_SSL, not {security_protocol}")
        )
    return found


def normalised(bootstrap_servers: str, topics: Sequence[str], group_id: str, security_protocol: str) -> dict:
    """The connection's text fields as they are kept: no blanks around names, the protocol in capitals."""
    return {
        "bootstrap_servers": ",".join(s.strip() for s in bootstrap_servers.split(",") if s.strip()),
        "topics": tuple(t.strip() for t in topics) if not isinstance(topics, str) else topics,
        "group_id": group_id.strip(),
        "security_protocol": security_protocol.upper(),
    }


def client_settings(bootstrap_servers: str, security_protocol: str, request_timeout_ms: int, **optional) -> dict:
    """kafka-python settings for a client of these brokers, with each of ``optional`` (SASL, SSL, the client id)
    that is set.  The request timeout bounds the bootstrap too: a broker that is down fails within it, not after
    kafka-python's 30 s default."""
    config: dict = {
        "bootstrap_servers": bootstrap_servers.split(","),
        "security_protocol": security_protocol,
        "request_timeout_ms": request_timeout_ms,
        "bootstrap_timeout_ms": request_timeout_ms,
    }
    config.update({k: v for k, v in optional.items() if v})
    return config


@dataclass(frozen=True)
class KafkaSource:
    """The topics a trainer consumes and its consumer group.

    ``samples_per_record`` > 1 when each record carries a micro-batch of
    samples (lag and rates are then counted in samples).  Secrets: pass
    ``sasl_password_env`` (an environment variable's name), never a value.
    """

    bootstrap_servers: str = setting(description="host:port[,host:port...] of the Kafka brokers")
    topics: tuple[str, ...] = setting(description="the topics the trainer consumes")
    group_id: str = setting(
        description="the trainer's consumer group: its committed offsets are where training resumes"
    )
    security_protocol: str = setting("PLAINTEXT", choices=SECURITY_PROTOCOLS, description="how clients connect")
    sasl_mechanism: str | None = setting(None, choices=SASL_MECHANISMS, description="for SASL_* protocols")
    sasl_username: str | None = setting(None, description="for SASL PLAIN and SCRAM")
    sasl_password_env: str | None = secret_variable("the SASL password")
    ssl_cafile: str | None = setting(None, description="CA bundle for SSL protocols")
    ssl_certfile: str | None = setting(None, description="the client certificate (PEM), for mutual TLS")
    ssl_keyfile: str | None = setting(None, description="the client certificate's private key (PEM)")
    ssl_password_env: str | None = secret_variable("the private key's passphrase, if it has one")
    sasl_oauth_token_provider: str | None = setting(
        None,
        pattern=PROVIDER_PATH,
        hint="must be module:attribute, e.g. mypkg.auth:MSKTokenProvider",
        description="for OAUTHBEARER: the import path of a kafka-python token provider (MSK IAM, Confluent OAuth)",
    )
    samples_per_record: int = setting(1, ge=1, description="samples packed in each Kafka record")
    request_timeout_ms: int = setting(10_000, ge=100, unit="ms", description="a broker request's timeout")

    def __post_init__(self):
        text = (self.bootstrap_servers, self.group_id, self.security_protocol)
        if all(isinstance(v, str) for v in text) and isinstance(self.topics, (list, tuple)):
            for name, value in normalised(self.bootstrap_servers, self.topics, *text[1:]).items():
                object.__setattr__(self, name, value)
        check(
            self,
            lambda: connection_problems(
                bootstrap_servers=self.bootstrap_servers,
                topics=self.topics,
                group_id=self.group_id,
                security_protocol=self.security_protocol,
                sasl_mechanism=self.sasl_mechanism,
                sasl_username=self.sasl_username,
                has_password=bool(self.sasl_password_env),
                ssl_certfile=self.ssl_certfile,
                ssl_keyfile=self.ssl_keyfile,
                sasl_oauth_token_provider=self.sasl_oauth_token_provider,
            ),
        )

    def client_config(self) -> dict:
        """kafka-python settings for a client of this source's brokers, the secrets read from their variables."""
        key_password = read_password(self.ssl_password_env, "ssl_password_env") if self.ssl_password_env else None
        return client_settings(
            self.bootstrap_servers,
            self.security_protocol,
            self.request_timeout_ms,
            sasl_mechanism=self.sasl_mechanism,
            sasl_plain_username=self.sasl_username,
            sasl_plain_password=read_password(self.sasl_password_env) if self.sasl_password_env else None,
            **security_settings(
                ssl_cafile=self.ssl_cafile,
                ssl_certfile=self.ssl_certfile,
                ssl_keyfile=self.ssl_keyfile,
                ssl_password=key_password,
                sasl_oauth_token_provider=self.sasl_oauth_token_provider,
            ),
        )

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
            ("KAFKA_SSL_CERTFILE", self.ssl_certfile),
            ("KAFKA_SSL_KEYFILE", self.ssl_keyfile),
            ("KAFKA_SASL_OAUTH_TOKEN_PROVIDER", self.sasl_oauth_token_provider),
        ):
            if value:
                env[name] = value
        if include_password and self.sasl_password_env:
            env["KAFKA_SASL_PASSWORD"] = read_password(self.sasl_password_env)
        if include_password and self.ssl_password_env:
            env["KAFKA_SSL_PASSWORD"] = read_password(self.ssl_password_env, "ssl_password_env")
        return env
