#!/bin/sh
# slurm-gpushare epilog: stop the job's collector, which then delivers its summary to the
# daemon (or spools it). slurm.conf: Epilog=/path/to/epilog.sh. Always exits 0, at once.
# In a subshell: whatever the env file does (a syntax error, an `exit`) ends only the subshell.
(
  [ -r "${GPUSHARE_AGENT_ENV:-/etc/default/slurm-gpushare}" ] && . "${GPUSHARE_AGENT_ENV:-/etc/default/slurm-gpushare}"
  export GPUSHARE_STATE_DIR GPUSHARE_SOCKET GPUSHARE_TELEMETRY_PROVIDER GPUSHARE_TELEMETRY_SCENARIO
  export GPUSHARE_DAEMON_ADDRESS GPUSHARE_MUNGE_SOCKET
  "${GPUSHARE_PYTHON:-/opt/slurm-gpushare/bin/python}" -m slurm_gpushare.node.agent stop
) >/dev/null 2>&1
exit 0
