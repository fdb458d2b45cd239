"""The hook <-> daemon wire protocol: one JSON object per line, both ways.

Request ``{"v": 1, "op": "decide", "job": {...}}``; the job object carries the job_desc fields
the hook can read, under their job_desc names (see ``JOB_FIELDS``). The script, job name and
comment travel only to be digested or scanned for tokens: ``JobRequest`` keeps keyed digests and
flags, never the text.

Reply ``{"v": 1, "ok": true, "decision": {...}}`` or ``{"v": 1, "ok": false, "error": "..."}``.
A decision's ``writes`` maps job_desc field names to the strings the hook must write; the hook
accepts only the fields in ``WRITABLE_FIELDS``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from slurm_gpushare import PROTOCOL_VERSION

# Slurm's "unset" markers as the Lua plugin pushes them (lua numbers are doubles).
NO_VAL = 0xFFFFFFFE
NO_VAL16 = 0xFFFE
INFINITE = 0xFFFFFFFF
INFINITE16 = 0xFFFF

# job_desc fields the hook may write, and what their values may look like.
WRITABLE_FIELDS = {
    "tres_per_node": re.compile(r"^[A-Za-z0-9_:/,.\-]*$"),
    "tres_per_job": re.compile(r"^[A-Za-z0-9_:/,.\-]*$"),
    "features": re.compile(r"^[A-Za-z0-9_&|()\[\]*,.\-]*$"),
    "exc_nodes": re.compile(r"^[A-Za-z0-9_,\[\]\-]*$"),
    "admin_comment": re.compile(r"^gpushare:v\d+:[A-Za-z0-9_:=+.,\-]*$"),
}

STRING_FIELDS = (
    "user", "account", "partition", "qos", "tres_per_job", "tres_per_node", "tres_per_socket",
    "tres_per_task", "cpus_per_tres", "mem_per_tres", "features", "exc_nodes", "script", "name",
    "comment",
)
NUMBER_FIELDS = (
    "uid", "time_limit", "min_nodes", "max_nodes", "num_tasks", "shared", "ntasks_per_tres",
)
JOB_FIELDS = STRING_FIELDS + NUMBER_FIELDS

# Names Slurm gives jobs that were not named (sbatch reading stdin, --wrap, salloc/srun shells):
# they would make unrelated jobs look like one, so they form no name key.
GENERIC_JOB_NAMES = frozenset({"", "sbatch", "wrap", "bash", "sh", "interactive", "salloc"})


class ProtocolError(ValueError):
    """A request that does not follow the protocol; the reply says why."""


def _unset(value: float | None, *markers: int) -> float | None:
    if value is None or value in markers or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


@dataclass(frozen=True)
class JobRequest:
    """A job as submitted, reduced to what a decision may use. Holds no script or name text."""

    uid: int
    user: str = ""
    account: str = ""
    partition: str = ""
    qos: str = ""
    tres_per_job: str = ""
    tres_per_node: str = ""
    tres_per_socket: str = ""
    tres_per_task: str = ""
    cpus_per_tres: str = ""
    mem_per_tres: str = ""
    ntasks_per_tres: int | None = None
    features: str = ""
    exc_nodes: str = ""
    time_limit_min: int | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None
    num_tasks: int | None = None
    exclusive: bool = False
    # From the comment, parsed by the daemon (the comment text itself is dropped).
    opt_out: bool = False
    mem_hint_mib: int | None = None
    # Keyed digests (HMAC) filled by the daemon; see fingerprint handling.
    script_digest: str = ""
    name_digest: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    """What to do with one submission. A value: computed without side effects."""

    action: str  # "keep" or "share"
    reason: str  # for people: why, in one sentence
    code: str  # for machines: short reason code, e.g. "no-gpu", "partition-off", "default-share"
    decision_id: str = ""
    writes: Mapping[str, str] = field(default_factory=dict)
    share_gib: int | None = None
    gpu_types: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.action not in ("keep", "share"):
            raise ValueError(f"bad action {self.action!r}")
        if self.action == "keep" and set(self.writes) - {"admin_comment"}:
            raise ValueError("a keep decision writes at most its admin_comment tag")
        for name, value in self.writes.items():
            pattern = WRITABLE_FIELDS.get(name)
            if pattern is None or not isinstance(value, str) or not pattern.match(value):
                raise ValueError(f"invalid write {name}={value!r}")

    @property
    def admin_comment(self) -> str:
        return self.writes.get("admin_comment", "")

    def to_dict(self) -> dict[str, Any]:
        # Built by hand: dataclasses.asdict deep-copies, and this runs on the submit path.
        return {"action": self.action, "reason": self.reason, "code": self.code,
                "decision_id": self.decision_id, "writes": dict(self.writes),
                "share_gib": self.share_gib, "gpu_types": list(self.gpu_types),
                "details": dict(self.details)}


def _get(job: Mapping[str, Any], name: str, kind: type):
    value = job.get(name)
    if value is None:
        return None
    if kind is str:
        if not isinstance(value, str):
            raise ProtocolError(f"job.{name} must be a string")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"job.{name} must be a number")
    return value


def parse_comment(comment: str, opt_out_token: str, mem_hint_token: str) -> tuple[bool, int | None]:
    """Find the opt-out and memory-hint tokens in a job comment.

    Tokens are whitespace- or comma-separated; ``gpushare:mem=12G`` (units K/M/G/T, default M).
    """
    opt_out, hint = False, None
    for word in re.split(r"[\s,;]+", comment or ""):
        if word == opt_out_token:
            opt_out = True
        elif word.startswith(mem_hint_token):
            match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGTkmgt]?)i?[Bb]?", word[len(mem_hint_token):])
            if match:
                scale = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2, "": 1}
                hint = int(math.ceil(float(match.group(1)) * scale[match.group(2).lower()]))
    return opt_out, hint


def parse_request(message: Any, *, opt_out_token: str = "gpushare=off",
                  mem_hint_token: str = "gpushare:mem=", digest=None) -> tuple[str, Any]:
    """Validate a decoded request. Returns ``(op, payload)``; raises ProtocolError.

    For ``decide`` the payload is a JobRequest; ``digest(kind, text)`` turns the script and name
    into keyed digests (the texts go no further than that call).
    """
    if not isinstance(message, dict):
        raise ProtocolError("request must be a JSON object")
    version = message.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version!r} (daemon speaks {PROTOCOL_VERSION})")
    op = message.get("op")
    if op == "ping":
        return op, None
    if op not in ("decide", "explain"):
        raise ProtocolError(f"unknown op {op!r}")
    job = message.get("job")
    if not isinstance(job, dict):
        raise ProtocolError("job must be an object")
    strings = {name: _get(job, name, str) or "" for name in STRING_FIELDS}
    numbers = {name: _get(job, name, float) for name in NUMBER_FIELDS}
    if numbers["uid"] is None:
        raise ProtocolError("job.uid is required")
    opt_out, hint = parse_comment(strings["comment"], opt_out_token, mem_hint_token)

    def count(name, *markers):
        value = _unset(numbers[name], NO_VAL, NO_VAL16, INFINITE, INFINITE16, *markers)
        return None if value is None else int(value)

    shared = count("shared")
    request = JobRequest(
        uid=int(numbers["uid"]),
        user=strings["user"], account=strings["account"], partition=strings["partition"],
        qos=strings["qos"],
        tres_per_job=strings["tres_per_job"], tres_per_node=strings["tres_per_node"],
        tres_per_socket=strings["tres_per_socket"], tres_per_task=strings["tres_per_task"],
        cpus_per_tres=strings["cpus_per_tres"], mem_per_tres=strings["mem_per_tres"],
        ntasks_per_tres=count("ntasks_per_tres"),
        features=strings["features"], exc_nodes=strings["exc_nodes"],
        time_limit_min=count("time_limit"),
        min_nodes=count("min_nodes"), max_nodes=count("max_nodes"), num_tasks=count("num_tasks"),
        # job_desc.shared: 0 = --exclusive, 2 = --exclusive=user, 3 = --exclusive=mcs.
        exclusive=shared in (0, 2, 3),
        opt_out=opt_out, mem_hint_mib=hint,
        script_digest=digest("script", strings["script"]) if digest and strings["script"] else "",
        name_digest=(digest("name", strings["name"])
                     if digest and strings["name"].strip() not in GENERIC_JOB_NAMES else ""),
    )
    return op, request


def reply_ok(decision: Decision | None = None, **extra) -> dict[str, Any]:
    out: dict[str, Any] = {"v": PROTOCOL_VERSION, "ok": True}
    if decision is not None:
        out["decision"] = decision.to_dict()
    out.update(extra)
    return out


def reply_error(message: str) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "ok": False, "error": message}


def request(socket_path: str, message: dict[str, Any], timeout: float = 2.0) -> Any:
    """Send one request line to a daemon socket and return its decoded reply line.

    The one client for the CLI, the telemetry agent, tests and benchmarks (the Lua hook has
    its own). Raises OSError when the socket cannot be used, ValueError for an unreadable reply.
    """
    import socket  # late: the hook-side parsing above needs no sockets

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data.decode() or "null")
