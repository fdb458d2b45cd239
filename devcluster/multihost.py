"""The test cluster with each compute node on a host of its own (``GPUSHARE_CLUSTER_MODE=multihost``).

The single-host cluster runs every slurmd beside slurmctld and the daemon, so a node's agent
reaches the daemon's Unix socket and shares its spool and munged: a real site has none of that.
Here every node is a host of its own (see ``devcluster/netns.py``):

* its own network namespace and address on a test /24 (``eth0``, bridged to the controller),
  its own hostname (UTS namespace), and ``/etc/hosts`` naming the controller and the nodes;
* its own ``run`` and ``spool`` directories (a mount namespace binds ``nodes/<name>/run`` and
  ``nodes/<name>/spool`` over the cluster's ``run`` and ``spool``), so the same path in the one
  slurm.conf means a node-local place, as ``/run`` and ``/var/spool`` do on a site: the node's
  munged socket, slurmd's spool and pid file, the agent's state and spool. The daemon's Unix
  sockets live in the controller's ``run`` and so do not exist on the nodes;
* its own munged, with the site's key (one key file, as if copied to every host).

The controller is this machine on the subnet's first address: munged, MariaDB, slurmdbd,
slurmctld and the predictor daemon, which listens on that address for the nodes' deliveries.
Shared between hosts, as a cluster file system would be: the checkout (the product and its
Python), ``etc`` (slurm.conf, the agent's env file), ``log``, ``jobs`` (job output) and the fake
GPU boards. On Slurm 24.11 a node's slurmd enters the Slurm root from the node's namespaces (the
root's bind mounts are recursive, so the node's own ``run`` and ``spool`` come with them).
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from devcluster.cluster import ClusterError, FakeNode, TestCluster, _wait_until
from devcluster.netns import Host, Network, NetworkError, subnet_for

MODE_ENV = "GPUSHARE_CLUSTER_MODE"
MODES = ("single", "multihost")
# Beside a single-host cluster of the same port base (and its 24.11 one at +500).
PORT_OFFSET_MULTIHOST = 250
FIRST_NODE_HOST = 11  # nodes are .11, .12, ... of the subnet; the controller is .1

# Runs in the node's new UTS and mount namespaces (private propagation: nothing leaks to the
# machine), then holds them (and so the node) until it is killed.
_HOST_INIT = r'''
set -e
hostname "$1"
mount --bind "$2/run" "$3/run"
mount --bind "$2/spool" "$3/spool"
mount --bind "$3/etc/hosts" /etc/hosts
echo $$ > "$3/run/host.pid"
exec sleep infinity
'''


class MultiHostCluster(TestCluster):
    """The test cluster with one network host per compute node."""

    def __init__(self, state_dir=None, *, python=None, slurm=None):
        super().__init__(state_dir, python=python, slurm=slurm)
        self._place(self.root / "multihost", self.port_base + PORT_OFFSET_MULTIHOST)
        self.ports["gpushare_tcp"] = self.port_base + 23
        try:
            subnet = subnet_for(self.port_base)
        except NetworkError as exc:
            raise ClusterError(str(exc)) from None
        self.hosts = {node.name: Host(node.name, str(subnet.network_address + FIRST_NODE_HOST + i))
                      for i, node in enumerate(self.nodes)}
        self.network = Network(f"gs{self.port_base}", subnet, list(self.hosts.values()))
        self.controller_address = self.network.controller_address
        self.controller_name = socket.gethostname().split(".")[0]

    # ---- where things are ------------------------------------------------------------------
    def node_dir(self, node: str) -> Path:
        """A node's own directory (its ``run`` and ``spool``) as seen from the controller."""
        return self.root / "nodes" / node

    @property
    def agent_state_dir(self) -> Path:
        """The agent's state and spool on every node (a node-local path)."""
        return self.root / "spool" / "gpushare"

    def node_spool(self, node: str) -> Path:
        """Node ``node``'s agent spool, seen from the controller."""
        return self.node_dir(node) / "spool" / "gpushare" / "spool"

    @property
    def daemon_tcp(self) -> str:
        """The daemon's listen address for the nodes' deliveries."""
        return f"{self.controller_address}:{self.ports['gpushare_tcp']}"

    def _agent_delivery_env(self) -> list[str]:
        return [f"GPUSHARE_STATE_DIR={self.agent_state_dir}",
                # No such socket on a node: the agent delivers to the daemon's TCP listener,
                # sealed by the node's own munged.
                f"GPUSHARE_SOCKET={self.daemon_socket}",
                f"GPUSHARE_DAEMON_ADDRESS={self.daemon_tcp}",
                f"GPUSHARE_MUNGE_SOCKET={self.munge_socket}",
                "export GPUSHARE_DAEMON_ADDRESS GPUSHARE_MUNGE_SOCKET"]

    def _daemon_toml(self) -> str:
        text = super()._daemon_toml()
        listener = (f'listen_tcp = "{self.daemon_tcp}"\n'
                    f'munge_socket = "{self.munge_socket}"\n')
        return text.replace("[daemon]\n", "[daemon]\n" + listener, 1)

    @property
    def hosts_file(self) -> Path:
        """Every host's names, the controller's included: slurmctld 24.11 looks up the name of
        each address that connects to it, and a node's address in no hosts file goes to DNS,
        where concurrent lookups here time out after 5 s (a fifth of them) and every request
        waiting behind one stalls: jobs then took 13-16 s to run 4 s of work."""
        return self.etc / "hosts"

    @property
    def controller_host(self) -> str:
        return f"{self.controller_name}({self.controller_address})"

    def _node_address(self, index: int, node: FakeNode) -> str:
        # One slurmd port for all: each node has an address of its own.
        return (f"NodeHostname={node.name} NodeAddr={self.hosts[node.name].address} "
                f"Port={self.ports['slurmd_base']}")

    def _pid_file(self, name: str) -> Path:
        for node in self.nodes:
            if name == f"slurmd-{node.name}":
                return self.node_dir(node.name) / "run" / f"slurmd-{node.name}.pid"
            if name == f"munged-{node.name}":
                return self.node_dir(node.name) / "run" / "munged.pid"
            if name == f"host-{node.name}":
                return self.node_dir(node.name) / "run" / "host.pid"
        return super()._pid_file(name)

    def in_node(self, node: str, argv: list[str]) -> list[str]:
        """``argv`` as run on host ``node`` (its network, hostname and mounts)."""
        pid = self._pid(f"host-{node}")
        if not pid:
            raise ClusterError(f"host {node} is not up")
        return ["nsenter", "-t", str(pid), "-n", "-u", "-m", "--", *argv]

    # ---- configuration ---------------------------------------------------------------------
    def write_config(self) -> None:
        super().write_config()
        for node in self.nodes:
            for sub in ("run", "spool", f"spool/slurmd-{node.name}"):
                (self.node_dir(node.name) / sub).mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost", f"{self.controller_address} {self.controller_name}"]
        lines += [f"{host.address} {host.name}" for host in self.hosts.values()]
        self._write(self.etc / "hosts", "# The test cluster's hosts (bound over /etc/hosts "
                    "on its nodes).\n" + "\n".join(lines) + "\n")

    # ---- components ------------------------------------------------------------------------
    def start(self) -> None:
        try:
            self.network.up()  # first: the daemon listens on the controller's address
        except NetworkError as exc:
            raise ClusterError(str(exc)) from None
        super().start()

    def _start_host(self, node: FakeNode) -> None:
        if self._pid(f"host-{node.name}"):
            return
        # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup file system slurmd
        # needs.
        argv = ["setsid", "-f", "nsenter", f"--net=/run/netns/{self.network.namespace(node.name)}",
                "unshare", "--uts", "--mount", "--propagation", "private", "--",
                "sh", "-c", _HOST_INIT, "host-init", node.name, str(self.node_dir(node.name)),
                str(self.root)]
        with open(self.log / f"host-{node.name}.out", "ab") as out:
            subprocess.run(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL, timeout=30,
                           check=True)
        _wait_until(lambda: bool(self._pid(f"host-{node.name}")), 15, f"host {node.name}")

    def _start_node_munge(self, node: FakeNode) -> None:
        if not self._pid(f"munged-{node.name}"):
            key = self.root / "munge" / "munge.key"  # the site's key, on every host
            self._spawn(f"munged-{node.name}", self.in_node(node.name, [
                "munged", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                f"--pid-file={self.run}/munged.pid", f"--log-file={self.log}/munged-{node.name}.log",
                f"--seed-file={self.run}/munged.seed",
            ]))
        socket_here = self.node_dir(node.name) / "run" / self.munge_socket.name
        _wait_until(lambda: self._munge_ok(socket_here), 15, f"munged on {node.name}")

    def _start_slurmds(self) -> None:
        for node in self.nodes:
            self._start_host(node)
            self._start_node_munge(node)
            if not self._pid(f"slurmd-{node.name}"):
                self._spawn(f"slurmd-{node.name}",
                            self.in_node(node.name, self.in_root(["slurmd", "-N", node.name])))
        _wait_until(self.nodes_ready, 60, "all slurmd to register")

    def stop(self) -> None:
        try:
            self.network.down()  # every process on the nodes first: slurmd, munged, jobs
        except NetworkError as exc:
            raise ClusterError(str(exc)) from None
        super().stop()

    def status(self) -> dict[str, bool]:
        status = super().status()
        for node in self.nodes:
            status[f"host-{node.name}"] = bool(self._pid(f"host-{node.name}"))
            status[f"munged-{node.name}"] = bool(self._pid(f"munged-{node.name}"))
        status["network"] = self.network.is_up()
        return status


def make_cluster(state_dir=None, *, mode: str | None = None, **kwargs) -> TestCluster:
    """The test cluster of the mode asked for (default: ``$GPUSHARE_CLUSTER_MODE`` or single)."""
    import os

    mode = mode or os.environ.get(MODE_ENV) or "single"
    if mode not in MODES:
        raise ClusterError(f"{MODE_ENV}={mode}: the test cluster's modes are {', '.join(MODES)}")
    if mode == "multihost":
        return MultiHostCluster(state_dir, **kwargs)
    return TestCluster(state_dir, **kwargs)
