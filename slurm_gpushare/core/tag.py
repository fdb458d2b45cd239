"""The AdminComment tag: the one codec for what the hook writes into a job's AdminComment.

``gpushare:v1:<action>:id=<decision id>:[shard=N:|mps=N:mem=MiB:]types=a+b:class=K:why=<code>``

Written by the policy (through the hook), read back from scontrol/sacct by the agent, the
daemon's learning and cluster view, the accounting report and ``explain``. Slurm keeps it
(users cannot set AdminComment), so it survives the daemon and is versioned like jobstats'
``JS1:``. Unknown fields of a newer writer are kept, not rejected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

# Bump the version when the layout changes; readers ignore tags of other versions' fields.
TAG_PREFIX = "gpushare:v1:"
# Field values are restricted to what the hook's admin_comment pattern accepts.
_TAG = re.compile(r"^gpushare:v(\d+):(share|keep)((?::[a-z_]+=[A-Za-z0-9_+.,\-]*)*)$")
_INT_FIELDS = {"shard": "shard", "mps": "mps", "mem": "mem_mib", "class": "job_class"}


@dataclass(frozen=True)
class Tag:
    action: str  # "share" or "keep"
    why: str  # the decision's reason code
    decision_id: str = ""
    shard: int | None = None  # GiB (shards) of a gres/shard share
    mps: int | None = None  # percent of a gres/mps share
    mem_mib: int | None = None  # the memory limit of an MPS share
    types: tuple[str, ...] = ()  # GPU types the share may run on
    job_class: int | None = None  # interference class
    version: int = 1
    extra: Mapping[str, str] = field(default_factory=dict)  # fields this reader does not know

    @property
    def shared(self) -> bool:
        return self.action == "share"

    @property
    def limit_mib(self) -> float | None:
        """The memory a share may use: an MPS share's limit, or its shards x 1 GiB."""
        if not self.shared:
            return None
        if self.mem_mib is not None:
            return float(self.mem_mib)
        return float(self.shard) * 1024 if self.shard is not None else None

    def encode(self) -> str:
        fields: list[tuple[str, object]] = [("id", self.decision_id or "-")]
        for key in ("shard", "mps"):
            if getattr(self, key) is not None:
                fields.append((key, getattr(self, key)))
        if self.types:
            fields.append(("types", "+".join(self.types)))
        if self.mem_mib is not None:
            fields.append(("mem", self.mem_mib))
        if self.job_class is not None:
            fields.append(("class", self.job_class))
        fields += list(self.extra.items()) + [("why", self.why)]
        return f"{TAG_PREFIX}{self.action}:" + ":".join(f"{k}={v}" for k, v in fields)

    @staticmethod
    def with_id(text: str, old_id: str, new_id: str) -> str | None:
        """``text``, an encoded tag of decision ``old_id``, naming decision ``new_id`` instead
        (a decision reused for another job), without decoding it: this runs on the hook's
        request path. None where ``text`` is not a tag that names ``old_id`` exactly once."""
        field_ = f":id={old_id}:"
        if not old_id or not text.startswith(TAG_PREFIX) or text.count(field_) != 1:
            return None
        return text.replace(field_, f":id={new_id}:", 1)

    @staticmethod
    def action_of(text: str | None) -> str | None:
        """``decode(text).action`` ("share" or "keep"), or None for anything that is not a
        well-formed tag, without building the tag (reports ask it of a million jobs)."""
        match = _TAG.match((text or "").strip())
        return match.group(2) if match else None

    @classmethod
    def decode(cls, text: str | None) -> "Tag | None":
        """The tag in an AdminComment, or None for anything that is not a well-formed tag."""
        match = _TAG.match((text or "").strip())
        if not match:
            return None
        values: dict[str, object] = {}
        extra: dict[str, str] = {}
        for item in match.group(3).split(":")[1:]:
            key, _, value = item.partition("=")
            if key in _INT_FIELDS:
                if value.isdigit():
                    values[_INT_FIELDS[key]] = int(value)
            elif key == "id":
                values["decision_id"] = "" if value == "-" else value
            elif key == "types":
                values["types"] = tuple(t for t in value.split("+") if t)
            elif key == "why":
                values["why"] = value
            else:
                extra[key] = value
        return cls(action=match.group(2), why=str(values.pop("why", "")),
                   version=int(match.group(1)), extra=extra, **values)
