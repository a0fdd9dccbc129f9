"""Kafka as companies run it: mutual TLS against the embedded broker behind a TLS terminator the test starts
(stunnel, from Debian's packages) that requires a client certificate, and an OAUTHBEARER token provider named by
import path.  Telemetry, the history backfill's consumer and a worker's consumer all connect the same way."""

from __future__ import annotations

import datetime
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kale_dagster import KafkaSource, KaleConfigError
from kale_dagster.definitions.resources import KafkaStreamResource
from kale_dagster.processes import stop_process_group
from kale_dagster.stream.broker import free_loopback_port, start_broker
from kale_dagster.trainer.intake import kafka_config

PASSPHRASE = "correct horse battery staple"
pytestmark = pytest.mark.xdist_group("kafka_tls")  # one terminator for the module, in one test process


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(directory: Path, name: str, issuer: tuple | None, server: bool = False, passphrase: str | None = None):
    """A key and certificate, signed by ``issuer`` (key, cert) or self-signed as a CA; written as PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(issuer[1].subject if issuer else _name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if server:
        import ipaddress

        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    cert = builder.sign(issuer[0] if issuer else key, hashes.SHA256())
    encryption = (
        serialization.BestAvailableEncryption(passphrase.encode()) if passphrase else serialization.NoEncryption()
    )
    (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    return key, cert


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    """The embedded broker behind stunnel, which accepts only clients whose certificate the test's CA signed; one
    for the module (the tests read, none changes what another reads)."""
    tmp_path = tmp_path_factory.mktemp("tls")
    stunnel = shutil.which("stunnel4") or shutil.which("stunnel")
    if stunnel is None:
        pytest.skip("stunnel is not installed (apt-get install stunnel4; .ci/install does)")
    ca = _issue(tmp_path, "ca", None)
    _issue(tmp_path, "server", ca, server=True)
    _issue(tmp_path, "client", ca, passphrase=PASSPHRASE)
    _issue(tmp_path, "stranger", _issue(tmp_path, "other-ca", None))  # a certificate from a CA nobody trusts
    port, tls_port = free_loopback_port(), free_loopback_port()
    conf = tmp_path / "stunnel.conf"
    conf.write_text(
        f"foreground = yes\npid =\n[kafka]\naccept = 127.0.0.1:{tls_port}\nconnect = 127.0.0.1:{port}\n"
        f"cert = {tmp_path}/server.pem\nkey = {tmp_path}/server.key\nCAfile = {tmp_path}/ca.pem\n"
        "verifyChain = yes\nrequireCert = yes\n"
    )
    terminator = subprocess.Popen(
        [stunnel, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    os.environ["KALE_TEST_KEY_PASSPHRASE"] = PASSPHRASE
    source = KafkaSource(
        f"127.0.0.1:{tls_port}",
        ("tls",),
        "tls-trainer",
        security_protocol="SSL",
        ssl_cafile=str(tmp_path / "ca.pem"),
        ssl_certfile=str(tmp_path / "client.pem"),
        ssl_keyfile=str(tmp_path / "client.key"),
        ssl_password_env="KALE_TEST_KEY_PASSPHRASE",
        request_timeout_ms=3000,
    )
    broker = None
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", tls_port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        config = {k: v for k, v in source.client_config().items() if k.startswith(("ssl", "security"))}
        broker = start_broker(port=port, advertised_port=tls_port, client_config=config)
        yield source, tmp_path
    finally:
        os.environ.pop("KALE_TEST_KEY_PASSPHRASE", None)
        if broker is not None:
            broker.stop()
        stop_process_group(terminator, 5.0)


def test_telemetry_the_backfills_consumer_and_a_worker_connect_with_a_client_certificate(tls_broker, monkeypatch):
    from kafka import KafkaConsumer, KafkaProducer

    source, _ = tls_broker
    producer = KafkaProducer(**source.client_config())
    for i in range(20):
        producer.send("tls", f"sample {i}".encode())
    producer.flush(timeout=30)
    producer.close()
    # Telemetry: the pipeline's resource, built from the source, reads the offsets through TLS.
    telemetry = KafkaStreamResource.from_source(source)
    snapshot = telemetry.snapshot()
    assert snapshot.end_offset_total == 20 and snapshot.sample_lag == 20
    # The history backfill reads through the resource's consumer.
    with telemetry.consumer() as consumer:
        assert "tls" in consumer.topics()
    # A worker: its settings come from the environment the launcher gives it, never its command line.
    for name, value in source.worker_env(include_password=True).items():
        monkeypatch.setenv(name, value)
    worker = KafkaConsumer("tls", **kafka_config(source.bootstrap_servers), group_id=None, auto_offset_reset="earliest")
    values, deadline = [], time.monotonic() + 30
    try:
        while len(values) < 20 and time.monotonic() < deadline:
            for batch in worker.poll(timeout_ms=500).values():
                values += [m.value for m in batch]
    finally:
        worker.close()
    assert sorted(values) == sorted(f"sample {i}".encode() for i in range(20))


def test_a_client_without_a_trusted_certificate_is_refused_by_the_broker(tls_broker):
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    source, tmp_path = tls_broker
    stranger = dict(source.client_config(), ssl_certfile=str(tmp_path / "stranger.pem"))
    stranger.update(ssl_keyfile=str(tmp_path / "stranger.key"), ssl_password=None)
    with pytest.raises(KafkaError):
        consumer = KafkaConsumer(**stranger, group_id=None)
        try:
            consumer.topics()
        finally:
            consumer.close()


def test_a_wrong_certificate_or_key_is_one_line_naming_the_file_and_no_secret(tmp_path, monkeypatch):
    ca = _issue(tmp_path, "ca", None)
    _issue(tmp_path, "client", ca, passphrase=PASSPHRASE)
    _issue(tmp_path, "other", ca)
    monkeypatch.setenv("KEY_PASS", PASSPHRASE)

    def source(**tls):
        declared = {
            "ssl_cafile": str(tmp_path / "ca.pem"),
            "ssl_certfile": str(tmp_path / "client.pem"),
            "ssl_keyfile": str(tmp_path / "client.key"),
            "ssl_password_env": "KEY_PASS",
            **tls,
        }
        return KafkaSource("127.0.0.1:9093", ("t",), "g", security_protocol="SSL", **declared)

    rows = [
        ({"ssl_keyfile": str(tmp_path / "other.key"), "ssl_password_env": None}, "ssl_certfile", "client.pem"),
        ({"ssl_certfile": str(tmp_path / "missing.pem")}, "ssl_certfile", "missing.pem (no such file)"),
        ({"ssl_cafile": str(tmp_path / "client.key")}, "ssl_cafile", "client.key holds no CA certificate"),
    ]
    for tls, field, says in rows:
        with pytest.raises(KaleConfigError) as err:
            source(**tls).client_config()
        message = str(err.value)
        assert err.value.field == field and says in message, message
        assert "\n" not in message and PASSPHRASE not in message
    monkeypatch.setenv("KEY_PASS", "not the passphrase")
    with pytest.raises(KaleConfigError) as err:
        source().client_config()
    message = str(err.value)
    assert "client.pem" in message and "its passphrase is wrong" in message and "not the passphrase" not in message


class StaticTokenProvider:
    """A stand-in for an identity provider's client (MSK IAM, Confluent OAuth): a token per call."""

    def token(self) -> str:
        return "token-for-kale"


