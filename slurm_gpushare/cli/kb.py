"""Commands for interference classes and the knowledge base.

    slurm-gpushare classes fit [--data CSV | --store DB] [--model PATH]
    slurm-gpushare classes show [--model PATH] [--json]
    slurm-gpushare classes reproduce [--json]          # Ray et al.'s clustering, re-done
    slurm-gpushare kb show [--model PATH] [--store DB] [--gpu-type T] [--json]
    slurm-gpushare kb predict-pairs PROFILES.csv [--co-runs CORUNS.csv] [--json]
    slurm-gpushare kb evaluate [--json]                # held-out figures of the pair predictor

``kb predict-pairs`` (an interface other tools call): PROFILES.csv columns
``job,gpu_util_pct,mem_util_pct,mem_used_mib,mem_total_mib,gpu_type`` (mean utilisations, %;
optional ``gpu_util_max_pct,mem_util_max_pct``); ``--co-runs`` CORUNS.csv columns
``job_a,job_b,speed_a,speed_b`` (measured throughput shared / alone, learned as per-job
corrections). Output CSV on stdout, one row per unordered pair of input rows **including each
job with itself**, in input order: ``job_a,job_b,pred_speed_a,pred_speed_b,fits_memory,
recommended``. ``fits_memory``: both jobs' memory fits together in one GPU of the smaller
memory; ``recommended``: it fits and each side's pessimistic predicted speed is at least 0.7.

The class model is read from ``--model`` (default ``$GPUSHARE_CLASSES_MODEL``, else
``$GPUSHARE_STATE_DIR/classes.json``, else ``/var/lib/slurm-gpushare/classes.json``); where
none was fitted yet, commands that only *use* classes fall back to classes fitted on the
paper's 175 records.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import click

from slurm_gpushare.core.config import DaemonConfig

# numpy, pandas, scikit-learn and the modules built on them are imported inside the commands:
# every ``slurm-gpushare`` invocation loads this module, most never need them.
FEATURES = ("MGUP", "MGMAP", "MGTSAMP")

PAIR_COLUMNS = ("job_a", "job_b", "pred_speed_a", "pred_speed_b", "fits_memory", "recommended")


def default_model_path() -> str:
    explicit = os.environ.get("GPUSHARE_CLASSES_MODEL")
    if explicit:
        return explicit
    state = os.environ.get("GPUSHARE_STATE_DIR", DaemonConfig.state_dir)
    return str(Path(state) / "classes.json")


model_option = click.option("--model", "model_path", default=default_model_path,
                            show_default="$GPUSHARE_STATE_DIR/classes.json",
                            help="Class model file.")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def _load_classes(path: str, required: bool):
    from slurm_gpushare.predict.classes import ClassModel, default_classes

    if Path(path).exists():
        try:
            return ClassModel.load(path), path
        except (OSError, ValueError, KeyError) as exc:
            raise click.ClickException(f"cannot read class model {path}: {exc}") from None
    if required:
        raise click.ClickException(f"no class model at {path} (run: slurm-gpushare classes fit)")
    return default_classes(), "built-in (fitted on the alnair 175 records)"


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=1, sort_keys=False, default=_json_default))


def _json_default(value):
    import numpy as np

    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    raise TypeError(type(value).__name__)


def _model_summary(model, source: str) -> dict[str, Any]:
    """What ``classes fit/show`` print about fitted classes (a ``classes.ClassModel``)."""
    import numpy as np

    return {
        "source": source, "k": model.k, "k_rule": "kneedle",
        "k_second_difference": model.k_second_difference,
        "silhouette": None if model.silhouette is None else round(model.silhouette, 4),
        "centroids": [dict(zip(FEATURES, np.round(c, 2).tolist())) for c in model.centroids],
        "distortions": {str(k): round(v, 3) for k, v in model.distortions.items()},
        "digest": model.digest(),
    }


def _print_model(summary: dict[str, Any]) -> None:
    click.echo(f"classes: {summary['k']} (elbow by kneedle; max second difference says "
               f"{summary['k_second_difference']}), silhouette {summary['silhouette']}")
    click.echo(f"model: {summary['source']}")
    click.echo("class  " + "  ".join(f"{f:>8}" for f in FEATURES))
    for i, centroid in enumerate(summary["centroids"]):
        click.echo(f"{i:>5}  " + "  ".join(f"{centroid[f]:>8.2f}" for f in FEATURES))


# -- classes -------------------------------------------------------------------------------
@click.group("classes")
def classes_group() -> None:
    """Interference classes (K-means over MGUP, MGMAP, MGTSAMP)."""


@classes_group.command("fit")
@click.option("--data", "data_path", type=click.Path(dir_okay=False),
              help="CSV with MGUP, MGMAP, MGTSAMP (or mgup_max, mgmap_max_pct, mgtsamp_max) "
                   "columns. Default: the alnair 175 records.")
@click.option("--store", "store_path", type=click.Path(dir_okay=False),
              help="Fit on every job summary in this store instead.")
@click.option("--k", "n_clusters", type=click.IntRange(1, 50), help="Fix k instead of the elbow.")
@click.option("--k-max", type=click.IntRange(2, 50), default=10, show_default=True)
@model_option
@json_option
def classes_fit(data_path, store_path, n_clusters, k_max, model_path, as_json) -> None:
    """Fit the classes and save them (atomically, under a file lock)."""
    import pandas as pd

    from slurm_gpushare.predict.datasets import load_alnair
    from slurm_gpushare.predict.estimators import InterferenceClasses

    if data_path and store_path:
        raise click.ClickException("give --data or --store, not both")
    if store_path:
        if not Path(store_path).exists():
            raise click.ClickException(f"no store at {store_path}")
        with _read_store(store_path) as store:
            frame = pd.DataFrame(store.all_summaries())
        source = f"{store_path} ({len(frame)} job summaries)"
    elif data_path:
        try:
            frame = pd.read_csv(data_path)
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"cannot read {data_path}: {exc}") from None
        _check_percentages(frame, data_path)
        source = f"{data_path} ({len(frame)} rows)"
    else:
        frame = load_alnair("records")
        source = "alnair clustering_record_175.csv"
    if store_path and not frame.empty:
        frame = frame.dropna(subset=["mgup_max", "mgmap_max_pct", "mgtsamp_max"])
    try:
        model = InterferenceClasses(n_clusters=n_clusters, k_max=k_max).fit(frame)
    except ValueError as exc:
        raise click.ClickException(f"cannot fit classes on {source}: {exc}") from None
    model.save(model_path)
    summary = _model_summary(model.model_, f"{model_path}, fitted on {source}")
    _echo_json(summary) if as_json else _print_model(summary)


@classes_group.command("show")
@model_option
@json_option
def classes_show(model_path, as_json) -> None:
    """Show the fitted classes."""
    model, source = _load_classes(model_path, required=True)
    summary = _model_summary(model, source)
    _echo_json(summary) if as_json else _print_model(summary)


@classes_group.command("reproduce")
@click.option("--k-max", type=click.IntRange(3, 50), default=10, show_default=True)
@json_option
def classes_reproduce(k_max, as_json) -> None:
    """Re-do Ray et al.'s clustering on their 175 records and compare with their ids."""
    from slurm_gpushare.predict.evaluate import reproduce_alnair

    result = reproduce_alnair(k_max=k_max)
    if as_json:
        _echo_json(result)
        return
    click.echo(f"k found: {result['k']} ({result['k_rule']}; paper: {result['paper_k']}; "
               f"max second difference: {result['k_second_difference']})")
    click.echo(f"silhouette: {result['silhouette']}")
    click.echo("centroids (original units):")
    for i, c in enumerate(result["centroids"]):
        click.echo(f"  class {i}: MGUP {c['MGUP']:6.2f}  MGMAP {c['MGMAP']:6.2f}  "
                   f"MGTSAMP {c['MGTSAMP']:6.2f}  ({result['class_sizes'][i]} records)")
    click.echo("Table II jobs (paper cluster -> our class):")
    for job in result["jobs"]:
        click.echo(f"  {job['task']:<22} bs {job['batch_size']:>5}  paper {job['paper_cluster']}"
                   f"  ours {job['class']}")
    table = result["contingency"]["table"]
    columns = sorted({c for row in table.values() for c in row})
    click.echo("contingency (rows: paper id, columns: our class):")
    click.echo("        " + "".join(f"{c:>5}" for c in columns))
    for paper_id, row in table.items():
        click.echo(f"  {paper_id:>5} " + "".join(f"{row.get(c, 0):>5}" for c in columns))
    click.echo(f"adjusted Rand index: {result['adjusted_rand']}; "
               f"agreement under the best id matching: {result['matched_fraction']:.0%}")


