"""The public data sets, one section each: every read of alnair, SchedTune, Gavel, Ryu & Chun,
Philly and Alibaba openb goes through this module.

They live in two places:

- the copies shipped in the package (``slurm_gpushare/data``; the licences allow it: alnair
  Apache-2.0, SchedTune and Gavel MIT), which the predictors fit on, so a wheel install works
  without anything else;
- the full public sets (``$GPUSHARE_DATA``, else ``../shared/data`` next to the repository, or
  the ``--data`` option of a command), which the simulator and the benchmarks read: the traces
  and the files too large or too raw to ship.

A loader that is given a data directory reads the public layout there; without one it reads the
packaged copy. pandas is imported inside the loaders: importing this module stays cheap.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from slurm_gpushare.core.gpus import Catalogue

DATA_ENV = "GPUSHARE_DATA"


class MissingDataSet(FileNotFoundError):
    """A data set file that is not where it was looked for."""


class UnreadableDataSet(ValueError):
    """A data set file that is not UTF-8 text."""


def package_dir() -> Path:
    """The packaged data (copies of alnair, SchedTune and Gavel, the catalogue, clusters)."""
    return Path(str(resources.files("slurm_gpushare").joinpath("data")))


def package_path(*parts: str) -> Path:
    """Path of a file shipped in ``slurm_gpushare/data``."""
    return package_dir().joinpath(*parts)


def default_data_dir() -> Path:
    """The public data sets: $GPUSHARE_DATA, else ../shared/data next to the repository."""
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV])
    return Path(__file__).resolve().parents[3] / "shared" / "data"


def _read_csv(path: Path, what: str) -> "pd.DataFrame":
    import pandas as pd

    if not path.exists():
        raise MissingDataSet(f"{what} not found at {path}")
    try:
        return pd.read_csv(path)
    except UnicodeDecodeError as exc:
        raise UnreadableDataSet(f"cannot read {what} at {path}: not UTF-8 text "
                                f"(byte {exc.start})") from None


# -- alnair (Ray et al., CCGridW 2023) ---------------------------------------------------------
ALNAIR_TABLES = {
    "records": "clustering_record_175.csv",  # the K-means input: 49 jobs + interpolated batches
    "jobs": "job_records.csv",  # task -> label-encoded model code (packaged only)
    "single_runs": "single_runs_table2.csv",  # Table II: 12 jobs alone
    "pairs": "pairs_tables3_4.csv",  # Tables III/IV: 34 measured pairs
}
# The paper's telemetry features: max GPU utilisation, memory allocated, memory-access time (%).
ALNAIR_FEATURES = ("MGUP", "MGMAP", "MGTSAMP")


def load_alnair(table: str, data_dir: str | os.PathLike | None = None) -> "pd.DataFrame":
    """One of alnair's tables (``ALNAIR_TABLES``) as published, from the package or
    ``data_dir``/alnair."""
    if table not in ALNAIR_TABLES:
        raise ValueError(f"unknown alnair table {table!r} ({', '.join(ALNAIR_TABLES)})")
    base = Path(data_dir) / "alnair" if data_dir else package_path("alnair")
    return _read_csv(base / ALNAIR_TABLES[table], f"alnair {table}")


def alnair_job_telemetry(table: pd.DataFrame) -> pd.DataFrame:
    """Adds MGUP, MGMAP, MGTSAMP to rows naming (task, batch size), e.g. Table II, from the
    matching row of the 175-record file."""
    codes = load_alnair("jobs").set_index("task")["model_code"]
    records = load_alnair("records").set_index(["Model", "Batch Size"])
    out = table.copy()
    rows = [records.loc[(int(codes[t]), int(b))] for t, b in zip(out["task"], out["batch_size"])]
    for feature in ALNAIR_FEATURES:
        out[feature] = [float(r[feature]) for r in rows]
    return out


# -- SchedTune (Albahar et al.) ----------------------------------------------------------------
# SchedTune names its GPUs only by their characteristics; CUDA cores tell them apart.
SCHEDTUNE_GPUS = {2496: "K80", 2560: "RTX2070S", 5120: "V100-16GB", 5888: "RTX3070",
                  10496: "RTX3090"}
SCHEDTUNE_COLUMNS = ["model", "batch_size", "activations_mb", "parameters_mb", "input_mb",
                     "peak_mib", "cuda_cores", "memory_bandwidth_gbs", "memory_clock_mhz",
                     "tensor_cores", "sm_count"]


def load_schedtune(path: str | os.PathLike | None = None,
                   catalogue: "Catalogue | None" = None) -> "pd.DataFrame":
    """SchedTune's model_stats.csv with the GPU named and a ``fits`` label per row.

    A row fits when its peak is within the GPU's usable memory; the others are the paper's
    interpolations for runs that hit OOM and must not be used as measurements.
    """

    from slurm_gpushare.core.gpus import default_catalogue

    catalogue = catalogue or default_catalogue()
    path = Path(path) if path else package_path("schedtune", "model_stats.csv")
    if path.is_dir():
        path = path / "model_stats.csv"
    frame = _read_csv(path, "SchedTune's model_stats.csv")
    if len(frame.columns) != len(SCHEDTUNE_COLUMNS):
        raise ValueError(f"{path}: expected {len(SCHEDTUNE_COLUMNS)} columns")
    frame.columns = SCHEDTUNE_COLUMNS
    unknown = set(frame.cuda_cores) - set(SCHEDTUNE_GPUS)
    if unknown:
        raise ValueError(f"{path}: unknown GPU with {sorted(unknown)} CUDA cores")
    frame["gpu"] = frame.cuda_cores.map(SCHEDTUNE_GPUS)
    frame["usable_mib"] = frame.gpu.map(lambda m: catalogue.lookup(m).usable_mib)
    frame["fits"] = frame.peak_mib <= frame.usable_mib
    frame["job"] = frame.model + "/bs" + frame.batch_size.astype(str)
    return frame


# -- Gavel (Narayanan et al., OSDI 2020) -------------------------------------------------------
GAVEL_GPUS = {"k80": "K80", "p100": "P100", "v100": "V100-16GB"}
GAVEL_JSON = "gavel/simulation_throughputs.json"


def load_gavel_isolated(path: str | os.PathLike | None = None) -> "pd.DataFrame":
    """Gavel's isolated throughputs at scale 1: columns job, gpu (catalogue model), throughput.
    ``path``: a file, or a directory holding the packaged or the public flattened table."""
    import pandas as pd

    path = Path(path) if path else package_path("gavel")
    if path.is_dir():
        names = ["isolated_throughputs.csv", "DERIVED_gavel_isolated_throughputs.csv"]
        found = [path / n for n in names if (path / n).exists()]
        if not found:
            raise FileNotFoundError(f"no Gavel throughput table in {path}")
        path = found[0]
    frame = _read_csv(path, "Gavel's isolated throughputs")
    frame = frame[frame.scale_factor == 1]
    return pd.DataFrame({"job": frame.job, "gpu": frame.gpu.map(GAVEL_GPUS),
                         "throughput": frame.tput_alone.astype(float)}).reset_index(drop=True)


def load_gavel_pairs() -> "pd.DataFrame":
    """Gavel's measured pairs at scale 1, flattened (packaged: ``interference/``), one row per
    pair and GPU with both throughputs, normalised speeds and the failed / filled-in flags."""
    return _read_csv(package_path("interference", "gavel_pairs_scale1.csv"), "Gavel pairs")


def load_gavel_throughputs(data_dir: str | os.PathLike) -> dict:
    """Gavel's ``simulation_throughputs.json`` as published (the simulator's ground truth):
    ``{gpu: {"('<job type>', <scale>)": {"null": alone, "('<other>', <scale>)": [self, other]}}}``."""
    path = Path(data_dir) / GAVEL_JSON
    if not path.exists():
        raise MissingDataSet(f"Gavel throughputs not found at {path}")
    return json.loads(path.read_text())


# -- Ryu & Chun (contention sensitivity, TITAN RTX with MPS) -----------------------------------
def load_ryu_chun(data_dir: str | os.PathLike | None = None) -> "pd.DataFrame":
    """Table 1 of the paper (profiled SM, memory, L2 and DRAM bandwidth %), indexed by model."""
    data_dir = Path(data_dir) if data_dir else default_data_dir()
    return _read_csv(data_dir / "ryu_chun" / "table1_profiles.csv",
                     "Ryu & Chun profiles").set_index("model")


# -- measured here: the workload set of bench/gpu_measure.py on a real GPU -------------------
MEASURED_GPUS = ("h100", "h200")


def load_measured(gpu: str = "h100") -> tuple[list[tuple[str, str, float, float]],
                                              dict[str, dict]]:
    """The project's own co-run measurements on ``gpu`` (``data/measured/<gpu>``, see its
    README): ``(pairs, profiles)`` as ``kb predict-pairs`` reads them -- pairs as
    ``(job_a, job_b, speed_a, speed_b)`` (time slicing, normalised to the job alone), profiles
    by job (mean and max utilisations, peak memory, the GPU's memory)."""
    folder = package_path("measured", gpu)
    return load_pair_set(folder / "profiles.csv", folder / "coruns.csv", f"measured on {gpu}")


def load_pair_set(profiles_csv: str | os.PathLike, coruns_csv: str | os.PathLike,
                  what: str = "pair set") -> tuple[list[tuple[str, str, float, float]],
                                                   dict[str, dict]]:
    """A set of measured pairs in the files ``kb predict-pairs`` reads, through its reader
    (``pairfiles``): ``(pairs, profiles)`` as ``load_measured`` gives them. Only pairs with
    both speeds measured (the others cannot be judged) and whose jobs have a profile."""
    from slurm_gpushare.predict.pairfiles import PairFileError, read_coruns, read_profiles

    for path, kind in ((profiles_csv, "profiles"), (coruns_csv, "co-runs")):
        if not Path(path).exists():
            raise MissingDataSet(f"{kind} ({what}) not found at {path}")
    try:
        rows, _ = read_profiles(str(profiles_csv))
        coruns, _ = read_coruns(str(coruns_csv), {row["job"] for row in rows})
    except PairFileError as exc:
        raise UnreadableDataSet(f"{what}: {exc}") from None
    pairs = [(a, b, speed_a, speed_b) for a, b, speed_a, speed_b in coruns
             if speed_a is not None and speed_b is not None]
    return pairs, {row["job"]: {k: v for k, v in row.items() if k != "job"} for row in rows}


# -- traces: Microsoft Philly, Alibaba openb -------------------------------------------------
PHILLY_CSV = "traces/philly/philly_jobs.csv"
OPENB_PODS = "traces/alibaba_openb/openb_pod_list_default.csv"


def load_philly(data_dir: str | os.PathLike) -> "pd.DataFrame":
    """The Philly job log as prepared by the Sia artifact (timestamp, duration, num_gpus, ...)."""
    return _read_csv(Path(data_dir) / PHILLY_CSV, "Philly trace")


def load_openb(data_dir: str | os.PathLike) -> "pd.DataFrame":
    """Alibaba openb's pod list (FGD): one row per pod with gpu_milli, gpu_spec, times."""
    return _read_csv(Path(data_dir) / OPENB_PODS, "openb trace")
