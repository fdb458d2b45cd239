"""Linux network namespaces that make one machine look like several hosts on one network.

The multi-host test cluster (``devcluster/multihost.py``) gives each compute node a host of its
own: a network namespace with one interface (``eth0``) and address, a UTS namespace with the
node's hostname, and a mount namespace where the node's ``/run``-like and spool directories and
``/etc/hosts`` are its own. The node interfaces are veth pairs whose other ends sit on a bridge
in a namespace of its own, so the whole network exists only while the cluster does; the
controller is this machine, joined to the bridge by one more veth pair.

Everything is named with the cluster's prefix (``gs<port base>``) and addressed in a /24 of
10.0.0.0/8 derived from the same port base, so two test clusters on one machine never share a
name or an address. ``Network.down`` removes every namespace and link it made; ``leftovers``
lists what would remain (the teardown test asserts it is empty).

A network cut is a firewall rule inside a node's namespace (nftables, table ``gpushare_cut``):
it drops what that node sends to one TCP port of the controller and nothing else.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CUT_TABLE = "gpushare_cut"


class NetworkError(RuntimeError):
    """The test network could not be made, entered or removed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def subnet_for(port_base: int) -> ipaddress.IPv4Network:
    """A /24 of 10.0.0.0/8 that only the cluster with this port base uses."""
    if not 0 < port_base < 65536:
        raise NetworkError(f"port base {port_base} is not a TCP port")
    return ipaddress.IPv4Network(f"10.{port_base >> 8}.{port_base & 255}.0/24")


@dataclass(frozen=True)
class Host:
    name: str  # the node name, its hostname and its veth's name on the bridge
    address: str


