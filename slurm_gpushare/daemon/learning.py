"""Learning from telemetry: a finished job's summary becomes history under its fingerprint
keys, its co-runs are recorded (with both jobs' classes, for the class knowledge base that
`kb show` and the reports build from the store) and teach the pair predictor, and a share that
outgrew its memory is reported (and requeued where the admin chose so). Runs on the record
writer's thread, never on the request path."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from slurm_gpushare.core.config import Config
from slurm_gpushare.daemon.logs import event
from slurm_gpushare.daemon.store import Store
from slurm_gpushare.slurm import cmd
from slurm_gpushare.slurm.jobs import lookup_job


class Learner:
    """What the writer thread learns from a stored summary: history under the job's keys, its
    co-runs (recorded with both classes for the class knowledge base, which no decision reads)
    and the pair predictor's corrections."""

    def __init__(self, store: Store, estimator, *, count: Callable[[str], None],
                 pairing=None):
        self.store = store
        self.estimator = estimator
        self.count = count
        self.pairing = pairing  # daemon.pairing.Pairing: per-job corrections from co-runs
        self._compacted_at = 0.0  # monotonic; 0: not yet since start
        self._memory_checked: set[tuple[str, int]] = set()  # (GPU model, MiB configured)

    COMPACT_EVERY_S = 86400.0

    def requeue(self, job_id: str, peak_mib: float, config: Config) -> None:
        """On the writer thread: requeue a job that outgrew its share, re-sized from its peak
        (``requeue.requeue_resized``)."""
        from slurm_gpushare.daemon.requeue import requeue_resized

        try:
            job = lookup_job(job_id)
            ok, detail = (requeue_resized(job, peak_mib, config) if job is not None
                          else (False, "job not found"))
        except (cmd.SlurmError, ValueError) as exc:
            ok, detail = False, str(exc)
        self.count("requeued" if ok else "requeue-failed")
        event(logging.WARNING if ok else logging.ERROR, "requeued" if ok else "requeue-failed",
               job_id=job_id, detail=detail)

    def learn(self, summary: dict[str, Any], config: Config) -> None:
        """On the writer thread, for a summary already stored: tie the job to its decision,
        so the summary becomes history under the job's fingerprint keys."""
        job_id = str(summary.get("job_id", ""))
        job = lookup_job(job_id) if job_id else None
        linked = bool(job and job.decision_id and self.store.link_decision(
            job.decision_id, job_id, str(summary.get("cluster", ""))))
        if self.estimator is not None:  # only estimates that read this job's keys go stale
            self.estimator.invalidate_keys(self.store.keys_of_job(
                job_id, str(summary.get("cluster", ""))) + list(summary.get("keys") or []))
        if self.pairing is not None:
            self.pairing.invalidate()
        learned = self._learn_coruns(summary, job, config) if linked else 0
        self._check_share(summary, job)
        self._check_memory(summary, config)
        event(logging.INFO, "ingested", job_id=job_id, gpu_index=summary.get("gpu_index"),
               gpu_model=summary.get("gpu_model"), peak_mib=summary.get("mgmap_max_mib"),
               linked=linked, coruns=len(summary.get("coruns") or []), learned=learned)
        self._compact(config)

    def _compact(self, config: Config) -> None:
        """Apply ``daemon.history_retention_days``, at most once a day."""
        now = time.monotonic()
        if self._compacted_at and now - self._compacted_at < self.COMPACT_EVERY_S:
            return
        self._compacted_at = now
        removed = self.store.compact(config.daemon.history_retention_days)
        if removed:
            event(logging.INFO, "store-compacted", removed=removed,
                  retention_days=config.daemon.history_retention_days)

    def _check_share(self, summary: dict[str, Any], job) -> None:
        """gres/shard sets no hardware limit: record a job that used more than its share, so
        admins see it (log event, counter, report) before a co-runner runs out of memory."""
        limit = job.tag.limit_mib if job and job.tag else None
        peak = summary.get("mgmap_max_mib")
        if limit is None or peak is None or peak <= limit:
            return
        self.count("share-exceeded")
        event(logging.WARNING, "share-exceeded", job_id=job.job_id, share_gib=round(limit / 1024, 1),
               peak_mib=peak, gpu_model=summary.get("gpu_model"), uid=job.uid)

    def _check_memory(self, summary: dict[str, Any], config: Config) -> None:
        """Warn once per GPU model and setting when a type's ``memory_gib`` promises more memory
        than its GPUs report: the shards above what NVML reports do not exist (an H100 80GB
        reports 81,559 MiB, under the 81,920 of memory_gib = 80; data/measured/h100)."""
        from slurm_gpushare.predict.history import config_type_of

        model, reported = summary.get("gpu_model"), summary.get("mem_total_mib")
        if (not isinstance(model, str) or isinstance(reported, bool)
                or not isinstance(reported, (int, float)) or not reported > 0):
            return
        name = config_type_of(model, config)
        if name is None:
            return
        configured = config.gpu_type(name).memory_gib * 1024
        if (model, configured) in self._memory_checked:
            return
        self._memory_checked.add((model, configured))
        if reported < configured:
            self.count("memory-overstated")
            event(logging.WARNING, "memory-overstated", gpu_type=name, gpu_model=model,
                  configured_mib=configured, reported_mib=round(reported),
                  fix=f"memory_gib = {int(reported // 1024)}")

    def _learn_coruns(self, summary: dict[str, Any], job, config: Config) -> int:
        """Record this job's side of each co-run (its class and measured slowdown); the pair
        predictor learns from each measured side. Returns the sides recorded."""
        from slurm_gpushare.predict.history import config_type_of, observed_runtimes
        from slurm_gpushare.predict.knowledge import measured_isd
        from slurm_gpushare.predict.pairs import MEASURED_OVERLAP

        coruns = [c for c in summary.get("coruns") or [] if c.get("job_id")]
        record = self.store.decision(job.decision_id) if coruns else None
        if not record:
            return 0
        duration = float(summary.get("duration_s") or 0)
        # The job's solo time from its own script's or name's runs, never the user's other jobs.
        solo = observed_runtimes(self.store.history(_sizing_keys(record.get("keys", [])))).get(
            summary.get("gpu_model", ""))
        gpu_type = config_type_of(summary.get("gpu_model", ""), config)
        cluster = str(summary.get("cluster", ""))
        recorded = 0
        for corun in coruns:
            other_id = str(corun["job_id"])
            other = lookup_job(other_id)
            other_class = other.tag.job_class if other and other.tag else None
            # Whether one user runs both: only then does this job's measured slowdown (its run
            # time, which its user controls) teach how much the partner hurts.
            uids = (job.uid, other.uid if other else None)
            same_user = None if None in uids else uids[0] == uids[1]
            # A measured slowdown only when the co-run covered (nearly) the whole run.
            isd = (measured_isd(duration, solo) if solo and duration
                   and float(corun.get("overlap_s") or 0) >= MEASURED_OVERLAP * duration else None)
            self.store.record_corun(
                job.job_id, str(corun["job_id"]), cluster=cluster,
                gpu_uuid=str(summary.get("gpu_uuid") or ""), overlap_s=corun.get("overlap_s"),
                gpu_type=gpu_type, class_a=record.get("job_class"),
                class_b=int(other_class) if other_class is not None else None, isd_a=isd,
                same_user=same_user)
            recorded += 1
        if self.pairing is not None:
            after = self._corun_rows(job.job_id)
            measured = [after[o] for o in dict.fromkeys(str(c["job_id"]) for c in coruns)
                        if after.get(o) is not None]
            if measured:
                self.pairing.observe(measured)  # learns from each measured side
        return recorded

    def _corun_rows(self, job_id: str) -> dict[str, dict[str, Any]]:
        """The job's co-run observations by partner (one query, not one per partner)."""
        rows: dict[str, dict[str, Any]] = {}
        for row in self.store.coruns_of(job_id):
            rows.setdefault(row["job_b"], row)
        return rows


def _sizing_keys(keys: list[str]) -> list[str]:
    """A decision record's keys (``JobKeys.as_list()``: script, name, user) less the user's."""
    return keys[:-1] if len(keys) > 1 else []
