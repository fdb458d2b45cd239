"""The multi-host test cluster: every compute node is a network host of its own.

Each slurmd runs in its own network, UTS and mount namespaces (devcluster/multihost.py), so a
job on a node sees that node's hostname and address, the node's own munged (with the site's
key) and its own run/spool directories, and not the controller's Unix sockets. A network cut is a
firewall rule in the node's namespace that drops only the daemon's TCP port: Slurm's own traffic
(and so the node's jobs) is unaffected. One test stops the cluster, checks that no
namespace, link, mount or process of it is left, and starts it again.
"""

from __future__ import annotations

import socket
import subprocess
import threading

import pytest

pytestmark = pytest.mark.cluster


def run_job(cluster, node: str, script: str, timeout: float = 90) -> str:
    """Run a batch job on ``node`` and return its output."""
    job_id = cluster.sbatch("-w", node, script=script)
    cluster.wait_completed(job_id, timeout=timeout)
    return cluster.job_output(job_id)


def test_each_node_is_a_host_with_its_own_name_address_and_run_directory(multihost_cluster):
    cluster = multihost_cluster
    a, b = cluster.hosts["v100-1"], cluster.hosts["a100-2"]
    # Python, not ip or ping: the node's Python is there on every Slurm version (24.11's root
    # has no network tools). The peers are reached by name over TCP: node b's slurmd and
    # slurmctld on the controller.
    probe = ("import socket\n"
             "print(socket.gethostname())\n"
             f"for name, port in (('{b.name}', {cluster.ports['slurmd_base']}), "
             f"('{cluster.controller_name}', {cluster.ports['slurmctld']})):\n"
             "    with socket.create_connection((name, port), 5) as peer:\n"
             "        print('from', peer.getsockname()[0], 'reached', name)\n")
    out = run_job(cluster, a.name, f"#!/bin/sh\n{cluster.node_python} - <<'EOF'\n{probe}EOF\n"
                  f"ls {cluster.run}\n")
    lines = out.split()
    assert lines[0] == a.name  # its own UTS namespace
    # Its own address on the test network, from which it reaches the others.
    assert f"from {a.address} reached {b.name}" in out
    assert f"from {a.address} reached {cluster.controller_name}" in out
    # The node's run directory is its own: its munged socket and slurmd pid, no daemon socket.
    assert "munge.socket" in lines and f"slurmd-{a.name}.pid" in lines
    assert cluster.daemon_socket.name not in lines and cluster.daemon_socket.exists()
    # slurmctld reaches each slurmd at its own address.
    nodes = cluster.slurm("scontrol", "-o", "show", "node", a.name).stdout
    assert f"NodeAddr={a.address}" in nodes and f"NodeHostName={a.name}" in nodes


def test_a_node_munged_speaks_the_site_key(multihost_cluster):
    cluster = multihost_cluster
    credential = subprocess.run(cluster.in_node("t4-1", ["munge", "-n", "-S", str(cluster.munge_socket)]),
                                capture_output=True, check=True, timeout=10).stdout.decode()
    # Decoded by the controller's own munged: a credential made on the node with the same key.
    decoded = subprocess.run(["unmunge", "-S", str(cluster.munge_socket)], input=credential,
                             capture_output=True, text=True, timeout=10)
    assert decoded.returncode == 0 and "STATUS:" in decoded.stdout and "Success" in decoded.stdout
    node_munged = cluster.node_dir("t4-1") / "run" / "munged.pid"
    assert node_munged.read_text().strip() != (cluster.run / "munged.pid").read_text().strip()


def _listen(address: str, port: int):
    """A TCP listener on the controller that accepts and closes, as a stand-in peer port."""
    server = socket.create_server((address, port))
    server.settimeout(0.2)
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    return server, stop


def _connects(cluster, node: str, port: int) -> bool:
    probe = ("import socket,sys\n"
             f"socket.create_connection(('{cluster.controller_address}', {port}), 3).close()\n")
    return subprocess.run(cluster.in_node(node, [cluster.python, "-c", probe]),
                          capture_output=True, timeout=30).returncode == 0


def test_a_cut_drops_only_the_daemon_port_and_jobs_still_run(multihost_cluster):
    cluster = multihost_cluster
    port = cluster.ports["gpushare_tcp"] + 1  # a free port of the cluster's: not the daemon's
    server, stop = _listen(cluster.controller_address, port)
    try:
        assert _connects(cluster, "v100-2", port)
        cluster.network.cut("v100-2", port)
        try:
            assert cluster.network.is_cut("v100-2")
            assert not _connects(cluster, "v100-2", port)  # dropped: the connect times out
            assert _connects(cluster, "v100-1", port)  # other nodes are not cut
            # slurmctld <-> slurmd traffic still flows: a job on the cut node runs to the end.
            assert run_job(cluster, "v100-2", "#!/bin/sh\nhostname\n").split() == ["v100-2"]
        finally:
            cluster.network.restore("v100-2")
        assert not cluster.network.is_cut("v100-2")
        assert _connects(cluster, "v100-2", port)
    finally:
        stop.set()
        server.close()


def test_stop_removes_every_namespace_link_mount_and_process(multihost_cluster):
    # Runs after the agent tests (file order): a cluster restarted in one go leaves the daemon's
    # view of the nodes stale for a while (daemon started before slurmctld; under study).
    cluster = multihost_cluster
    job_id = cluster.sbatch("-w", "a100-1", script="#!/bin/sh\nsleep 300\n")
    cluster.wait_state(job_id, {"RUNNING"}, timeout=120)
    holders = {n.name: cluster._pid(f"host-{n.name}") for n in cluster.nodes}
    assert all(holders.values()) and cluster.network.leftovers()
    cluster.stop()
    assert cluster.network.leftovers() == []  # namespaces, the controller link, mounts
    assert not any(cluster.status().values()), cluster.status()
    for pid in holders.values():  # the hosts (and all they ran) are gone
        assert not _alive(pid)
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    assert str(cluster.network.subnet) not in routes
    cluster.start()  # as the session's other multi-host tests expect it
    # slurmctld saved the job as running and recovers it: without this, one such job per run
    # piled up on a100-1 until its 8 CPUs were taken and this test's job could not start.
    cluster.slurm("scancel", job_id, check=False)


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
