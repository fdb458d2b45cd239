"""Slurm's hostlist syntax (``gpu-[01-03,07],login1``) and index ranges (``0-2,5``), both ways.

The one implementation for slurm.conf, sacct/squeue node lists, exc_nodes and the simulator.
"""

from __future__ import annotations

import re
from typing import Sequence


def expand_hostlist(text: str) -> list[str]:
    """``gpu-[01-03,07],login1`` -> names (Slurm hostlist syntax; several brackets expand in
    turn, zero padding is kept)."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]*(?:\[[^\]]*\][^,\[]*)*", text):
        if not part:
            continue
        match = re.match(r"^(.*?)\[([^\]]*)\](.*)$", part)
        if not match:
            names.append(part)
            continue
        head, ranges, tail = match.groups()
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            if high:
                width = len(low)
                for number in range(int(low), int(high) + 1):
                    names += expand_hostlist(f"{head}{number:0{width}d}{tail}")
            else:
                names += expand_hostlist(f"{head}{low}{tail}")
    return names


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
    for part in (text or "").split(","):
        if part:
            low, _, high = part.partition("-")
            out.extend(range(int(low), int(high or low) + 1))
    return out
