"""The hook <-> daemon wire protocol: one JSON object per line, both ways.

Request ``{"v": 1, "op": "decide", "job": {...}}``; the job object carries the job_desc fields
the hook can read, under their job_desc names (see ``JOB_FIELDS``). The script, job name and
comment travel only to be digested or scanned for tokens: ``JobRequest`` keeps keyed digests and
flags, never the text.

Reply ``{"v": 1, "ok": true, "decision": {...}}`` or ``{"v": 1, "ok": false, "error": "..."}``.
A decide request with ``"brief": true`` (the hook's) gets the decision without its reason and
details (``reply_ok``).
A decision's ``writes`` maps job_desc field names to the strings the hook must write; the hook
accepts only the fields in ``WRITABLE_FIELDS``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping

from slurm_gpushare import PROTOCOL_VERSION
from slurm_gpushare.core.types import (  # noqa: F401 -- the wire's types
    MANY_ARRAY_TASKS, WRITABLE_FIELDS, Decision, JobRequest)

# Slurm's "unset" markers as the Lua plugin pushes them (lua numbers are doubles).
NO_VAL = 0xFFFFFFFE
NO_VAL16 = 0xFFFE
INFINITE = 0xFFFFFFFF
INFINITE16 = 0xFFFF

STRING_FIELDS = (
    "user", "account", "partition", "qos", "tres_per_job", "tres_per_node", "tres_per_socket",
    "tres_per_task", "cpus_per_tres", "mem_per_tres", "tres_freq", "features", "prefer",
    "exc_nodes", "script", "name", "comment", "req_nodes", "reservation", "array_inx",
    "script_digest",
)
NUMBER_FIELDS = (
    "uid", "time_limit", "min_nodes", "max_nodes", "num_tasks", "shared", "ntasks_per_tres",
    "het_job_offset",
)
# ``argv``: the script's arguments (a list of strings, digested only); ``batch``: whether the
# job came with a script (sbatch) or is an allocation (srun, salloc). Older hooks send neither:
# a job with a script is then a batch job.
JOB_FIELDS = STRING_FIELDS + NUMBER_FIELDS + ("argv", "batch")

# srun options on one command line that ask a step for whole GPUs, which a share cannot give,
# or for something per GPU (srun refuses such a step in a job that holds shards, not GPUs).
_STEP_GPU_OPTION = re.compile(
    r"^\s*(?:[^#]*[\s;&|(])?srun\b.*\s(?:--gres[= ]\S*gpu|--gpus(?:-per-\w+)?[= ]|-G\s*\d"
    r"|--(?:cpus|mem|ntasks)-per-gpu[= ]|--tres-per-task[= ]\S*gpu)")
_COMMENT = re.compile(r"(^|\s)#.*")


def steps_ask_for_gpus(script: str) -> bool:
    """Whether a script runs ``srun`` steps that ask for GPUs themselves (--gres=gpu, --gpus,
    -G, --gpus-per-*, --tres-per-task=gres/gpu) or for something per GPU (--cpus-per-gpu,
    --mem-per-gpu, --ntasks-per-gpu): such steps need the job to hold whole GPUs."""
    if not script or "srun" not in script:
        return False  # most scripts, whatever their size, in one scan
    # Lines continued with a backslash are one command (options often follow `srun \`).
    code = script.replace("\\\r\n", " ").replace("\\\n", " ")
    return any(_STEP_GPU_OPTION.search(_COMMENT.sub("", line))  # comments say nothing
               for line in code.split("\n") if "srun" in line)


# Names Slurm gives jobs that were not named (sbatch reading stdin, --wrap, salloc/srun shells):
# they would make unrelated jobs look like one, so they form no name key.
GENERIC_JOB_NAMES = frozenset({"", "sbatch", "wrap", "bash", "sh", "interactive", "salloc"})


class ProtocolError(ValueError):
    """A request that does not follow the protocol; the reply says why."""


def _unset(value: float | None, *markers: int) -> float | None:
    if value is None or value in markers or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


# Numbers the hook sends are Slurm's uint32 fields (uid, time limit, counts) or their markers.
MAX_FIELD_NUMBER = 2**32


def _check_number(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"job.{name} must be a number")
    if not math.isfinite(value) or not 0 <= value <= MAX_FIELD_NUMBER:
        raise ProtocolError(f"job.{name} is out of range")
    return value


_FIELD_IS_STRING = {**dict.fromkeys(STRING_FIELDS, True), **dict.fromkeys(NUMBER_FIELDS, False)}


def _job_fields(job: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """The job's string fields ("" where absent) and number fields (None where absent), each
    checked. One pass over what the hook sent (it sends only the fields that are set)."""
    strings, numbers = dict.fromkeys(STRING_FIELDS, ""), dict.fromkeys(NUMBER_FIELDS)
    for name, value in job.items():
        is_string = _FIELD_IS_STRING.get(name)
        if is_string is None or value is None:
            continue  # not a job field (argv, batch: read below), or unset
        if is_string:
            if not isinstance(value, str):
                raise ProtocolError(f"job.{name} must be a string")
            strings[name] = value
        else:
            numbers[name] = _check_number(name, value)
    return strings, numbers


# Limits of a request line, checked before it is decoded (a line is at most
# max_request_bytes): how deeply objects and arrays may nest, how long a number may be.
MAX_DEPTH = 8
MAX_NUMBER_CHARS = 32
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_INNERMOST = re.compile(rb"\[\]|\{\}")
_OP = re.compile(rb'"op"\s*:\s*"([a-z_-]{1,16})"')
_RID = re.compile(rb'"rid"\s*:\s*(\d{1,15}|"[A-Za-z0-9_.:-]{1,64}")')


def nesting_depth_exceeds(line: bytes, limit: int = MAX_DEPTH) -> bool:
    """True if the JSON text nests objects/arrays deeper than ``limit`` (strings ignored).
    Runs at C speed: innermost bracket pairs are removed ``limit`` times; what is left is too
    deep (or unbalanced, which the decoder refuses anyway)."""
    if line.count(b"{") + line.count(b"[") <= limit:
        return False  # fewer opening brackets (strings included) than levels: the usual case
    brackets = _STRING.sub(b"", line).translate(None, _NOT_BRACKET)
    for _ in range(limit):
        if not brackets:
            return False
        brackets, removed = _INNERMOST.subn(b"", brackets)
        if not removed:
            return True
    return bool(brackets)


def peek_op(line: bytes) -> str | None:
    """The op named in a raw request line, found without decoding it (None if absent)."""
    match = _OP.search(line)
    return match.group(1).decode() if match else None


def check_rid(rid: Any) -> int | str | None:
    """A request id worth echoing: a small non-negative integer or a short token."""
    if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid < 2**53:
        return rid
    if isinstance(rid, str) and re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", rid):
        return rid
    return None


def peek_rid(line: bytes) -> int | str | None:
    """The request id of a raw line that cannot be decoded, so its error reply can carry it."""
    match = _RID.search(line)
    if not match:
        return None
    text = match.group(1).decode()
    return check_rid(text.strip('"') if text.startswith('"') else int(text))


def _refuse_constant(name: str):
    raise ProtocolError(f"{name} is not a number this protocol accepts")


def _finite_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise ProtocolError("number too long")
    value = float(text)
    if not math.isfinite(value):
        raise ProtocolError("number out of range")
    return value


def _short_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise ProtocolError("number too long")
    return int(text)


# One decoder for every request (json.loads with options would build one per call).
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float,
                            parse_int=_short_int)


def decode_line(line: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """Decode one request line: nesting checked first, numbers finite and short. Raises
    ProtocolError for anything else, never RecursionError or OverflowError."""
    if nesting_depth_exceeds(line, max_depth):
        raise ProtocolError(f"request nests deeper than {max_depth} levels")
    try:
        text = line.decode(json.detect_encoding(line), "surrogatepass")
        return _DECODER.decode(text)
    except ProtocolError:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ProtocolError("request is not valid JSON") from None


# A memory hint above this (1 PiB) is a typo, not a GPU job.
MAX_HINT_MIB = 1024**3


def parse_comment(comment: str, opt_out_token: str, mem_hint_token: str) -> tuple[bool, int | None]:
    """Find the opt-out and memory-hint tokens in a job comment.

    Tokens are whitespace- or comma-separated; ``gpushare:mem=12G`` (units K/M/G/T, default M).
    """
    opt_out, hint = False, None
    if not comment:
        return opt_out, hint
    for word in re.split(r"[\s,;]+", comment or ""):
        if word == opt_out_token:
            opt_out = True
        elif word.startswith(mem_hint_token):
            match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGTkmgt]?)i?[Bb]?", word[len(mem_hint_token):])
            if match:
                scale = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2, "": 1}
                mib = float(match.group(1)[:MAX_NUMBER_CHARS]) * scale[match.group(2).lower()]
                if not math.isfinite(mib) or mib > MAX_HINT_MIB or len(match.group(1)) > 16:
                    raise ProtocolError("memory hint out of range")
                hint = int(math.ceil(mib))
    return opt_out, hint


def parse_request(message: Any, *, opt_out_token: str = "gpushare=off",
                  mem_hint_token: str = "gpushare:mem=", digest=None,
                  script_steps=None) -> tuple[str, Any]:
    """Validate a decoded request. Returns ``(op, payload)``; raises ProtocolError.

    For ``decide`` the payload is a JobRequest; ``digest(kind, text)`` turns the script and name
    into keyed digests (the texts go no further than that call). ``script_steps(digest)``
    answers, for a job sent with its script's digest in place of the script, what the script
    said (whether its srun steps ask for GPUs); without it such a job reads as having no steps.
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
    strings, numbers = _job_fields(job)
    if numbers["uid"] is None:
        raise ProtocolError("job.uid is required")
    opt_out, hint = parse_comment(strings["comment"], opt_out_token, mem_hint_token)
    argv = job.get("argv") or []
    if isinstance(argv, dict):  # Lua tables with holes encode as objects
        argv = [argv[k] for k in sorted(argv, key=lambda k: int(k) if str(k).isdigit() else 0)]
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ProtocolError("job.argv must be a list of strings")
    batch = job.get("batch")
    if batch is None:
        batch = bool(strings["script"])
    if not isinstance(batch, bool):
        raise ProtocolError("job.batch must be true or false")

    def count(name, *markers):
        value = _unset(numbers[name], NO_VAL, NO_VAL16, INFINITE, INFINITE16, *markers)
        return None if value is None else int(value)

    shared = count("shared")
    script = strings["script"]
    script_digest = (digest("script", script) if digest and script
                     else _script_digest(strings["script_digest"]))
    steps_ask_gpus = (script_steps(script_digest) if script_steps and script_digest and not script
                      else steps_ask_for_gpus(script))
    request = JobRequest(
        uid=int(numbers["uid"]),
        user=strings["user"], account=strings["account"], partition=strings["partition"],
        qos=strings["qos"],
        tres_per_job=strings["tres_per_job"], tres_per_node=strings["tres_per_node"],
        tres_per_socket=strings["tres_per_socket"], tres_per_task=strings["tres_per_task"],
        cpus_per_tres=strings["cpus_per_tres"], mem_per_tres=strings["mem_per_tres"],
        ntasks_per_tres=count("ntasks_per_tres"), tres_freq=strings["tres_freq"],
        features=strings["features"], prefer=strings["prefer"], exc_nodes=strings["exc_nodes"],
        req_nodes=strings["req_nodes"], reservation=strings["reservation"],
        batch=batch,
        array_tasks=array_task_count(strings["array_inx"]) if strings["array_inx"] else None,
        het_offset=count("het_job_offset"),
        steps_ask_gpus=steps_ask_gpus,
        time_limit_min=count("time_limit"),
        min_nodes=count("min_nodes"), max_nodes=count("max_nodes"), num_tasks=count("num_tasks"),
        # job_desc.shared: 0 = --exclusive, 2 = --exclusive=user, 3 = --exclusive=mcs.
        exclusive=shared in (0, 2, 3),
        opt_out=opt_out, mem_hint_mib=hint,
        script_digest=script_digest,
        # argv[0] is the script's path as typed (it may change between resubmissions); the
        # arguments after it are part of the work.
        args_digest=digest("args", "\0".join(argv[1:])) if digest and argv[1:] else "",
        name_digest=(digest("name", strings["name"])
                     if digest and strings["name"].strip() not in GENERIC_JOB_NAMES else ""),
    )
    return op, request