class Network:
    """One test network: a bridge namespace, the controller's link, one namespace per host."""

    def __init__(self, prefix: str, subnet: ipaddress.IPv4Network, hosts: list[Host]):
        self.prefix = prefix
        self.subnet = subnet
        self.hosts = hosts
        self.controller_address = str(subnet.network_address + 1)
        self.bridge_namespace = f"{prefix}-net"
        self.controller_link = f"{prefix}ctl"  # on this machine: at most 15 characters
        if len(self.controller_link) > 15:
            raise NetworkError(f"prefix {prefix!r} is too long for an interface name")

    def namespace(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    # ---- state ------------------------------------------------------------------------------
    def namespaces(self) -> list[str]:
        """This network's namespaces that exist now."""
        listed = _ip("netns", "list", check=False).stdout.split("\n")
        names = [line.split()[0] for line in listed if line.strip()]
        return [n for n in names if n.startswith(f"{self.prefix}-")]

    def is_up(self) -> bool:
        mine = set(self.namespaces())
        wanted = {self.bridge_namespace, *(self.namespace(h.name) for h in self.hosts)}
        return wanted <= mine and _ip("link", "show", self.controller_link,
                                      check=False).returncode == 0

    def leftovers(self) -> list[str]:
        """What of this network still exists: namespaces, the controller link, mounts."""
        found = [f"namespace {n}" for n in self.namespaces()]
        if _ip("link", "show", self.controller_link, check=False).returncode == 0:
            found.append(f"link {self.controller_link}")
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        found += [f"mount {line.split()[4]}" for line in mounts
                  if f"/{self.prefix}-" in line.split()[4]]
        return found

    # ---- up and down ------------------------------------------------------------------------
    def _check_free(self) -> None:
        """Refuse a subnet this machine already routes (another network, not a test one)."""
        routes = _ip("-4", "route", "show", "table", "all", check=False).stdout
        for line in routes.splitlines():
            word = line.split()[0] if line.split() else ""
            try:
                other = ipaddress.IPv4Network(word, strict=False)
            except ValueError:
                continue
            if other.prefixlen and other.overlaps(self.subnet) and self.controller_link not in line:
                raise NetworkError(f"{self.subnet} overlaps a route of this machine ({line.strip()});"
                                   " choose another GPUSHARE_CLUSTER_PORT_BASE")

    def up(self) -> None:
        """Make the bridge, the controller's link and every host's namespace (idempotent:
        a network that is already complete is left as it is; a partial one is rebuilt)."""
        if self.is_up():
            return
        self.down()
        self._check_free()
        bridge = self.bridge_namespace
        _ip("netns", "add", bridge)
        _ip("-n", bridge, "link", "set", "lo", "up")
        _ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", bridge, "link", "set", "br0", "up")
        # The controller: this machine, on the first address of the subnet.
        _ip("link", "add", self.controller_link, "type", "veth", "peer", "name", "ctl",
            "netns", bridge)
        _ip("addr", "add", f"{self.controller_address}/{self.subnet.prefixlen}",
            "dev", self.controller_link)
        _ip("link", "set", self.controller_link, "up")
        _ip("-n", bridge, "link", "set", "ctl", "master", "br0", "up")
        for host in self.hosts:
            namespace = self.namespace(host.name)
            _ip("netns", "add", namespace)
            _ip("-n", namespace, "link", "set", "lo", "up")
            _ip("-n", bridge, "link", "add", host.name, "type", "veth", "peer", "name", "eth0",
                "netns", namespace)
            _ip("-n", namespace, "addr", "add", f"{host.address}/{self.subnet.prefixlen}",
                "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", bridge, "link", "set", host.name, "master", "br0", "up")

    def processes(self, host: str) -> list[int]:
        """Every process in a host's network namespace (daemons, jobs, agents)."""
        out = _ip("netns", "pids", self.namespace(host), check=False).stdout
        return [int(pid) for pid in out.split() if pid.isdigit()]

    def kill_processes(self, host: str, timeout: float = 10) -> None:
        """SIGTERM every process on a host, then SIGKILL what is left after ``timeout``."""
        deadline = time.monotonic() + timeout
        sig = signal.SIGTERM
        while True:
            pids = self.processes(host)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                if sig == signal.SIGKILL:
                    raise NetworkError(f"processes {pids} on {host} survive SIGKILL")
                sig, deadline = signal.SIGKILL, time.monotonic() + 5
            time.sleep(0.1)

    def down(self, timeout: float = 15) -> None:
        """Kill every process on the hosts and remove every namespace and link of this
        network; returns once the kernel has let go of them all."""
        for namespace in self.namespaces():
            if namespace != self.bridge_namespace:
                self.kill_processes(namespace[len(self.prefix) + 1:])
        _ip("link", "del", self.controller_link, check=False)  # takes its peer with it
        for namespace in self.namespaces():
            _ip("netns", "del", namespace, check=False)
        # The kernel frees a namespace's links asynchronously: poll until they are gone.
        deadline = time.monotonic() + timeout
        while self.leftovers():
            if time.monotonic() > deadline:
                raise NetworkError(f"still there after {timeout:.0f}s: {self.leftovers()}")
            time.sleep(0.1)

    # ---- a network cut ---------------------------------------------------------------------
    def cut(self, host: str, port: int) -> None:
        """Drop every packet ``host`` sends to the controller's TCP ``port`` (and nothing
        else: Slurm's own traffic still flows)."""
        rules = (f"table inet {CUT_TABLE} {{\n"
                 "  chain output {\n"
                 "    type filter hook output priority 0; policy accept;\n"
                 f"    ip daddr {self.controller_address} tcp dport {port} drop\n"
                 "  }\n}\n")
        self._nft(host, ["-f", "-"], rules)

    def restore(self, host: str) -> None:
        self._nft(host, ["delete", "table", "inet", CUT_TABLE])

    def is_cut(self, host: str) -> bool:
        listed = self._nft(host, ["list", "tables"])
        return f"table inet {CUT_TABLE}" in listed

    def _nft(self, host: str, args: list[str], stdin: str | None = None) -> str:
        result = subprocess.run(["ip", "netns", "exec", self.namespace(host), "nft", *args],
                                input=stdin, capture_output=True, text=True, timeout=30)
        if result.returncode:
            raise NetworkError(f"nft {' '.join(args)} on {host}: {result.stderr.strip()}")
        return result.stdout
