"""Job fingerprints: keyed digests that let a job find its own history without storing it.

A job is recognised by HMAC-SHA256 digests under a site secret, never by its text: the script,
job name, model name or hyper-parameters are digested here and go no further. Keys, most
specific first:

1. ``exact``: user + digest of the *normalised* script (comments, blank lines, trailing and
   repeated whitespace and the ``#SBATCH`` lines that change between resubmissions --
   ``--job-name``, ``--output``, ``--error``, ``--comment`` -- are dropped first, so an
   edited comment or a renamed log file keeps the key) + digest of the script's arguments
   (``argmem.sh 2000`` and ``argmem.sh 40000`` are different work). The working directory is
   not part of it: the same script and arguments resubmitted elsewhere are the same work;
2. ``name``: user + digest of the job name;
3. ``user``: the user alone (the coarsest fallback).

Only ``exact`` sizes a share (``JobKeys.sizing_keys``): a name or a user says nothing about the
memory of *this* work. The coarser keys group records for reports and class priors.

The secret lives in a file of mode 0600, created on first use with ``os.open(..., 0o600)``
(never world-readable, not even for an instant). Without the secret nobody can test a guessed
script against a stored digest.

Usage::

    fp = Fingerprinter.from_file("/etc/slurm-gpushare/secret")
    keys = fp.job_keys(user="alice", script=script_text, name="train")
    # or, from the digests the daemon already holds (JobRequest.script_digest / name_digest):
    keys = fp.keys_from_digests("alice", script_digest, name_digest)
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

SECRET_BYTES = 32
KEYS_REMEMBERED = 4096  # Fingerprinter.keys_from_digests' memo
# HMAC-SHA256's pads (RFC 2104): the key XOR 0x36 starts the inner hash, XOR 0x5c the outer.
_INNER_PAD = bytes(x ^ 0x36 for x in range(256))
_OUTER_PAD = bytes(x ^ 0x5C for x in range(256))
# Key kinds in order of specificity; ``JobKeys.as_list`` follows this order.
KEY_KINDS = ("exact", "name", "user")

# #SBATCH options whose value changes between resubmissions without changing the job.
_VOLATILE_SBATCH = re.compile(
    r"^#sbatch\s+(--job-name|--output|--error|--comment|-j|-o|-e)(\s|=|$)", re.IGNORECASE
)
_SBATCH = re.compile(r"^#sbatch\b", re.IGNORECASE)


class SecretError(RuntimeError):
    """The site secret cannot be read or created safely."""


def load_or_create_secret(path: str | os.PathLike) -> bytes:
    """Read the site secret, creating it (mode 0600, parents 0700) if it does not exist."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # created by a concurrent first use: read theirs
            return load_or_create_secret(path)
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(SECRET_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        data = path.read_bytes()
    except OSError as exc:
        raise SecretError(f"cannot read secret {path}: {exc.strerror}") from None
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise SecretError(f"secret {path} has mode {mode:04o}; it must be 0600")
    if len(data) < 16:
        raise SecretError(f"secret {path} is too short ({len(data)} bytes)")
    return data


def normalise_script(script: str) -> str:
    """The part of a job script that identifies the job, in a canonical form.

    Shebang and ``#SBATCH`` lines are kept (resources belong to the job), other comments and
    blank lines go, whitespace is collapsed, and the volatile ``#SBATCH`` options are dropped.
    """
    out = []
    for number, raw in enumerate(script.replace("\r\n", "\n").split("\n")):
        line = " ".join(raw.split())
        if not line:
            continue
        if line.startswith("#"):
            if number == 0 and line.startswith("#!"):
                out.append(line)
            elif _SBATCH.match(line) and not _VOLATILE_SBATCH.match(line):
                out.append(line)
            continue
        out.append(line)
    return "\n".join(out)


@dataclass(frozen=True)
class JobKeys:
    """A job's fingerprint keys (hex digests); empty string where the input was missing."""

    exact: str = ""
    name: str = ""
    user: str = ""

    def sizing_keys(self) -> list[str]:
        """The keys whose history may size a share: the same script with the same arguments
        (a job name never sizes one). Position 0 is always that key, so a summary's
        ``matched_key`` says it matched by script."""
        return [self.exact] if self.exact else []

    def as_list(self) -> list[str]:
        """Non-empty keys, most specific first (the order ``Store.history`` expects)."""
        return [k for k in (self.exact, self.name, self.user) if k]


class Fingerprinter:
    """Keyed digests under one site secret."""

    def __init__(self, secret: bytes):
        if len(secret) < 16:
            raise SecretError("secret too short")
        # HMAC's two hashes with the padded key already absorbed: each digest copies them
        # (OpenSSL 3 spends most of a one-shot HMAC of a short message setting up the key).
        key = (hashlib.sha256(secret).digest() if len(secret) > 64 else secret).ljust(64, b"\0")
        self._inner = hashlib.sha256(key.translate(_INNER_PAD))
        self._outer = hashlib.sha256(key.translate(_OUTER_PAD))
        # keys_from_digests' answers: digests in, keyed digests out (nothing of a script's
        # text); resubmissions of one script ask the same question, three HMACs each time.
        self._keys: dict[tuple[str, str, str, str], JobKeys] = {}

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Fingerprinter":
        return cls(load_or_create_secret(path))

    def _mac(self, domain: str, *parts: str) -> str:
        # Domain separation and length-prefixed parts: ("ab","c") and ("a","bc") differ.
        message = [domain.encode()]
        for part in parts:
            data = part.encode("utf-8", "surrogatepass")
            message += (len(data).to_bytes(8, "big"), data)
        # HMAC-SHA256 from the prepared hashes: the same digest as hmac.new(...).update(...).
        inner = self._inner.copy()
        inner.update(b"".join(message))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()

    def digest(self, kind: str, text: str) -> str:
        """Digest of a script (normalised first) or a job name; the daemon's ``digest`` hook."""
        if kind == "script":
            return self._mac("script", normalise_script(text))
        if kind == "name":
            return self._mac("name", text.strip())
        if kind == "args":
            return self._mac("args", text)
        raise ValueError(f"unknown digest kind {kind!r}")

    def keys_from_digests(self, user: str, script_digest: str = "",
                          name_digest: str = "", args_digest: str = "") -> JobKeys:
        """Fingerprint keys from a user and the digests ``digest`` produced."""
        question = (user, script_digest, name_digest, args_digest)
        keys = self._keys.get(question)
        if keys is None:
            keys = self._keys_from_digests(*question)
            if len(self._keys) >= KEYS_REMEMBERED:
                self._keys.clear()  # bounded; rebuilt from the next requests
            self._keys[question] = keys
        return keys

    def _keys_from_digests(self, user: str, script_digest: str, name_digest: str,
                           args_digest: str) -> JobKeys:
        # Without arguments the key is the one jobs without arguments always had.
        script_parts = (script_digest, args_digest) if args_digest else (script_digest,)
        return JobKeys(
            exact=self._mac("key:exact", user, *script_parts) if user and script_digest else "",
            name=self._mac("key:name", user, name_digest) if user and name_digest else "",
            user=self._mac("key:user", user) if user else "",
        )

    def job_keys(self, user: str, script: str = "", name: str = "",
                 args: "list[str] | tuple[str, ...]" = ()) -> JobKeys:
        """Fingerprint keys straight from the texts (which are not kept); ``args`` are the
        script's arguments (argv without the script's path)."""
        return self.keys_from_digests(
            user,
            self.digest("script", script) if script else "",
            self.digest("name", name) if name else "",
            self.digest("args", "\0".join(args)) if args else "",
        )