# -- knowledge base --------------------------------------------------------------------------
@click.group("kb")
def kb_group() -> None:
    """The interference knowledge base (ISD / PS per class pair) and pair predictions."""


@kb_group.command("show")
@model_option
@click.option("--store", "store_path", type=click.Path(dir_okay=False),
              help="Add the co-runs observed in this store.")
@click.option("--gpu-type", default=None, help="Look up for this GPU type.")
@click.option("--paper-classes", is_flag=True,
              help="Key the seed by the paper's cluster ids instead of the class model.")
@json_option
def kb_show(model_path, store_path, gpu_type, paper_classes, as_json) -> None:
    """Show every class pair: slowdowns, packing saving, counts, spread, verdict."""
    from slurm_gpushare.predict.knowledge import KnowledgeBase

    classes = None
    if not paper_classes:
        classes, _ = _load_classes(model_path, required=False)
    if store_path:
        if not Path(store_path).exists():
            raise click.ClickException(f"no store at {store_path}")
        with _read_store(store_path) as store:
            kb = KnowledgeBase.from_store(store, classes)
    else:
        kb = KnowledgeBase.seeded(classes)
    rows = kb.table(gpu_type)
    if as_json:
        _echo_json({"threshold": kb.threshold, "classes_digest": kb.classes_digest,
                    "pairs": rows})
        return
    click.echo(f"compatible: each side's pessimistic speed 1/(1+ISD+spread) >= {kb.threshold}")
    click.echo(f"{'a':>2} {'b':>2} {'ISD a':>7} {'ISD b':>7} {'PS':>6} {'n':>3} "
               f"{'spread':>7}  {'source':<10} compatible")
    for r in rows:
        ps = "-" if r["ps"] is None else f"{100 * r['ps']:5.1f}%"
        click.echo(f"{r['class_a']:>2} {r['class_b']:>2} {100 * r['isd_a']:6.1f}% "
                   f"{100 * r['isd_b']:6.1f}% {ps:>6} {r['count']:>3} "
                   f"{100 * max(r['isd_a_spread'], r['isd_b_spread']):6.1f}%  "
                   f"{r['source']:<10} {'yes' if r['compatible'] else 'no'}")


