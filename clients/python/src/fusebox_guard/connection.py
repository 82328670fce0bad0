"""Connecting to NATS the way fuseboxd's deployments require: every credential kind the
daemon accepts, TLS (mutual too), the per-tenant inbox prefix, and a first connect that
fails at once with the reason instead of retrying for minutes."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS

from .errors import ConnectError

TENANT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def check_id(what: str, value: str, max_len: int) -> str:
    """Tenant and run ids are subject tokens: `[A-Za-z0-9_-]{1,max_len}`."""
    if not value or len(value) > max_len or not set(value) <= TENANT_CHARS:
        raise ValueError(f"{what} {value!r} must be 1-{max_len} of A-Z a-z 0-9 _ -")
    return value


@dataclass(frozen=True)
class TLSConfig:
    """TLS to the NATS server. `cert_file` + `key_file` make it mutual TLS."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    #: The name the server certificate must carry, when it differs from the URL's host.
    hostname: str | None = None
    handshake_first: bool = False

    def context(self) -> ssl.SSLContext:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("TLS cert_file and key_file go together")
        context = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


@dataclass(frozen=True)
class Credentials:
    """At most one way to authenticate, as in fuseboxd's `[nats]` section."""

    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkey_seed_file: str | None = None
    creds_file: str | None = None

    def connect_kwargs(self) -> dict[str, Any]:
        kinds = [
            self.user is not None or self.password is not None,
            self.token is not None,
            self.nkey_seed_file is not None,
            self.creds_file is not None,
        ]
        if sum(kinds) > 1:
            raise ValueError("set at most one of user/password, token, nkey_seed_file, creds_file")
        if (self.user is None) != (self.password is None):
            raise ValueError("user and password go together")
        kwargs: dict[str, Any] = {}
        if self.user is not None:
            kwargs.update(user=self.user, password=self.password)
        if self.token is not None:
            kwargs["token"] = self.token
        if self.nkey_seed_file is not None:
            kwargs["nkeys_seed"] = self.nkey_seed_file
        if self.creds_file is not None:
            kwargs["user_credentials"] = self.creds_file
        return kwargs


async def connect_nats(
    servers: str | Sequence[str],
    *,
    tenant: str,
    credentials: Credentials,
    tls: TLSConfig | None,
    inbox_prefix: str | None,
    connect_timeout_s: float,
    name: str | None,
) -> NATS:
    """Connects, or raises `ConnectError` as soon as every server failed once.

    nats-py's own first connect keeps cycling through the pool (sleeping between rounds)
    until its reconnect budget is spent; here the first failure of every server ends it,
    with the server's or the socket's own words. Once connected, reconnects are unlimited:
    a daemon-side restart must not kill a long-running agent.
    """
    urls = [servers] if isinstance(servers, str) else list(servers)
    if not urls:
        raise ValueError("no NATS server given")
    failures: list[str] = []
    all_failed = asyncio.Event()

    async def on_error(err: Exception) -> None:
        if nc.is_connected:
            return
        failures.append(f"{type(err).__name__}: {err}".rstrip(": "))
        if len(failures) >= len(urls):
            all_failed.set()

    kwargs: dict[str, Any] = credentials.connect_kwargs()
    if tls is not None:
        kwargs["tls"] = tls.context()
        if tls.hostname is not None:
            kwargs["tls_hostname"] = tls.hostname
        kwargs["tls_handshake_first"] = tls.handshake_first
    nc = NATS()
    connecting = asyncio.ensure_future(
        nc.connect(
            urls,
            error_cb=on_error,
            name=name or f"fusebox-guard:{tenant}",
            inbox_prefix=inbox_prefix if inbox_prefix is not None else f"_INBOX.{tenant}",
            connect_timeout=max(1, round(connect_timeout_s)),
            max_reconnect_attempts=-1,
            reconnect_time_wait=1,
            dont_randomize=True,
            **kwargs,
        )
    )
    failed = asyncio.ensure_future(all_failed.wait())
    try:
        done, _ = await asyncio.wait(
            {connecting, failed},
            timeout=connect_timeout_s * len(urls) + 1,
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        failed.cancel()
    if connecting in done and connecting.exception() is None:
        return nc
    if connecting in done:
        failures.append(str(connecting.exception()) or type(connecting.exception()).__name__)
    connecting.cancel()
    with contextlib.suppress(BaseException):
        await connecting
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), 1)
    detail = "; ".join(dict.fromkeys(failures)) or f"no answer within {connect_timeout_s} s"
    raise ConnectError(", ".join(urls), detail)


__all__ = ["Credentials", "TLSConfig", "check_id", "connect_nats"]
