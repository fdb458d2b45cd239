"""Which Slurm a site runs, and what changed between the versions the product supports.

Sites run Slurm 22.05 (Debian bookworm) to 24.11 (Debian trixie) and later. What differs for
slurm-gpushare (docs/admin-guide.md has the table; each entry cites Slurm's NEWS):

- ``gres/gpumem`` and ``gres/gpuutil`` in sacct's ``TRESUsageInMax/Ave`` (23.02, with
  ``AutoDetect=nvml``): a second source of per-job GPU memory, measured per process;
- ``scontrol --json`` (23.02); sacct/squeue/sinfo ``--json`` layout v0.0.38 (22.05) or
  v0.0.39+ (23.02 on): the parsers read both;
- clients send ``gres/gpu:1`` in ``tres_per_*`` from 23.11 (``gres:gpu:1`` before);
- a GPU could be allocated whole and as shards at the same time until 23.11.5 (NEWS 23.11.5:
  "Fix issue where you could have a gpu allocated as well as a shard on that gpu allocated at
  the same time.", SchedMD bug 19110, commit 30eacbe571 "Fix bad deallocation of shared gres").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_gpushare.slurm import cmd

OLDEST_SUPPORTED = (22, 5)  # gres/shard first appeared in 22.05


@dataclass(frozen=True, order=True)
class SlurmVersion:
    major: int
    minor: int
    micro: int = 0

    @classmethod
    def parse(cls, text: str | None) -> "SlurmVersion | None":
        """``22.05.8``, ``slurm-wlm 22.05.8``, ``slurm 24.11.5``, ``24.11.5-1`` -> version."""
        match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
        if not match:
            return None
        return cls(int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    def at_least(self, major: int, minor: int, micro: int = 0) -> bool:
        return (self.major, self.minor, self.micro) >= (major, minor, micro)

    # -- what this version has --------------------------------------------------------------
    @property
    def supported(self) -> bool:
        return self.at_least(*OLDEST_SUPPORTED)

    @property
    def gpu_whole_and_shard_bug(self) -> bool:
        """A GPU can be allocated whole and as shards at once (fixed in 23.11.5)."""
        return not self.at_least(23, 11, 5)

    @property
    def accounts_gpu_usage(self) -> bool:
        """sacct can carry gres/gpumem and gres/gpuutil (with AutoDetect=nvml)."""
        return self.at_least(23, 2)

    @property
    def tres_prefix(self) -> str:
        """How this version's clients prefix gres in ``tres_per_*``."""
        return "gres/" if self.at_least(23, 11) else "gres:"


def installed_version(timeout: float = 10.0) -> SlurmVersion | None:
    """The version of the Slurm clients on this host (``scontrol -V``), None if unknown."""
    out = cmd.output(["scontrol", "-V"], timeout=timeout)
    return SlurmVersion.parse(out) if out else None
