"""slurm-gpushare: safe GPU sharing for ordinary sbatch jobs on heterogeneous Slurm clusters."""

from pathlib import Path

__version__ = "0.1.0"

# Version of the hook <-> daemon wire protocol (newline-delimited JSON).
PROTOCOL_VERSION = 1

# The job_submit/lua hook and its TRES module, shipped inside the package (check-config compares
# the installed copies with these).
HOOK_DIR = Path(__file__).resolve().parent / "lua"
