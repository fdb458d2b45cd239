"""A generated corpus of GPU submissions on the real test cluster, each checked end to end.

Combinations of submission form (sbatch, srun, salloc) x GPU option x placement (constraint,
node list, exclude, a partition with only some types) x history (none, runs on another type,
runs of the same script with other arguments) x shape (plain, array, heterogeneous) are drawn
with a seed, keeping only those Slurm itself accepts and can run as submitted on this cluster
(``--gres=gpu:a100:1 -p gpu-v100`` is the user's mistake, not the hook's). All are submitted
at once with the daemon up; each must then be

- **accepted** (the submission command succeeds),
- **rewritten only when valid**: a share ran on a node of a type its tag names, inside the
  user's partition, constraint, node list and exclusions; srun/salloc allocations and
  heterogeneous components are never shares; a share is at least as large as the memory the
  job uses (never sized from another job's history),
- **started in bounded time**, never pending with a reason that means "never" (BadConstraints,
  ReqNodeNotAvail, PartitionConfig, ...),
- **runnable**: an ``srun`` step running the fake board's ``nvidia-smi -L`` succeeds,
- **accounted as tagged**: sacct AllocTRES has ``gres/shard=N`` / ``gres/mps=N`` for a share
  of N, ``gres/gpu=1`` and no shared gres otherwise.

Run alone: ``python -m tests.cluster.corpus [--count N] [--seed S]`` (cluster started, with
``GPUSHARE_CLUSTER_DIR``/``GPUSHARE_CLUSTER_PORT_BASE`` as for the tests); it prints the
combinations x outcome table and ``N accepted, 0 broken``. tests/cluster/test_corpus.py runs it.
"""

from __future__ import annotations

import argparse
import itertools
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from slurm_gpushare.core.feasibility import parse_constraint, satisfies
from slurm_gpushare.core.hostlist import expand_hostlist
from slurm_gpushare.core.tag import Tag

# The test cluster (devcluster/cluster.py): node -> (type, features); partitions.
NODES = {"v100-1": ("v100", {"v100", "gpumem16g"}), "v100-2": ("v100", {"v100", "gpumem16g"}),
         "a100-1": ("a100", {"a100", "gpumem80g"}), "a100-2": ("a100", {"a100", "gpumem80g"}),
         "t4-1": ("t4", {"t4", "gpumem16g"})}
PARTITIONS = {"gpu": set(NODES), "gpu-v100": {"v100-1", "v100-2"}}
# The fake board's out-of-memory line (devcluster/fakegpu.py): node, GPU, MiB wanted, MiB free,
# and the jobs holding the GPU.
FAKE_OOM = re.compile(r"out of memory on (\S+) GPU (\d+): (\d+) MiB wanted, (-?\d+) MiB free"
                      r"(?:; held by jobs (.*))?")

FORMS = ("sbatch", "srun", "salloc")
GPU_OPTIONS = {  # name -> (options, GPU type asked for)
    "gres": (["--gres=gpu:1"], None),
    "gres-a100": (["--gres=gpu:a100:1"], "a100"),
    "gpus": (["--gpus=1"], None),
    "gpus-v100": (["--gpus=v100:1"], "v100"),
    "G": (["-G", "1"], None),
    "gpus-per-node": (["--gpus-per-node=1"], None),
}
PLACEMENTS = {  # name -> (options, partition, constraint, node list, exclude)
    "none": ([], "gpu", "", "", ""),
    "constraint-v100": (["--constraint=v100"], "gpu", "v100", "", ""),
    "constraint-[a100|t4]": (["--constraint=[a100|t4]"], "gpu", "[a100|t4]", "", ""),
    "w-v100-1": (["-w", "v100-1"], "gpu", "", "v100-1", ""),
    "w-a100-2": (["-w", "a100-2"], "gpu", "", "a100-2", ""),
    "exclude-a100": (["--exclude=a100-[1-2]"], "gpu", "", "", "a100-[1-2]"),
    "partition-v100": (["-p", "gpu-v100"], "gpu-v100", "", "", ""),
}
# Memory the job uses (MiB) and whose history it finds: arguments of one script.
# "hint-30G": a memory hint larger than v100/t4 (a share only fits a100), so every placement
# without an a100 must keep the job (the rejected/pending-forever reproductions).
HISTORIES = ("none", "on-v100", "on-a100", "other-args", "hint-30G")
SHAPES = ("plain", "array", "het")
# Pending reasons that mean the job can never start as it is. ReqNodeNotAvail also shows
# while a required node is busy or completing: it counts only for a job that never started.
NEVER = ("BadConstraints", "PartitionConfig", "PartitionNodeLimit", "InvalidQOS",
         "JobHeldAdmin")
