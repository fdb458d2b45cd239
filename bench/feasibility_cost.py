"""Benchmark: what checking where a share can run (core/feasibility.py) costs a decision.

    .venv/bin/python bench/feasibility_cost.py [--nodes 5 500 5000] [--rounds 5] \
        [--out bench/feasibility_cost.json]

``policy.decide`` for one eligible job with history, on a view of N nodes (half a100, half
v100, a few kinds of nodes as a real cluster has), with and without the feasibility check's
inputs (constraint, exclude list, node list), against the same decision on no view (the check
skipped). Median and spread of ``rounds`` rounds of ``per_round`` decisions each, in ms.
The decision runs on the submit path (the hook waits at most ``timeout_ms``, 50 ms by default).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.core.config import parse_config  # noqa: E402
from slurm_gpushare.core.policy import JobEstimate, NodeView, decide  # noqa: E402
from slurm_gpushare.core.types import JobRequest  # noqa: E402

CONFIG = parse_config({"policy": {"sharing_partitions": ["gpu"]},
                       "gpu_types": {"v100": {"memory_gib": 16}, "a100": {"memory_gib": 80}}})
ESTIMATE = JobEstimate(source="history", memory_mib={"v100": 6000, "a100": 6000},
                       runtime_s={"v100": 200.0, "a100": 100.0})
REQUESTS = {
    "plain": JobRequest(uid=1, partition="gpu", tres_per_node="gres:gpu:1"),
    "constraint+exclude": JobRequest(uid=1, partition="gpu", tres_per_node="gres:gpu:1",
                                     features="ib&[a100|v100]", exc_nodes="n[1-3]"),
    "nodelist": JobRequest(uid=1, partition="gpu", tres_per_node="gres:gpu:1", req_nodes="n4"),
}


class View:
    def __init__(self, n: int):
        states = ("idle", "mix", "alloc", "drain")
        self._nodes = tuple(
            NodeView(f"n{i}", "a100" if i % 2 else "v100", ("gpu", "gpu-long"), (), gpus=8,
                     features=("a100" if i % 2 else "v100", "ib" if i % 3 else "eth"),
                     state=states[i % 4])
            for i in range(n))

    def nodes(self):
        return self._nodes

    def reservations(self):
        return {}


def timed(request, view, per_round: int, rounds: int) -> dict:
    results = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(per_round):
            decision = decide(request, CONFIG, estimate=ESTIMATE, view=view)
        results.append((time.perf_counter() - started) / per_round * 1000)
    assert decision.action == "share", decision
    return {"median_ms": round(statistics.median(results), 4),
            "min_ms": round(min(results), 4), "max_ms": round(max(results), 4)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[5, 500, 5000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--out", default=str(ROOT / "bench" / "feasibility_cost.json"))
    args = parser.parse_args(argv)
    figures = {"no-view": timed(REQUESTS["plain"], None, args.per_round, args.rounds)}
    for n in args.nodes:
        view = View(n)
        for name, request in REQUESTS.items():
            figures[f"{n}-nodes/{name}"] = timed(request, view, args.per_round, args.rounds)
    record = {"benchmark": "feasibility_cost", "rounds": args.rounds,
              "per_round": args.per_round, "figures": figures}
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    for key, value in figures.items():
        print(f"{key:<32} median {value['median_ms']:.3f} ms "
              f"(min {value['min_ms']:.3f}, max {value['max_ms']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
