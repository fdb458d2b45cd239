"""slurm-gpushare: safe GPU sharing for ordinary sbatch jobs on heterogeneous Slurm clusters."""

__version__ = "0.1.0"

# Version of the hook <-> daemon wire protocol (newline-delimited JSON).
PROTOCOL_VERSION = 1
# Prefix of every tag written into a job's AdminComment; bump the version when its layout changes.
TAG_PREFIX = "gpushare:v1:"