def _check_percentages(frame, path: str) -> None:
    """Training rows given by hand: each feature a utilisation percentage (a typo such as
    1e308 or 500 would fit classes around it)."""
    import numpy as np

    from slurm_gpushare.predict.classes import feature_matrix

    try:
        X = feature_matrix(frame)
    except ValueError as exc:
        raise click.ClickException(f"{path}: {exc}") from None
    wrong = np.argwhere((X < 0) | (X > 100))
    if len(wrong):
        row = int(wrong[0][0])
        raise click.ClickException(
            f"{path} line {row + 2}: features are percentages, between 0 and 100 "
            f"({', '.join(f'{v:g}' for v in X[row])})")


def _read_store(path: str):
    """The store at ``path`` opened read-only (never created or migrated); ClickException if
    it is not one."""
    from slurm_gpushare.daemon.store import Store, StoreError

    try:
        return Store(path, readonly=True)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None


def _read(reader, *args):
    """A pair file through ``predict.pairfiles``: its error as the command's one-line error,
    its warnings on stderr."""
    from slurm_gpushare.predict.pairfiles import PairFileError

    try:
        rows, warnings = reader(*args)
    except PairFileError as exc:
        raise click.ClickException(str(exc)) from None
    for warning in warnings:
        click.echo(f"slurm-gpushare: warning: {warning}", err=True)
    return rows


