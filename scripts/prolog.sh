#!/bin/sh
# slurm-gpushare prolog: start the job's GPU telemetry collector and return at once.
# slurm.conf: Prolog=/path/to/prolog.sh (runs as root on each node of the job).
# Settings (GPUSHARE_PYTHON, GPUSHARE_STATE_DIR, GPUSHARE_SOCKET, ...) come from
# $GPUSHARE_AGENT_ENV (default /etc/default/slurm-gpushare). It never delays or fails a job:
# whatever happens, it exits 0.
# In a subshell: a syntax error, an `exit` or `set -e` in the env file ends only the subshell
# (dash, Debian's /bin/sh, leaves a script at a syntax error in a sourced file; Slurm drains a
# node whose prolog fails).
(
  [ -r "${GPUSHARE_AGENT_ENV:-/etc/default/slurm-gpushare}" ] && . "${GPUSHARE_AGENT_ENV:-/etc/default/slurm-gpushare}"
  export GPUSHARE_STATE_DIR GPUSHARE_SOCKET GPUSHARE_TELEMETRY_PROVIDER GPUSHARE_TELEMETRY_SCENARIO
  export GPUSHARE_DAEMON_ADDRESS GPUSHARE_MUNGE_SOCKET
  "${GPUSHARE_PYTHON:-/opt/slurm-gpushare/bin/python}" -m slurm_gpushare.node.agent start
  # On nodes whose GPUs are shared with gres/mps (GPUSHARE_MPS=1 in the env file), make sure
  # the MPS control daemon runs; it stays up between jobs, as NVIDIA recommends for shared nodes.
  if [ "${GPUSHARE_MPS:-0}" = 1 ] && command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    pgrep -x nvidia-cuda-mps-control >/dev/null 2>&1 || nvidia-cuda-mps-control -d
  fi
) >/dev/null 2>&1
exit 0
