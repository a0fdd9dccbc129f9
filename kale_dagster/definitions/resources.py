"""The Dagster resource that reads a pipeline's Kafka stream (telemetry)."""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from dagster import ConfigurableResource, EnvVar
from pydantic import Field, model_validator

from kale_dagster.errors import KaleConfigError
from kale_dagster.rules import problems_in
from kale_dagster.stream.security import security_settings
from kale_dagster.stream.source import (
    KafkaSource,
    Secret,
    client_settings,
    connection_problems,
    normalised,
    read_password,
)
from kale_dagster.stream.telemetry import PreviousOffsets, StreamSnapshot, build_snapshot, read_offsets

#: The resource's fields that a ``KafkaSource`` declares under the same name and rule.
_SOURCE_FIELDS = (
    "sasl_mechanism",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
    "sasl_oauth_token_provider",
    "samples_per_record",
    "request_timeout_ms",
)


class KafkaStreamResource(ConfigurableResource):
    """Connection to the topics a trainer consumes and its consumer group.

    Built from the pipeline's ``KafkaSource`` (``from_source``); validated by
    the same function.  Security settings are passed through to
    kafka-python; the password comes from an environment variable
    (``dagster.EnvVar``), never from code or Dagster config.
    """

    bootstrap_servers: str = Field(description="comma-separated host:port list")
    topics: list[str] = Field(description="topics the trainer consumes")
    group_id: str = Field(description="the trainer's consumer group")
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = None
    sasl_oauth_token_provider: str | None = None
    samples_per_record: int = Field(
        default=1, description="samples packed in each Kafka record (1 = one sample per record)"
    )
    request_timeout_ms: int = 10_000
    client_id: str = "kale-telemetry"

    @classmethod
    def from_source(cls, source: KafkaSource) -> KafkaStreamResource:
        return cls(
            bootstrap_servers=source.bootstrap_servers,
            topics=list(source.topics),
            group_id=source.group_id,
            security_protocol=source.security_protocol,
            sasl_mechanism=source.sasl_mechanism,
            sasl_plain_username=source.sasl_username,
            sasl_plain_password=EnvVar(source.sasl_password_env) if source.sasl_password_env else None,
            ssl_cafile=source.ssl_cafile,
            ssl_certfile=source.ssl_certfile,
            ssl_keyfile=source.ssl_keyfile,
            ssl_password=EnvVar(source.ssl_password_env) if source.ssl_password_env else None,
            sasl_oauth_token_provider=source.sasl_oauth_token_provider,
            samples_per_record=source.samples_per_record,
            request_timeout_ms=source.request_timeout_ms,
        )

    @model_validator(mode="before")
    @classmethod
    def _valid(cls, data):
        """The source's own rules (``KafkaSource``): its fields' and the connection's, all errors together."""
        if not isinstance(data, dict):
            return data
        text = {
            "bootstrap_servers": data.get("bootstrap_servers") or "",
            "topics": data.get("topics") or (),
            "group_id": data.get("group_id") or "",
            "security_protocol": data.get("security_protocol") or "PLAINTEXT",
        }
        fields = {**normalised(**text), **{k: data[k] for k in _SOURCE_FIELDS if k in data}}
        found = problems_in(KafkaSource, fields)
        if not found:
            found = connection_problems(
                **{k: fields[k] for k in text},
                sasl_mechanism=data.get("sasl_mechanism"),
                sasl_username=data.get("sasl_plain_username"),
                has_password=data.get("sasl_plain_password") is not None,
                ssl_certfile=data.get("ssl_certfile"),
                ssl_keyfile=data.get("ssl_keyfile"),
                sasl_oauth_token_provider=data.get("sasl_oauth_token_provider"),
            )
        if found:
            raise KaleConfigError.join(found)
        return {**data, **fields, "topics": list(fields["topics"])}

    def client_config(self) -> dict:
        """kafka-python keyword arguments shared by every client this resource makes."""
        return client_settings(
            self.bootstrap_servers,
            self.security_protocol,
            self.request_timeout_ms,
            client_id=self.client_id,
            sasl_mechanism=self.sasl_mechanism,
            sasl_plain_username=self.sasl_plain_username,
            sasl_plain_password=self._secret(self.sasl_plain_password, "sasl_password_env"),
            **security_settings(
                ssl_cafile=self.ssl_cafile,
                ssl_certfile=self.ssl_certfile,
                ssl_keyfile=self.ssl_keyfile,
                ssl_password=self._secret(self.ssl_password, "ssl_password_env"),
                sasl_oauth_token_provider=self.sasl_oauth_token_provider,
            ),
        )

    @staticmethod
    def _secret(value: str | None, field: str) -> Secret | None:
        """A password, resolved the same way inside a Dagster run (where Dagster has resolved the EnvVar to its
        value) and outside one (the CLI, where the field still holds the EnvVar): never the variable's name."""
        if value is None:
            return None
        if isinstance(value, EnvVar):
            return read_password(value.env_var_name, field)
        return Secret(value)

    @contextlib.contextmanager
    def consumer(self, **overrides):
        """A group-less KafkaConsumer with this resource's connection settings, closed on exit."""
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(**self.client_config(), enable_auto_commit=False, group_id=None, **overrides)
        try:
            yield consumer
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    def snapshot(self, previous: PreviousOffsets | None = None, fetch_timeout_s: float = 5.0) -> StreamSnapshot:
        """Read the stream's offsets now; rates come from ``previous`` when given."""
        config = self.client_config()
        with _open_clients(config) as (consumer, admin):
            raw = read_offsets(consumer, admin, self.topics, self.group_id, fetch_timeout_s)
        return build_snapshot(raw, previous, self.samples_per_record)