def predict_pairs(profiles: list[dict[str, Any]],
                  coruns: list[tuple[str, str, float | None, float | None]] = ()
                  ) -> list[dict[str, Any]]:
    """One prediction per unordered pair of profiles including self-pairs, in input order,
    from the pair predictor (``predict/pairs.py``) with corrections learned from ``coruns``."""
    from slurm_gpushare.predict.pairs import default_model, pair_table

    return pair_table(default_model(), profiles, coruns)


@kb_group.command("predict-pairs")
@click.argument("profiles_csv", metavar="PROFILES.csv", type=click.Path(dir_okay=False))
@click.option("--co-runs", "coruns_csv", metavar="CORUNS.csv", type=click.Path(dir_okay=False),
              help="Measured co-runs to learn per-job corrections from "
                   "(columns job_a,job_b,speed_a,speed_b).")
@json_option
def kb_predict_pairs(profiles_csv, coruns_csv, as_json) -> None:
    """Predict each job's speed for every pair of jobs in PROFILES.csv (self-pairs too).

    PROFILES.csv columns: job,gpu_util_pct,mem_util_pct,mem_used_mib,mem_total_mib,gpu_type
    (mean utilisations; a blank one was not measured), optional gpu_util_max_pct and
    mem_util_max_pct (peaks)."""
    from slurm_gpushare.predict.pairfiles import read_coruns, read_profiles

    profiles = _read(read_profiles, profiles_csv)
    coruns = _read(read_coruns, coruns_csv, {p["job"] for p in profiles}) if coruns_csv else []
    rows = predict_pairs(profiles, coruns)
    if as_json:
        _echo_json(rows)
        return
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=PAIR_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        fits = row["fits_memory"]
        writer.writerow(row | {"fits_memory": "" if fits is None else str(fits).lower(),
                               "recommended": str(row["recommended"]).lower()})
    click.echo(buffer.getvalue(), nl=False)


@kb_group.command("evaluate")
@json_option
def kb_evaluate(as_json) -> None:
    """Held-out figures: the pair predictor (leave one data set out, the project's own
    measurements included; cold and with co-runs as history) and the class lookup on the
    alnair pairs (leave one pair out)."""
    from slurm_gpushare.predict.classes import default_classes
    from slurm_gpushare.predict.evaluate import evaluate_kb_on_alnair, leave_one_data_set_out

    classes = default_classes()
    result = {
        "pair_predictor_leave_one_data_set_out": leave_one_data_set_out(),
        "class_kb_on_alnair_paper_ids": evaluate_kb_on_alnair(None),
        "class_kb_on_alnair_our_classes": evaluate_kb_on_alnair(classes),
    }
    if as_json:
        _echo_json(result)
        return
    pair_sets = result.pop("pair_predictor_leave_one_data_set_out")
    for name, entry in pair_sets.items():
        cold, history = entry["cold"], entry["with_history"]
        base = entry["baseline_sum_of_utilisations"]
        click.echo(f"pair predictor, {name} held out: Spearman {cold['spearman']} (adding "
                   f"utilisations: {base['spearman']}), recommended "
                   f"{cold['recommended_share']:.0%}, of them below 0.7x: "
                   f"{_share(cold['recommended_bad_share'])}; with {history['co_runs_per_job']} "
                   f"co-runs per job as history: Spearman {history['history_spearman']['mean']}, "
                   f"recommended {history['history_recommended_share']['mean']:.0%}, below "
                   f"0.7x: {_share(history['history_recommended_bad_share']['mean'])}")
    for name, figures in result.items():
        line = (f"{name}: Spearman {figures['spearman']}, MAE {figures['mae']}, "
                f"recommended {figures['recommended_pairs']}/{figures['pairs']} pairs, "
                f"{figures['recommended_below_threshold']} of them below "
                f"{figures['threshold']}x (all pairs: "
                f"{figures['all_pairs_below_threshold_rate']:.1%} below)")
        click.echo(line)


def _share(value) -> str:
    return "-" if value is None else f"{value:.0%}"


commands = [classes_group, kb_group]
