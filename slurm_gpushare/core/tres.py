"""Parsing of Slurm TRES request strings (``tres_per_node``, ``tres_per_job``, ...).

Mirrors ``slurm_gpushare/lua/gpushare_tres.lua`` (the hook's copy) and Slurm's own reading of these strings
in ``src/common/gres.c`` (``_get_next_gres``): comma-separated tokens ``[gres:|gres/]name[:type][:count]``, or ``...[=count]`` (23.02+
``tres_per_task``: ``cpu=2,gres/gpu=1``).
Slurm 22.05 clients send ``gres:gpu:1``; 23.11+ send ``gres/gpu:1``; older
tools may send a bare ``gpu:1``. A count may carry a K/M/G suffix (``shard:2K``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_SUFFIX = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_COUNT = re.compile(r"^(\d+)([kmgtKMGT]?)$")


class TresError(ValueError):
    """A TRES string that Slurm itself would not accept."""


@dataclass(frozen=True)
class TresToken:
    prefix: str  # "gres:", "gres/" or "" (kept so a rewrite can use the same spelling)
    name: str  # "gpu", "shard", "mps", "nic", ...
    type: str | None  # "a100" in gres:gpu:a100:1
    count: int
    count_sep: str = ":"  # "=" in 23.02+'s tres_per_task ("cpu=2,gres/gpu=1")

    def render(self) -> str:
        head = ":".join([self.name] + ([self.type] if self.type else []))
        return f"{self.prefix}{head}{self.count_sep}{self.count}"


def _parse_count(text: str) -> int:
    match = _COUNT.match(text)
    if not match:
        raise TresError(f"bad count {text!r}")
    return int(match.group(1)) * _SUFFIX[match.group(2).lower()]


def parse(tres: str | None) -> list[TresToken]:
    """Split a TRES request string into tokens; ``None``/empty gives ``[]``."""
    if not tres:
        return []
    return list(_parse(tres))


@functools.lru_cache(maxsize=4096)  # every decision parses the same few strings again
def _parse(tres: str) -> tuple[TresToken, ...]:
    tokens = []
    for raw in tres.split(","):
        raw = raw.strip()
        if not raw:
            continue
        prefix = ""
        for candidate in ("gres:", "gres/"):
            if raw.startswith(candidate):
                prefix, raw = candidate, raw[len(candidate):]
                break
        # 23.02+ writes an explicit count after "=" ("gres/gpu:a100=1", "cpu=2"),
        # as slurm_get_next_tres (src/common/slurm_protocol_defs.c) reads it.
        raw, equals, explicit = raw.rpartition("=") if "=" in raw else ("", "", raw)
        raw = raw if equals else explicit
        parts = raw.split(":")
        if not parts[0]:
            raise TresError(f"empty name in {tres!r}")
        name, rest = parts[0], parts[1:]
        if len(rest) > (1 if equals else 2):
            raise TresError(f"too many fields in {tres!r}")
        count, gtype = 1, None
        if equals:
            gtype, count = (rest[0] if rest else None), _parse_count(explicit)
        elif len(rest) == 2:
            gtype, count = rest[0], _parse_count(rest[1])
        elif len(rest) == 1:
            # gpu:2 (count) or gpu:a100 (type, count 1) -- as gres.c decides by digits.
            if _COUNT.match(rest[0]):
                count = _parse_count(rest[0])
            else:
                gtype = rest[0]
        tokens.append(TresToken(prefix, name, gtype or None, count, "=" if equals else ":"))
    return tuple(tokens)


def find(tokens: list[TresToken], name: str) -> list[TresToken]:
    return [t for t in tokens if t.name == name]


def replace(tres: str | None, name: str, new: TresToken | None) -> str:
    """Return ``tres`` with every ``name`` token removed and ``new`` (if any) put first."""
    kept = [t.render() for t in parse(tres) if t.name != name]
    if new is not None:
        kept.insert(0, new.render())
    return ",".join(kept)