def array_task_count(array_inx: str) -> int:
    """How many tasks of an array may run at once: its indices (``0-15``, ``1,3,5``,
    ``0-15:4``, ``1-3,5-6``), bounded by a ``%N`` limit; ``MANY_ARRAY_TASKS`` where the text
    cannot be read."""
    spec, _, limit = array_inx.strip().partition("%")
    count = 0
    try:
        for part in spec.split(","):
            span, _, step = part.partition(":")
            first, _, last = span.partition("-")
            low, high = int(first), int(last or first)
            stride = int(step or 1)
            if low < 0 or high < low or stride < 1:
                return MANY_ARRAY_TASKS
            count += (high - low) // stride + 1
        if limit:
            count = min(count, max(1, int(limit)))
    except ValueError:
        return MANY_ARRAY_TASKS
    return min(count, MANY_ARRAY_TASKS)


def _script_digest(text: str) -> str:
    """A digest the hook kept from an earlier reply (in place of the script it stands for)."""
    if text and not re.fullmatch(r"[0-9a-f]{64}", text):
        raise ProtocolError("job.script_digest must be 64 hex digits")
    return text


def reply_ok(decision: Decision | None = None, *, brief: bool = False,
             **extra) -> dict[str, Any]:
    """A reply; ``brief``: the decision as far as the hook reads it (``"brief": true`` in a
    decide request): action, code, id and writes, without the reason and details that
    ``explain`` and the log carry -- less for slurmctld to decode under its locks."""
    out: dict[str, Any] = {"v": PROTOCOL_VERSION, "ok": True}
    if decision is not None:
        out["decision"] = ({"action": decision.action, "code": decision.code,
                            "decision_id": decision.decision_id,
                            "writes": dict(decision.writes)}
                           if brief else decision.to_dict())
    out.update(extra)
    return out


