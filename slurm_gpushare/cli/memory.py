"""``memory evaluate|predict``: the memory predictor's accuracy and single predictions."""

from __future__ import annotations
import json
import math
import warnings
from pathlib import Path
import click
from sklearn.exceptions import ConvergenceWarning
from slurm_gpushare.core.gpus import UnknownGpu, default_catalogue
from slurm_gpushare.predict.evaluate import _pct, _render_table, evaluate, render


@click.group("memory")
def memory_group() -> None:
    """GPU memory prediction: evaluation and one-job answers."""


@memory_group.command("evaluate")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--data", "data", type=click.Path(file_okay=False, path_type=Path),
              help="Directory holding schedtune/ and gavel/ (default: the packaged copy).")
@click.option("--seeds", default=3, show_default=True, type=click.IntRange(min=1),
              help="Random splits to average.")
@click.option("--coverage", default=1.0, show_default=True, help="Conformal coverage.")
def evaluate_command(as_json: bool, data: Path | None, seeds: int, coverage: float) -> None:
    """Print the SchedTune replication, privacy-preserving, OOM-safety and run-time tables."""
    if data is not None and not (data / "schedtune").is_dir():
        raise click.ClickException(f"{data} has no schedtune/ directory")
    if not 0 < coverage <= 1:
        raise click.ClickException("--coverage must be in (0, 1]")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # the MLP baseline on 180 rows
        result = evaluate(data, seeds=seeds, coverage=coverage)
    click.echo(json.dumps(result, indent=2) if as_json else render(result))


def _plausible_mib(mib: float) -> bool:
    """A peak or a hint in MiB: positive, finite, at most what the daemon takes in a hint."""
    from slurm_gpushare.daemon.protocol import MAX_HINT_MIB

    return math.isfinite(mib) and 0 < mib <= MAX_HINT_MIB


def _parse_observed(values) -> dict[str, list[float]]:
    observed: dict[str, list[float]] = {}
    for text in values:
        name, sep, peak = text.rpartition(":")
        try:
            mib = float(peak)
        except ValueError:
            mib = math.nan
        if not sep or not name or not _plausible_mib(mib):
            raise click.ClickException(f"--observed wants TYPE:PEAK_MIB, got {text!r}")
        observed.setdefault(name, []).append(mib)
    return observed


@memory_group.command("predict")
@click.option("--observed", "observed", multiple=True, required=True, metavar="TYPE:PEAK_MIB",
              help="Peak GPU memory of an earlier run on a catalogue GPU model, e.g. "
                   "V100-16GB:9000 (repeatable).")
@click.option("--target", "targets", multiple=True, metavar="TYPE",
              help="GPU type to predict for (repeatable; default: the whole catalogue).")
@click.option("--hint-mib", type=float, help="The user's memory hint (pre-allocating jobs).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def predict_command(observed, targets, hint_mib, as_json: bool) -> None:
    """Predict a job's safe peak memory and shard count on other GPU types."""
    from slurm_gpushare.core.config import GpuType
    from slurm_gpushare.predict.memory import default_predictor, estimate_memory

    catalogue = default_catalogue()
    if hint_mib is not None and not _plausible_mib(hint_mib):
        raise click.ClickException(f"--hint-mib must be a positive number of MiB, got {hint_mib:g}")
    runs = _parse_observed(observed)
    try:
        runs = {catalogue.lookup(name).model: peaks for name, peaks in runs.items()}
        specs = [catalogue.lookup(t) for t in targets] or list(catalogue)
    except UnknownGpu as exc:
        raise click.ClickException(str(exc)) from None
    # Each catalogue model as a GPU type of its own, with its nominal memory.
    gpu_types = [GpuType(name=s.model, memory_gib=int(s.memory_gib), model=s.model)
                 for s in specs]
    verdict = estimate_memory(runs, gpu_types, default_predictor(), hint_mib=hint_mib)
    answers = [{"type": e.gpu_type, "predicted_mib": round(e.predicted_mib, 1),
                "margin": round(e.margin, 4), "safe_mib": round(e.safe_mib, 1),
                "shards_gib": e.shards, "fits": e.fits, "reason": e.reason}
               for e in verdict.per_type.values()]
    if as_json:
        click.echo(json.dumps({"known": verdict.known, "source": verdict.source,
                               "reason": verdict.reason, "types": answers}, indent=2))
        return
    if not verdict.known:
        click.echo(f"unknown: {verdict.reason}")
        return
    rows = [[a["type"], f"{a['predicted_mib']:.0f}", _pct(a["margin"]), f"{a['safe_mib']:.0f}",
             str(a["shards_gib"]) if a["fits"] else "does not fit"] for a in answers]
    click.echo(_render_table(f"Predicted peak GPU memory ({verdict.reason})",
                             ["type", "peak MiB", "margin", "safe MiB", "shards"], rows))


commands = [memory_group]