def test_oauthbearer_builds_the_named_token_provider_for_every_client(monkeypatch):
    path = f"{__name__}:StaticTokenProvider"
    source = KafkaSource("127.0.0.1:9093", ("t",), "g", security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                         sasl_oauth_token_provider=path)  # fmt: skip
    assert source.client_config()["sasl_oauth_token_provider"].token() == "token-for-kale"
    resource = KafkaStreamResource.from_source(source)
    assert resource.client_config()["sasl_oauth_token_provider"].token() == "token-for-kale"
    for name, value in source.worker_env(include_password=True).items():
        monkeypatch.setenv(name, value)
    assert kafka_config(source.bootstrap_servers)["sasl_oauth_token_provider"].token() == "token-for-kale"


@pytest.mark.parametrize(
    "declared, field, says",
    [
        ({"sasl_mechanism": "OAUTHBEARER"}, "sasl_oauth_token_provider", "SASL OAUTHBEARER needs a token provider"),
        ({"sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": "no colon"}, "sasl_oauth_token_provider",
         "must be module:attribute"),
        ({"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password_env": "P",
          "sasl_oauth_token_provider": "a:b"}, "sasl_oauth_token_provider", "applies only with sasl_mechanism"),
        ({"ssl_certfile": "/etc/client.pem"}, "ssl_certfile", "needs its private key: set ssl_keyfile"),
        ({"ssl_keyfile": "/etc/client.key"}, "ssl_keyfile", "needs its client certificate: set ssl_certfile"),
    ],
)  # fmt: skip
def test_security_declarations_are_checked_when_the_code_loads(declared, field, says):
    with pytest.raises(KaleConfigError) as err:
        KafkaSource("127.0.0.1:9093", ("t",), "g", security_protocol="SASL_SSL", **declared)
    assert says in str(err.value) and field in [e.field for e in err.value.errors]


def test_a_provider_that_does_not_import_is_one_line():
    source = KafkaSource("127.0.0.1:9093", ("t",), "g", security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                         sasl_oauth_token_provider="no_such_module:Provider")  # fmt: skip
    with pytest.raises(KaleConfigError, match="sasl_oauth_token_provider: cannot import no_such_module:Provider"):
        source.client_config()
