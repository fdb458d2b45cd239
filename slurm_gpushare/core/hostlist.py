"""Slurm's hostlist syntax (``gpu-[01-03,07],login1``) and index ranges (``0-2,5``), both ways.

The one implementation for slurm.conf, sacct/squeue node lists, exc_nodes and the simulator.
"""

from __future__ import annotations

import re
from typing import Sequence

# Names one expression may expand to: 2^16, above the node count of the largest Slurm clusters
# (about 10^4 nodes), yet listed in well under a second. Bounds the work a typo such as
# gpu[01-99999999] (or a hostile --nodelist reaching the daemon) can cause.
MAX_HOSTS = 65_536

_BRACKETS = re.compile(r"^(.*?)\[([^\[\]]*)\](.*)$")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


class HostlistError(ValueError):
    """A hostlist or index range that is malformed, reversed or too large."""


def expand_hostlist(text: str) -> list[str]:
    """``gpu-[01-03,07],login1`` -> names (Slurm hostlist syntax; several brackets expand in
    turn, zero padding is kept)."""
    names: list[str] = []
    for part in _split(text):
        _expand(part, text, names)
    return names


def _split(text: str) -> list[str]:
    """The comma-separated parts of ``text``, commas inside brackets kept."""
    parts, start, depth = [], 0, 0
    for i, char in enumerate(text):
        if char in "[]":
            depth += 1 if char == "[" else -1
            if depth not in (0, 1):
                raise HostlistError(f"malformed hostlist {text!r}: unbalanced brackets")
        elif char == "," and not depth:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"malformed hostlist {text!r}: unbalanced brackets")
    return [p for p in parts + [text[start:]] if p]


def _expand(part: str, text: str, names: list[str]) -> None:
    match = _BRACKETS.match(part)
    if not match:
        names.append(part)
        if len(names) > MAX_HOSTS:
            raise HostlistError(f"hostlist {text!r} names more than {MAX_HOSTS} hosts")
        return
    head, ranges, tail = match.groups()
    for low, high, width in _ranges(ranges.split(","), text):
        for number in range(low, high + 1):
            _expand(f"{head}{number:0{width}d}{tail}", text, names)


def _ranges(items: list[str], whole: str) -> list[tuple[int, int, int]]:
    """(low, high, digits) of each item (``0-2``, ``05``); reversed or malformed ones refused."""
    out = []
    for item in items:
        match = _RANGE.fullmatch(item)
        if not match:
            raise HostlistError(f"malformed range {item!r} in {whole!r}")
        low, high = int(match[1]), int(match[2] or match[1])
        if high < low:
            raise HostlistError(f"reversed range {item} in {whole!r}")
        out.append((low, high, len(match[1])))
    return out


def compress_hostlist(names: Sequence[str]) -> str:
    """The reverse of expand_hostlist for names ending in numbers (others listed as they are)."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in names:
        match = re.match(r"^(.*?)(\d+)$", name)
        if match:
            groups.setdefault((match.group(1), len(match.group(2))), []).append(int(match.group(2)))
        else:
            plain.append(name)
    out = list(plain)
    for (prefix, width), numbers in groups.items():
        numbers = sorted(set(numbers))
        if len(numbers) == 1:
            out.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        spans, start, prev = [], numbers[0], numbers[0]
        for number in numbers[1:] + [None]:
            if number is not None and number == prev + 1:
                prev = number
                continue
            spans.append(f"{start:0{width}d}" if start == prev
                         else f"{start:0{width}d}-{prev:0{width}d}")
            if number is not None:
                start = prev = number
        out.append(f"{prefix}[{','.join(spans)}]")
    return ",".join(out)


def expand_ranges(text: str) -> list[int]:
    """``0-2,5`` -> ``[0, 1, 2, 5]`` (GPU indices in ``IDX:`` and array task lists)."""
    out: list[int] = []
    for low, high, _ in _ranges([p for p in (text or "").split(",") if p], text):
        if len(out) + high - low >= MAX_HOSTS:
            raise HostlistError(f"range {text!r} holds more than {MAX_HOSTS} indices")
        out.extend(range(low, high + 1))
    return out
