"""Munge credentials: how compute nodes prove to the daemon that a delivery is theirs.

Every Slurm host already runs munged with the site's shared key, and Slurm itself trusts it
between nodes and the controller. A node seals a message by asking munge for a credential
whose payload is the SHA-256 of the message; the daemon asks its own munged to decode it:
munged checks the key (a foreign realm fails), the time-to-live (expired) and replays (a
credential decodes once), and says which uid made it. The daemon then checks that uid (root or
SlurmUser: the prolog/epilog identity) and that the digest matches the message it received.

Through the ``munge``/``unmunge`` tools (in Debian's ``munge`` package, on every Slurm host):
no binding to build, and the same code path an admin can try by hand.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Collection

from slurm_gpushare.slurm import cmd

# munge's own status codes (munge.h) that mean "refuse", named for the log.
STATUS_NAMES = {1: "snafu", 2: "bad-arg", 6: "socket", 8: "bad-cred", 9: "bad-version",
                10: "bad-cipher", 11: "bad-mac", 12: "bad-zip", 13: "bad-realm",
                14: "cred-invalid", 15: "cred-expired", 16: "cred-rewound", 17: "cred-replayed",
                18: "cred-unauthorized"}
DEFAULT_TTL_S = 300


class MungeError(Exception):
    """A credential that must be refused (or munge that cannot be asked); ``reason`` is short."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Credential:
    uid: int
    gid: int
    encode_time: int
    payload: str


def digest(message: dict[str, Any]) -> str:
    """The SHA-256 of a message in canonical JSON (what the credential vouches for)."""
    body = json.dumps(message, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(body.encode()).hexdigest()


def _socket_args(socket: str | None) -> list[str]:
    return [f"--socket={socket}"] if socket else []


def encode(payload: str, *, socket: str | None = None, ttl_s: int = DEFAULT_TTL_S,
           timeout: float = 10.0, uid: int | None = None) -> str:
    """A credential from the local munged carrying ``payload``. ``uid``: the identity to
    encode instead of the caller's (munged grants it to root only; tests of refusals)."""
    uid_args = ["--uid", str(uid)] if uid is not None else []
    try:
        result = cmd.run(["munge", *_socket_args(socket), *uid_args, "--string", payload,
                          "--ttl", str(ttl_s)], timeout=timeout)
    except cmd.SlurmError as exc:
        raise MungeError("munge-unavailable", str(exc)) from None
    if not result.ok:
        raise MungeError("munge-failed", result.message)
    return result.stdout.strip()


def decode(credential: str, *, socket: str | None = None, timeout: float = 10.0) -> Credential:
    """Decode with the local munged; MungeError for anything munged does not vouch for."""
    if not isinstance(credential, str) or not credential.startswith("MUNGE:") \
            or len(credential) > 4096 or "\n" in credential:
        raise MungeError("bad-cred", "not a munge credential")
    try:
        result = cmd.run(["unmunge", *_socket_args(socket), "--numeric"], input=credential,
                         timeout=timeout)
    except cmd.SlurmError as exc:
        raise MungeError("munge-unavailable", str(exc)) from None
    meta = dict(re.findall(r"^([A-Z_]+):\s*(\S*)$", result.stdout, re.M))
    if result.returncode != 0:
        status = int(meta.get("STATUS", result.returncode) or result.returncode)
        raise MungeError(STATUS_NAMES.get(status, f"status-{status}"), result.message)
    payload = result.stdout.split("\n\n", 1)[1] if "\n\n" in result.stdout else ""
    return Credential(uid=int(meta["UID"]), gid=int(meta["GID"]),
                      encode_time=int(meta["ENCODE_TIME"]), payload=payload)


def seal(message: dict[str, Any], *, socket: str | None = None,
         ttl_s: int = DEFAULT_TTL_S, uid: int | None = None) -> dict[str, Any]:
    """The message with an ``auth`` field: a credential vouching for the rest of it."""
    body = {k: v for k, v in message.items() if k != "auth"}
    return {**body, "auth": encode(digest(body), socket=socket, ttl_s=ttl_s, uid=uid)}


def verify(message: dict[str, Any], allowed_uids: Collection[int], *,
           socket: str | None = None) -> Credential:
    """Check a sealed message; returns its credential or raises MungeError (never trusts the
    network: no auth, a foreign key, a replay, an expired credential, another uid or a message
    changed after sealing are all refused)."""
    credential = decode(message.get("auth"), socket=socket)
    if credential.uid not in allowed_uids:
        raise MungeError("uid-refused", f"uid {credential.uid} may not deliver")
    body = {k: v for k, v in message.items() if k != "auth"}
    if credential.payload != digest(body):
        raise MungeError("digest-mismatch", "the message is not the one that was sealed")
    return credential
