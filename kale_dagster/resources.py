"""Dagster resources: the Kafka stream a pipeline trains on."""

from __future__ import annotations

import contextlib
from typing import Optional

from dagster import ConfigurableResource
from pydantic import Field, field_validator, model_validator

from .errors import KaleConfigError
from .telemetry import PreviousOffsets, StreamSnapshot, build_snapshot, read_offsets

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")


class KafkaStreamResource(ConfigurableResource):
    """Connection to the topics a trainer consumes and its consumer group.

    Security settings are passed through to kafka-python.  Keep secrets out
    of code and Dagster config: use ``dagster.EnvVar("KAFKA_PASSWORD")``.
    """

    bootstrap_servers: str = Field(description="comma-separated host:port list")
    topics: list[str] = Field(description="topics the trainer consumes")
    group_id: str = Field(description="the trainer's consumer group")
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: Optional[str] = None
    sasl_plain_username: Optional[str] = None
    sasl_plain_password: Optional[str] = None
    ssl_cafile: Optional[str] = None
    ssl_certfile: Optional[str] = None
    ssl_keyfile: Optional[str] = None
    samples_per_record: int = Field(default=1, description="samples packed in each Kafka record (1 = one sample per record)")
    request_timeout_ms: int = 10_000
    client_id: str = "kale-telemetry"

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: str) -> str:
        servers = [s.strip() for s in value.split(",") if s.strip()]
        if not servers:
            raise KaleConfigError("bootstrap_servers", "is empty; give host:port[,host:port...]")
        for server in servers:
            host, sep, port = server.rpartition(":")
            if not sep or not host:
                raise KaleConfigError("bootstrap_servers", f"{server!r} is not host:port")
            if not port.isdigit() or not 0 < int(port) < 65536:
                raise KaleConfigError("bootstrap_servers", f"{server!r}: port must be a number in 1..65535")
        return ",".join(servers)

    @field_validator("topics")
    @classmethod
    def _topics(cls, value: list[str]) -> list[str]:
        if not value or any(not t or not t.strip() for t in value):
            raise KaleConfigError("topics", "needs at least one non-empty topic name")
        return [t.strip() for t in value]

    @field_validator("group_id")
    @classmethod
    def _group(cls, value: str) -> str:
        if not value.strip():
            raise KaleConfigError("group_id", "must not be empty")
        return value.strip()

    @field_validator("security_protocol")
    @classmethod
    def _protocol(cls, value: str) -> str:
        if value.upper() not in SECURITY_PROTOCOLS:
            raise KaleConfigError("security_protocol", f"unknown {value!r}; use one of {', '.join(SECURITY_PROTOCOLS)}")
        return value.upper()

    @field_validator("samples_per_record")
    @classmethod
    def _packing(cls, value: int) -> int:
        if value < 1:
            raise KaleConfigError("samples_per_record", f"must be >= 1, got {value}")
        return value

    @field_validator("request_timeout_ms")
    @classmethod
    def _timeout(cls, value: int) -> int:
        if value < 100:
            raise KaleConfigError("request_timeout_ms", f"must be >= 100 ms, got {value}")
        return value

    @model_validator(mode="after")
    def _sasl(self):
        if self.security_protocol.startswith("SASL"):
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise KaleConfigError("sasl_mechanism", f"{self.security_protocol} needs one of {', '.join(SASL_MECHANISMS)}, got {self.sasl_mechanism!r}")
            if self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (self.sasl_plain_username and self.sasl_plain_password):
                raise KaleConfigError("sasl_plain_username", f"SASL {self.sasl_mechanism} needs sasl_plain_username and sasl_plain_password")
        return self

    def client_config(self) -> dict:
        """kafka-python keyword arguments shared by every client this resource makes."""
        config = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
            # A broker that is down must fail the tick within its budget, not after kafka-python's 30 s default.
            "bootstrap_timeout_ms": self.request_timeout_ms,
            "client_id": self.client_id,
        }
        optional = {
            "sasl_mechanism": self.sasl_mechanism,
            "sasl_plain_username": self.sasl_plain_username,
            "sasl_plain_password": self.sasl_plain_password,
            "ssl_cafile": self.ssl_cafile,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
        }
        config.update({k: v for k, v in optional.items() if v})
        return config

    def snapshot(self, previous: Optional[PreviousOffsets] = None, fetch_timeout_s: float = 5.0) -> StreamSnapshot:
        """Read the stream's offsets now; rates come from ``previous`` when given."""
        from kafka import KafkaAdminClient, KafkaConsumer

        common = self.client_config()
        consumer = admin = None
        try:
            consumer = KafkaConsumer(
                **common, enable_auto_commit=False, group_id=None,
                max_partition_fetch_bytes=1024, fetch_max_wait_ms=50, fetch_min_bytes=1,
                connections_max_idle_ms=max(self.request_timeout_ms * 2, 60_000),
            )
            admin = KafkaAdminClient(**common)
            raw = read_offsets(consumer, admin, self.topics, self.group_id, fetch_timeout_s)
        finally:
            for client in (consumer, admin):
                if client is not None:
                    with contextlib.suppress(Exception):
                        client.close()
        return build_snapshot(raw, previous, self.samples_per_record)
