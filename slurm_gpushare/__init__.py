"""slurm-gpushare: safe GPU sharing for ordinary sbatch jobs on heterogeneous Slurm clusters."""

__version__ = "0.1.0"

# Version of the hook <-> daemon wire protocol (newline-delimited JSON).
PROTOCOL_VERSION = 1
# Prefix of every tag written into a job's AdminComment; bump the version when its layout changes.
TAG_PREFIX = "gpushare:v1:"

# The job_submit/lua hook and its TRES module, shipped inside the package (check-config compares
# the installed copies with these).
HOOK_DIR = __import__("pathlib").Path(__file__).resolve().parent / "lua"