NEVER_IF_NOT_STARTED = ("ReqNodeNotAvail",)


# sacct rows per submission: an array of two tasks, a het job of two components.
EXPECTED_RECORDS = {"plain": 1, "array": 2, "het": 2}


@dataclass
class Case:
    number: int
    form: str
    gpu: str
    placement: str
    history: str
    shape: str
    name: str = ""
    mem_mib: int = 0
    args: list[str] = field(default_factory=list)
    submit_rc: int | None = None
    submit_err: str = ""
    records: list[dict] = field(default_factory=list)  # sacct rows (one per task/component)
    never_reasons: set[str] = field(default_factory=set)
    waits: set[str] = field(default_factory=set)  # reasons that are fatal only if it never ran
    problems: list[str] = field(default_factory=list)
    outcome: str = ""
    # Slurm 22.05's shard placement: shares split over GPUs, or shards of a GPU held whole
    slurm_splits: list = field(default_factory=list)

    @property
    def combination(self) -> str:
        return f"{self.form} {self.gpu} {self.placement} {self.history} {self.shape}"


def runnable_as_submitted(form: str, gpu: str, placement: str, shape: str) -> bool:
    """Whether Slurm accepts and can run this combination without any rewrite."""
    if form != "sbatch" and shape != "plain":
        return False  # arrays and het jobs are sbatch's
    gpu_type = GPU_OPTIONS[gpu][1]
    _, partition, constraint, nodelist, exclude = PLACEMENTS[placement]
    nodes = set(PARTITIONS[partition])
    if nodelist:
        nodes &= set(expand_hostlist(nodelist))
    nodes -= set(expand_hostlist(exclude)) if exclude else set()
    expr = parse_constraint(constraint) if constraint else None
    nodes = {n for n in nodes if satisfies(expr, NODES[n][1])
             and (gpu_type is None or NODES[n][0] == gpu_type)}
    return bool(nodes) and (not nodelist or set(expand_hostlist(nodelist)) <= nodes)


def generate(count: int, seed: int) -> list[Case]:
    """``count`` distinct runnable combinations, every level of every factor present."""
    every = [c for c in itertools.product(FORMS, GPU_OPTIONS, PLACEMENTS, HISTORIES, SHAPES)
             if runnable_as_submitted(c[0], c[1], c[2], c[4])]
    rng = random.Random(seed)
    rng.shuffle(every)
    chosen, seen = [], set()
    # First one case for each level of each factor, then the rest at random.
    for index, levels in enumerate((FORMS, GPU_OPTIONS, PLACEMENTS, HISTORIES, SHAPES)):
        for level in levels:
            pick = next((c for c in every if c[index] == level and c not in seen), None)
            if pick:
                chosen.append(pick)
                seen.add(pick)
    chosen += [c for c in every if c not in seen][:max(0, count - len(chosen))]
    return [Case(i, *c) for i, c in enumerate(chosen[:max(count, len(chosen))])]


