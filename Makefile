# slurm-gpushare: the two commands a new user needs are `make demo` and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
export GPUSHARE_CLUSTER_DIR ?= /tmp/slurm-gpushare-cluster

.PHONY: deps demo test test-24.11 test-unit bench cluster-start cluster-stop cluster-status clean

deps:
	scripts/install-deps.sh

## Bring up the local heterogeneous Slurm cluster with the hook and the daemon, run an
## ordinary-sbatch workload, print the decisions and the savings report.
demo: deps
	$(PY) -m devcluster demo

## The whole suite on Slurm 22.05 (the host's): unit and Lua tests on two workers (they share
## nothing), then the cluster tests one at a time against the running cluster (the multi-host
## tests start their own network-namespace cluster beside it).
test: deps
	GPUSHARE_SKIP_CLUSTER=1 $(PY) -m pytest -q -ra -n 2 tests/unit tests/lua
	$(PY) -m devcluster cluster start
	$(PY) -m pytest -q -ra tests/cluster

## The cluster integration tests on Slurm 24.11 (Debian trixie in a root of its own, built on
## first use and cached). Not yet part of `make test`: see the README.
test-24.11: deps
	$(PY) -m devcluster cluster stop  # one cluster at a time on a small machine
	GPUSHARE_SLURM=24.11 $(PY) -m devcluster cluster start
	GPUSHARE_SLURM=24.11 $(PY) -m pytest -q -ra tests/cluster

## Unit tests only (no Slurm daemons).
test-unit: deps
	GPUSHARE_SKIP_CLUSTER=1 $(PY) -m pytest -q -n 2 tests/unit tests/lua

## Submission-path benchmark (records figures under bench/results/).
bench: deps
	$(PY) bench/submit_latency.py

cluster-start: deps
	$(PY) -m devcluster cluster start
cluster-stop:
	$(PY) -m devcluster cluster stop
	GPUSHARE_SLURM=24.11 $(PY) -m devcluster cluster stop
cluster-status:
	$(PY) -m devcluster cluster status

clean: cluster-stop
	rm -rf "$(GPUSHARE_CLUSTER_DIR)"
