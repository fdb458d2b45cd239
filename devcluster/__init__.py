"""Development tooling that stays out of the installed product: a local heterogeneous Slurm
cluster (real daemons, fake GPUs), its fake GPU board, and the demo. Run from the repository
root: ``python -m devcluster cluster start|stop|status|env`` and ``python -m devcluster demo``."""