@dataclass
class _Clients:
    lock: threading.Lock = field(default_factory=threading.Lock)
    consumer: Any = None
    admin: Any = None
    used: float = field(default_factory=time.monotonic)

    def close(self) -> None:
        for client in (self.consumer, self.admin):
            with contextlib.suppress(Exception):
                if client is not None:
                    client.close()
        self.consumer = self.admin = None


#: Telemetry clients by connection settings, kept open across ticks: the code server keeps its process, and
#: opening them costs connections and a metadata round trip at every tick.
_OPEN: dict[str, _Clients] = {}
_OPEN_LOCK = threading.Lock()
#: Clients no tick has used for this long are closed: their pipeline was removed, or its settings changed.
IDLE_CLIENTS_S = 3600.0


def _close_idle(now: float) -> None:
    """Close and forget the clients idle for over ``IDLE_CLIENTS_S`` (the caller holds ``_OPEN_LOCK``)."""
    for key, clients in list(_OPEN.items()):
        if now - clients.used > IDLE_CLIENTS_S and clients.lock.acquire(blocking=False):
            try:
                clients.close()
                del _OPEN[key]
            finally:
                clients.lock.release()


@contextlib.contextmanager
def _open_clients(config: dict):
    """The consumer and admin client for ``config``, one tick at a time; after any error both are closed, so
    that the next tick connects afresh (a broker restarted, credentials rotated)."""
    from kafka import KafkaAdminClient, KafkaConsumer

    # The password is part of the key by its digest (a rotated one opens new clients), never kept in clear.
    key = hashlib.sha256(repr(sorted((k, str(v)) for k, v in config.items())).encode()).hexdigest()
    now = time.monotonic()
    with _OPEN_LOCK:
        clients = _OPEN.setdefault(key, _Clients())
        clients.used = now
        _close_idle(now)
    with clients.lock:
        try:
            if clients.consumer is None:
                clients.consumer = KafkaConsumer(
                    **config,
                    enable_auto_commit=False,
                    group_id=None,
                    max_partition_fetch_bytes=1024,
                    fetch_max_wait_ms=50,
                    fetch_min_bytes=1,
                )
                clients.admin = KafkaAdminClient(**config)
            yield clients.consumer, clients.admin
        except BaseException:
            clients.close()
            raise