class Corpus:
    def __init__(self, cluster, *, seed: int = 12, work_s: float = 1.0):
        self.cluster = cluster
        self.seed = seed
        self.work_s = work_s
        self.nonce = f"{int(time.time())}{seed}"
        self.python = cluster.node_python  # the Python jobs run with (the root's on 24.11)
        self.dir = cluster.root / "corpus" / self.nonce
        self.dir.mkdir(parents=True, exist_ok=True)
        fake = f"{self.python} -m devcluster.fakegpu"
        env = (f"export GPUSHARE_FAKEGPU_ROOT={cluster.fakegpu_root} "
               f"PYTHONPATH={Path(__file__).resolve().parents[2]}\n")
        # One script: its first argument is the memory it uses on any GPU (MiB).
        self.script = self.dir / "train.sh"
        self.script.write_text(
            "#!/bin/sh\n# a corpus job: list its GPU, then use it\nset -e\n" + env +
            f"srun -n1 {fake} smi\n"
            f"srun -n1 {fake} run --work {work_s:g} --util 30 --mem v100:$1 --mem a100:$1 "
            "--mem t4:$1\n")
        self.het_script = self.dir / "het.sh"
        self.het_script.write_text(
            "#!/bin/sh\nset -e\n" + env + f"srun --het-group=0 -n1 {fake} smi\n"
            f"srun --het-group=1 -n1 {fake} smi\n")
        self.fake = fake
        self.env_prefix = env

    # -- history: real runs of the script, profiled by the real agent ----------------------
    def history_args(self, history: str) -> tuple[int, list[str]]:
        return {"none": (2000, ["2000", f"{self.nonce}-fresh"]),
                "on-v100": (2000, ["2000", self.nonce]),
                "on-a100": (12000, ["12000", f"{self.nonce}a"]),
                # The same script as on-v100's history, other arguments (and 6x the memory).
                "other-args": (12000, ["12000", self.nonce]),
                "hint-30G": (2000, ["2000", f"{self.nonce}-hint"])}[history]

    def seed_history(self, timeout: float = 120) -> None:
        seeds = [(["-w", "v100-1"], self.history_args("on-v100")[1]),
                 (["-w", "a100-1"], self.history_args("on-a100")[1])]
        ids = [self._sbatch(["-p", "gpu", "--gres=gpu:1", *opts, "-J", f"seed-{self.nonce}"],
                            self.script, args)[0] for opts, args in seeds]
        deadline = time.monotonic() + timeout
        for job_id in ids:
            record = self.cluster.sacct(job_id, "JobID,State,ExitCode",
                                        timeout=max(1, deadline - time.monotonic()))
            if record["State"] != "COMPLETED":
                raise RuntimeError(f"seed job {job_id}: {record}")
        # The telemetry reaches the daemon from the epilog; wait until a decision uses it.
        while time.monotonic() < deadline:
            if all(self._explain(args).get("code") == "history-share" for _, args in seeds):
                return
            time.sleep(1)
        raise RuntimeError("seed history never reached the daemon")

    def _explain(self, args: list[str]) -> dict:
        from slurm_gpushare.daemon.protocol import request
        import os
        job = {"uid": os.getuid(), "user": _user(), "partition": "gpu",
               "tres_per_node": "gres:gpu:1", "script": self.script.read_text(),
               "argv": [str(self.script), *args], "batch": True}
        reply = request(str(self.cluster.run / "gpushare-query.sock"),
                        {"v": 1, "op": "explain", "job": job})
        return (reply or {}).get("decision") or {}

    # -- submission --------------------------------------------------------------------------
    def _sbatch(self, options, script, args) -> tuple[str, int, str]:
        result = self.cluster.slurm("sbatch", "--parsable", f"--chdir={self.dir}",
                                    f"--output={self.dir}/%j.out", *options, str(script), *args,
                                    check=False)
        return result.stdout.strip().split(";")[0], result.returncode, result.stderr.strip()

    def submit(self, case: Case, threads: list[threading.Thread]) -> None:
        gpu_opts = GPU_OPTIONS[case.gpu][0]
        place_opts, partition, *_ = PLACEMENTS[case.placement]
        case.mem_mib, case.args = self.history_args(case.history)
        case.name = f"corpus-{self.nonce}-{case.number}"
        base = ["-J", case.name, *([] if "-p" in place_opts else ["-p", "gpu"]),
                *(["--comment=gpushare:mem=30G"] if case.history == "hint-30G" else [])]
        if case.form == "sbatch":
            if case.shape == "het":
                options = [*base, *gpu_opts, *place_opts, ":", "-p", "gpu", "--gres=gpu:1"]
                _, case.submit_rc, case.submit_err = self._sbatch(options, self.het_script, [])
                return
            extra = ["--array=0-1"] if case.shape == "array" else []
            _, case.submit_rc, case.submit_err = self._sbatch(
                [*base, *gpu_opts, *place_opts, *extra], self.script, case.args)
            return
        # srun: allocation and step in one; salloc: an allocation running srun. Both block.
        step = f"{self.env_prefix.strip()}; {self.fake} smi"
        if case.form == "srun":
            argv = ["srun", *base, *gpu_opts, *place_opts, "sh", "-c", step]
        else:
            argv = ["salloc", *base, *gpu_opts, *place_opts, "srun", "-n1", "sh", "-c", step]

        def run() -> None:
            try:
                result = self.cluster.slurm(*argv, check=False, timeout=600)
                case.submit_rc, case.submit_err = result.returncode, result.stderr.strip()[-300:]
            except subprocess.TimeoutExpired:
                case.submit_rc, case.submit_err = 124, "timed out"
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)

    # -- watching and checking ---------------------------------------------------------------
    def watch(self, cases: list[Case], threads, timeout: float) -> None:
        names = {c.name: c for c in cases}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            queue = self.cluster.slurm("squeue", "-h", "-o", "%j|%T|%r", check=False).stdout
            active = 0
            for line in queue.splitlines():
                name, state, reason = (line.split("|") + ["", ""])[:3]
                if name in names:
                    active += 1
                    if state == "PENDING" and any(r in reason for r in NEVER):
                        names[name].never_reasons.add(reason)
                    elif state == "PENDING" and any(r in reason for r in NEVER_IF_NOT_STARTED):
                        names[name].waits.add(reason)
            if not active and not any(t.is_alive() for t in threads):
                break
            time.sleep(2)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._read_accounting(cases)

    def _read_accounting(self, cases: list[Case], timeout: float = 180) -> None:
        names = {c.name: c for c in cases}
        fields = ["JobID", "JobIDRaw", "JobName", "State", "ExitCode", "NodeList", "AllocTRES",
                  "Submit", "Start", "AdminComment"]
        deadline = time.monotonic() + timeout
        while True:
            out = self.cluster.slurm("sacct", "-n", "-P", "-X", "-S", "now-2hours", "-o",
                                     ",".join(fields), "--name", ",".join(names),
                                     env={"SLURM_TIME_FORMAT": "%s"}, check=False).stdout
            for case in cases:
                case.records = []
            for line in out.splitlines():
                row = dict(zip(fields, line.split("|", len(fields) - 1)))
                if row.get("JobName") in names:
                    names[row["JobName"]].records.append(row)
            # An array task that has not started yet may have no record of its own.
            unfinished = [c for c in cases if c.submit_rc == 0 and (
                len(c.records) < EXPECTED_RECORDS[c.shape]
                or any(r["State"] in ("PENDING", "RUNNING", "REQUEUED") for r in c.records))]
            if not unfinished or time.monotonic() > deadline:
                return
            time.sleep(2)

    def check(self, case: Case, start_bound_s: float) -> None:
        p = case.problems
        if case.submit_rc != 0:
            p.append(f"not accepted or failed (rc {case.submit_rc}): {case.submit_err[-200:]}")
        if case.never_reasons:
            p.append(f"pending with {sorted(case.never_reasons)}")
        if case.waits and not any(r["Start"].isdigit() for r in case.records):
            p.append(f"never started, pending with {sorted(case.waits)}")
        expected = EXPECTED_RECORDS[case.shape]
        if len(case.records) != expected:
            p.append(f"{len(case.records)} accounting records, {expected} expected")
        shares = 0
        for row in case.records:
            if row["State"] != "COMPLETED" or row["ExitCode"] != "0:0":
                split = self._split_by_slurm(row) or self._whole_gpu_shared_by_slurm(row)
                if split:
                    case.slurm_splits.append(f"{row['JobID']}: {split}")
                    continue
                p.append(f"{row['JobID']} {row['State']} {row['ExitCode']}")
            if row["Start"].isdigit() and row["Submit"].isdigit() and \
                    int(row["Start"]) - int(row["Submit"]) > start_bound_s:
                p.append(f"{row['JobID']} started {int(row['Start']) - int(row['Submit'])} s "
                         "after submission")
            tag = Tag.decode(row["AdminComment"]) if row["AdminComment"] else None
            shares += bool(tag and tag.action == "share")
            p.extend(f"{row['JobID']}: {m}" for m in self._check_row(case, row, tag))
        if shares and (case.form != "sbatch" or case.shape == "het"):
            p.append("a share for an allocation or a het component")
        case.outcome = ("broken" if p else
                        "slurm-split" if case.slurm_splits else
                        "share" if shares else
                        "kept" if any(r["AdminComment"] for r in case.records) else "untouched")

    def _split_by_slurm(self, row: dict) -> str:
        """Slurm 22.05 may hand one job's shards out over two GPUs (fixed in 23.11: refused
        unless MULTIPLE_SHARING_GRES_PJ; see check-config and the admin guide's version table).
        Such a share was sized right but lands on a GPU with less room than its count: its own
        output says so (the fake board's out-of-memory line shows the room left by the GPU's
        other jobs). Anything else is a broken job."""
        if not self.cluster.slurm_version.startswith("22."):
            return ""
        tag = Tag.decode(row["AdminComment"])
        oom = FAKE_OOM.search(self._output(row)) if tag and tag.shard else None
        if not oom:
            return ""
        wanted, free = int(oom.group(3)), int(oom.group(4))
        if wanted <= tag.shard * 1024 and free < tag.shard * 1024:
            return (f"{tag.shard} shards placed by Slurm on {oom.group(1)} GPU {oom.group(2)}, "
                    f"which had room for {max(free, 0) // 1024}; the job needed {wanted} MiB")
        return ""

    def _whole_gpu_shared_by_slurm(self, row: dict) -> str:
        """Slurm 22.05 may also hand out shards of a GPU it has allocated whole (fixed in
        23.11.5; check-config warns): a whole-GPU job that fits an empty GPU then finds its GPU's
        memory taken by a share. Whole GPUs are never given twice, and the fake board counts
        only processes still running (pid and start time), so on this cluster only a share can
        be there; the job's out-of-memory line names the jobs holding the GPU. The product does
        not prevent it yet (see the admin guide's version table); it is listed apart, never
        hidden."""
        if not self.cluster.slurm_version.startswith("22."):
            return ""
        alloc = dict(i.split("=", 1) for i in row["AllocTRES"].split(",") if "=" in i)
        if alloc.get("gres/gpu") != "1":
            return ""
        out = self._output(row)
        oom = FAKE_OOM.search(out)
        total = re.search(r"GPU \d+: .* \(\w+, (\d+) MiB\)", out)
        if not (oom and total) or int(oom.group(3)) > int(total.group(1)):
            return ""
        return (f"whole GPU {oom.group(2)} of {oom.group(1)} also given as shards by Slurm: "
                f"{oom.group(4)} of its {total.group(1)} MiB free, the job needed {oom.group(3)}"
                + (f"; held by jobs {oom.group(5)}" if oom.group(5) else ""))

    def _output(self, row: dict) -> str:
        """The job's output file, or "" if it has none."""
        out = self.dir / f"{row['JobIDRaw']}.out"
        return out.read_text(errors="replace") if out.is_file() else ""

    def _check_row(self, case: Case, row: dict, tag: Tag | None) -> list[str]:
        alloc = dict(item.split("=", 1) for item in row["AllocTRES"].split(",") if "=" in item)
        node = row["NodeList"]
        node_type = NODES.get(node, ("?", set()))[0]
        problems = []
        if tag and tag.action == "share":
            unit, count = ("shard", tag.shard) if tag.shard is not None else ("mps", tag.mps)
            if alloc.get(f"gres/{unit}") != str(count) or "gres/gpu" in alloc:
                problems.append(f"AllocTRES {row['AllocTRES']} does not match the tag's "
                                f"{unit}={count}")
            if node_type not in tag.types:
                problems.append(f"share ran on {node} ({node_type}), tag names {tag.types}")
            _, partition, constraint, nodelist, exclude = PLACEMENTS[case.placement]
            expr = parse_constraint(constraint) if constraint else None
            if (node not in PARTITIONS[partition] or not satisfies(expr, NODES[node][1])
                    or (nodelist and node not in expand_hostlist(nodelist))
                    or (exclude and node in expand_hostlist(exclude))):
                problems.append(f"share ran on {node}, outside what the user asked for")
            if unit == "shard" and count * 1024 < case.mem_mib:
                problems.append(f"a {count} GiB share for a job that uses "
                                f"{case.mem_mib} MiB (sized from another job)")
            if unit == "mps" and tag.mem_mib is not None and tag.mem_mib < case.mem_mib:
                problems.append(f"an MPS limit of {tag.mem_mib} MiB for a job that uses "
                                f"{case.mem_mib} MiB")
        elif alloc.get("gres/gpu") != "1" or "gres/shard" in alloc or "gres/mps" in alloc:
            problems.append(f"kept job with AllocTRES {row['AllocTRES']}")
        return problems

    def run(self, cases: list[Case], *, timeout: float = 600, start_bound_s: float = 300) -> None:
        self.seed_history()
        threads: list[threading.Thread] = []
        for case in cases:
            self.submit(case, threads)
        self.watch(cases, threads, timeout)
        for case in cases:
            self.check(case, start_bound_s)


