"""The values decisions are made of: a job as submitted (``JobRequest``) and what to do with it
(``Decision``). Pure data: the protocol builds requests from the hook's JSON, the policy turns
them into decisions, the simulator builds both from traces."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

# job_desc fields the hook may write, and what their values may look like.
WRITABLE_FIELDS = {
    "tres_per_node": re.compile(r"^[A-Za-z0-9_:/,.\-]*$"),
    "tres_per_job": re.compile(r"^[A-Za-z0-9_:/,.\-]*$"),
    "features": re.compile(r"^[A-Za-z0-9_&|()\[\]*,.\-]*$"),
    "exc_nodes": re.compile(r"^[A-Za-z0-9_,\[\]\-]*$"),
    "admin_comment": re.compile(r"^gpushare:v\d+:[A-Za-z0-9_:=+.,\-]*$"),
    # The nice adjustment (signed integer), added by the hook to the job's own nice.
    "nice": re.compile(r"^-?[0-9]{1,7}$"),
}
# What a kept job may get: its tag, and its place in the queue (the SJF lever).
KEEP_WRITABLE = frozenset({"admin_comment", "nice"})


# An array whose indices cannot be read counts as this many tasks (more than fit on any GPU).
MANY_ARRAY_TASKS = 1_000_000


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
    tres_freq: str = ""  # --gpu-freq arrives as "gpu:<value>"
    features: str = ""
    prefer: str = ""  # --prefer: features Slurm tries in place of the constraint
    exc_nodes: str = ""
    req_nodes: str = ""  # --nodelist/-w
    reservation: str = ""
    # How it was submitted: a batch script (sbatch), or an allocation without one (srun, salloc).
    batch: bool = True
    # Of an array job (one decision for all its tasks): how many tasks may run at once (its
    # indices, bounded by a %limit); None for any other job.
    array_tasks: int | None = None
    het_offset: int | None = None  # component of a heterogeneous job
    steps_ask_gpus: bool = False  # the script's srun steps ask for GPUs themselves
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
    args_digest: str = ""  # the script's arguments
    name_digest: str = ""

    @property
    def array(self) -> bool:
        return self.array_tasks is not None

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
        if self.action == "keep" and set(self.writes) - KEEP_WRITABLE:
            raise ValueError("a keep decision writes at most its admin_comment tag and nice")
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
