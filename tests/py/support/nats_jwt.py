"""Operator-mode NATS for the creds-file test: an operator, an account and a user, their
JWTs signed with nkeys (Ed25519), as `nsc` would make them."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _key(prefix: int) -> tuple[Any, bytes]:
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return nkeys.from_seed(bytearray(seed)), seed


def _jwt(issuer: Any, subject: str, name: str, nats: dict[str, Any]) -> str:
    claims: dict[str, Any] = {
        "iat": int(time.time()),
        "iss": issuer.public_key.decode(),
        "sub": subject,
        "name": name,
        "nats": {**nats, "version": 2},
    }
    digest = hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = issuer.sign(f"{head}.{body}".encode())
    return f"{head}.{body}.{_b64(signature)}"


def operator_setup(work: Path) -> tuple[Path, Path, Path]:
    """Writes a server config (operator, memory resolver with the account), a creds
    file of a user of that account, and one of a user of an unknown account."""
    operator, _ = _key(nkeys.PREFIX_BYTE_OPERATOR)
    account, _ = _key(nkeys.PREFIX_BYTE_ACCOUNT)
    stranger, _ = _key(nkeys.PREFIX_BYTE_ACCOUNT)
    limits = {
        "conn": -1,
        "subs": -1,
        "data": -1,
        "payload": -1,
        "imports": -1,
        "exports": -1,
        "wildcards": True,
    }
    operator_jwt = _jwt(operator, operator.public_key.decode(), "op", {"type": "operator"})
    account_jwt = _jwt(
        operator, account.public_key.decode(), "acc", {"type": "account", "limits": limits}
    )
    config = work / "operator.conf"
    config.write_text(
        f'operator: "{operator_jwt}"\nresolver: MEMORY\n'
        f'resolver_preload: {{ {account.public_key.decode()}: "{account_jwt}" }}\n'
    )

    def creds(issuer: Any, name: str) -> Path:
        user, seed = _key(nkeys.PREFIX_BYTE_USER)
        user_jwt = _jwt(
            issuer,
            user.public_key.decode(),
            name,
            {"type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1},
        )
        path = work / f"{name}.creds"
        path.write_text(
            f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{seed.decode()}\n------END USER NKEY SEED------\n"
        )
        return path

    return config, creds(account, "agent"), creds(stranger, "stranger")