def _user() -> str:
    import pwd
    import os
    return pwd.getpwuid(os.getuid()).pw_name


def summary(cases: list[Case]) -> str:
    """Combinations x outcome, one table per factor, the broken cases, and the last line."""
    lines = []
    for factor in ("form", "gpu", "placement", "history", "shape"):
        counts: dict[str, Counter] = {}
        for case in cases:
            counts.setdefault(getattr(case, factor), Counter())[case.outcome] += 1
        lines.append(f"{factor:<22} {'share':>6} {'kept':>6} {'untouched':>10} {'broken':>7}")
        for level, counter in counts.items():
            lines.append(f"  {level:<20} {counter['share']:>6} {counter['kept']:>6} "
                         f"{counter['untouched']:>10} {counter['broken']:>7}")
    tags = [Tag.decode(r["AdminComment"]) if r["AdminComment"] else None
            for c in cases for r in c.records]
    whys = Counter(tag.why if tag else "(no tag)" for tag in tags)
    lines.append("tags: " + ", ".join(f"{why} {n}" for why, n in whys.most_common()))
    broken = [c for c in cases if c.outcome == "broken"]
    for case in broken:
        lines.append(f"BROKEN #{case.number} {case.combination}: {'; '.join(case.problems)}")
    for case in (c for c in cases if c.outcome == "slurm-split"):
        lines.append(f"SLURM 22.05 SHARD PLACEMENT #{case.number} {case.combination}: "
                     f"{'; '.join(case.slurm_splits)}")
    accepted = sum(c.submit_rc == 0 for c in cases)
    lines.append(f"{len(cases)} submissions ({sum(len(c.records) for c in cases)} jobs, "
                 f"tasks and components), {accepted} accepted, {len(broken)} broken")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.corpus")
    parser.add_argument("--count", type=int, default=150)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    from devcluster.cluster import TestCluster

    cluster = TestCluster()
    cluster.start()
    cases = generate(args.count, args.seed)
    started = time.monotonic()
    Corpus(cluster, seed=args.seed).run(cases, timeout=args.timeout)
    print(summary(cases))
    print(f"corpus took {time.monotonic() - started:.0f} s")
    return 0 if all(c.outcome != "broken" for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
