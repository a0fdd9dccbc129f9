"""Kafka security beyond a password, as every client takes it: TLS files (mutual TLS with a client certificate),
and an OAUTHBEARER token provider named by import path (MSK IAM, Confluent Cloud OAuth, a company's own).

One function builds kafka-python's settings for telemetry, history backfill and the workers alike
(``security_settings``): each file is checked the way TLS will read it, so a wrong one is one line naming the
file (never the key's passphrase), and the provider is imported and built once per client configuration.
"""

from __future__ import annotations

import importlib
import os
import ssl
from typing import Any

from kale_dagster.errors import KaleConfigError

#: ``module:attribute``, as ``sasl_oauth_token_provider`` names a provider.
PROVIDER_PATH = r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*"


def token_provider(path: str) -> Any:
    """The token provider at ``path``: a kafka-python ``AbstractTokenProvider`` subclass (built with no
    arguments), a function of no arguments returning one, or an instance; it must have ``token()``."""
    module, _, attr = path.partition(":")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise KaleConfigError("sasl_oauth_token_provider", f"cannot import {path}: {exc}") from None
    provider = found() if callable(found) and not callable(getattr(found, "token", None)) else found
    if isinstance(provider, type):  # a class whose token() is a method: build it
        provider = provider()
    if not callable(getattr(provider, "token", None)):
        raise KaleConfigError(
            "sasl_oauth_token_provider",
            f"{path} gives a {type(provider).__name__}, which has no token() method "
            "(subclass kafka.net.sasl.oauth.AbstractTokenProvider)",
        )
    return provider


def checked_tls(cafile: str | None, certfile: str | None, keyfile: str | None, password: str | None) -> None:
    """Load the TLS files as the client will, so that a missing, unreadable or mismatched one is an error naming
    it now rather than a handshake that fails at every reconnect."""
    if not (cafile or certfile or keyfile):
        return
    for name, path in (("ssl_cafile", cafile), ("ssl_certfile", certfile), ("ssl_keyfile", keyfile)):
        if path and not os.access(path, os.R_OK):
            raise KaleConfigError(
                name, f"cannot read {path} ({'no such file' if not os.path.exists(path) else 'no permission'})"
            )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cafile:
        try:
            context.load_verify_locations(cafile)
        except ssl.SSLError as exc:
            raise KaleConfigError(
                "ssl_cafile", f"{cafile} holds no CA certificate TLS can read ({_why(exc)})"
            ) from None
    if certfile:
        try:
            context.load_cert_chain(certfile, keyfile, password)
        except ssl.SSLError as exc:
            raise KaleConfigError(
                "ssl_certfile",
                f"{certfile} with the key {keyfile or certfile} cannot be used ({_why(exc)}): the key must be the "
                "certificate's own, in PEM, its passphrase in ssl_password_env's variable",
            ) from None


def security_settings(
    *,
    ssl_cafile: str | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    ssl_password: str | None = None,
    sasl_oauth_token_provider: str | None = None,
) -> dict:
    """kafka-python's TLS and OAUTHBEARER settings, the files checked and the provider built; only those set."""
    checked_tls(ssl_cafile, ssl_certfile, ssl_keyfile, ssl_password)
    settings = {"ssl_cafile": ssl_cafile, "ssl_certfile": ssl_certfile, "ssl_keyfile": ssl_keyfile}
    settings["ssl_password"] = ssl_password
    if sasl_oauth_token_provider:
        settings["sasl_oauth_token_provider"] = token_provider(sasl_oauth_token_provider)
    return {k: v for k, v in settings.items() if v}


def _why(exc: ssl.SSLError) -> str:
    """OpenSSL's reason in words: PEM_LIB (what a wrong passphrase gives too) says nothing to a reader."""
    reason = str(exc.reason or exc.strerror or exc)
    if "PEM_LIB" in reason or "PEM lib" in reason:
        return "not PEM, or its passphrase is wrong"
    return reason.replace("_", " ").lower()