def reply_error(message: str) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "ok": False, "error": message}


# Largest reply line a client reads; a longer one is an unreadable reply, not a memory cost.
MAX_REPLY_BYTES = 1 << 20


def request(socket_path: str | tuple[str, int], message: dict[str, Any],
            timeout: float = 2.0) -> Any:
    """Send one request line to a daemon socket and return its decoded reply line.

    The one client for the CLI, the wrapper, the telemetry agent, tests and benchmarks (the Lua
    hook has its own). ``socket_path`` is a Unix socket's path, or a (host, port) pair for the
    daemon's TCP listener (agents on other hosts). Raises OSError when the socket cannot be
    used, ValueError for an unreadable or oversized reply.
    """
    import socket  # late: the request parsing above needs no sockets

    if isinstance(socket_path, tuple):
        sock = socket.create_connection(socket_path, timeout=timeout)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        sock.settimeout(timeout)
        if not isinstance(socket_path, tuple):
            sock.connect(socket_path)
        try:
            sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")
            refused = None
        except (BrokenPipeError, ConnectionResetError) as exc:
            # The daemon answers a refused peer or an oversized request at once and closes
            # without reading: its answer is the reason to show, if it is there.
            refused = exc
        data = b""
        while not data.endswith(b"\n"):
            if len(data) > MAX_REPLY_BYTES:
                raise ValueError(f"reply larger than {MAX_REPLY_BYTES} bytes")
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                if refused is None:
                    raise
                chunk = b""
            if not chunk:
                break
            data += chunk
    if refused is not None and not data:
        raise refused
    return json.loads(data.decode() or "null")
