#!/usr/bin/env bash
# Install everything slurm-gpushare's demo and tests need on Debian bookworm (run as root):
# Debian's Slurm 22.05 stack, MariaDB, munge, Lua 5.1 with lua-socket/lua-cjson, and a Python
# virtual environment in .venv with the package and its test dependencies.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server chromium
          lua5.1 lua-socket lua-cjson python3 python3-venv python3-pip sqlite3
          mmdebstrap  # mmdebstrap: the Debian trixie root of the Slurm 24.11 test cluster
          nftables iputils-ping)  # the multi-host test cluster: network cuts, reachability
# chromium: the HTML report is checked in headless Chromium by the test suite.
# Do NOT add slurm-wlm-emulator: it switches slurmctld/slurmd to a front-end build.

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: run as root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-deps: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # --no-install-recommends keeps slurm-wlm-emulator and friends out.
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# Debian starts packaged daemons on install where it can; the test cluster runs its own.

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test,plots]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
echo "install-deps: ready ($(.venv/bin/python --version), $(slurmctld -V))"
