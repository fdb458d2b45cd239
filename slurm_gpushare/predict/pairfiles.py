"""The pair predictor's files: PROFILES.csv (one row per job's solo telemetry) and CORUNS.csv
(measured co-runs), as ``kb predict-pairs`` reads them and as every data set in that format is
loaded (the project's measurements, public sets kept for evaluation). One reader, validated:
a bad value is a ``PairFileError`` naming the file and line; what can be read despite an
oddity comes with one-line warnings for the caller to show.

PROFILES.csv: ``job,gpu_util_pct,mem_util_pct,mem_used_mib,mem_total_mib,gpu_type`` and optional
``gpu_util_max_pct,mem_util_max_pct``. Utilisations in percent (NVML's), means over the run; a
blank figure was not measured: for a utilisation the model then reads the peak, or the other
utilisation (``pairs.demand_of``); with a memory figure blank, whether a pair fits is unknown.

CORUNS.csv: ``job_a,job_b,speed_a,speed_b``, each side's throughput shared / alone. A blank speed
was not measured; 0 (no progress next to the partner) and speeds above 1 (noise) are
measurements, which learning reads clipped to (0, 1]; one above ``MAX_SPEED`` is refused as a
percentage. A co-run naming a job without a profile is left out, with a warning.
"""

from __future__ import annotations

import csv
import math
from typing import Any

PROFILE_COLUMNS = ("job", "gpu_util_pct", "mem_util_pct", "mem_used_mib", "mem_total_mib",
                   "gpu_type")
OPTIONAL_PROFILE_COLUMNS = ("gpu_util_max_pct", "mem_util_max_pct")
UTILISATION_COLUMNS = ("gpu_util_pct", "mem_util_pct", *OPTIONAL_PROFILE_COLUMNS)
CORUN_COLUMNS = ("job_a", "job_b", "speed_a", "speed_b")
# A measured speed above this is not a speed: most likely a percentage (95 for 0.95).
MAX_SPEED = 5.0

CoRunRow = tuple[str, str, "float | None", "float | None"]


class PairFileError(ValueError):
    """A file that cannot be read as it is; the message names the file and line."""


def _csv_rows(path: str, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """``(line, row)`` of a CSV with ``required`` columns, values stripped."""
    try:
        # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name.
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            columns = [c.strip() for c in reader.fieldnames or []]
            missing = [c for c in required if c not in columns]
            if missing:
                raise PairFileError(f"{path}: missing column(s) {', '.join(missing)}")
            return [(line, {k.strip(): (v or "").strip() for k, v in raw.items() if k})
                    for line, raw in enumerate(reader, start=2)]
    except OSError as exc:
        raise PairFileError(f"cannot read {path}: {exc.strerror}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise PairFileError(f"cannot read {path}: {exc}") from None


def _number(path: str, line: int, name: str, text: str, *, optional: bool = False,
            upper: float | None = None) -> float | None:
    if optional and text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise PairFileError(f"{path} line {line}: {name} is not a number") from None
    if not math.isfinite(value) or value < 0 or (upper is not None and value > upper):
        what = (f"a number between 0 and {upper:g}" if upper is not None
                else "a non-negative number")
        raise PairFileError(f"{path} line {line}: {name} must be {what}")
    return value


def read_profiles(path: str) -> tuple[list[dict[str, Any]], list[str]]:
    """``(rows, warnings)`` of a PROFILES.csv: one dict per job (``job``, ``gpu_type`` and the
    figures, None where blank), in file order."""
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for line, raw in _csv_rows(path, PROFILE_COLUMNS):
        row: dict[str, Any] = {"job": raw["job"], "gpu_type": raw.get("gpu_type") or None}
        if not row["job"]:
            raise PairFileError(f"{path} line {line}: empty job")
        if row["job"] in seen:
            raise PairFileError(f"{path} line {line}: job {row['job']} appears twice")
        seen.add(row["job"])
        for name in PROFILE_COLUMNS[1:5]:
            upper = 100.0 if name.endswith("_pct") else None
            row[name] = _number(path, line, name, raw[name], upper=upper, optional=True)
        for name in OPTIONAL_PROFILE_COLUMNS:
            row[name] = _number(path, line, name, raw.get(name, ""), optional=True, upper=100.0)
        if all(row[name] is None for name in UTILISATION_COLUMNS):
            raise PairFileError(f"{path} line {line}: gpu_util_pct is blank, and so are "
                                "mem_util_pct and the peaks")
        if row["mem_total_mib"] is not None and row["mem_total_mib"] <= 0:
            raise PairFileError(f"{path} line {line}: mem_total_mib must be > 0")
        rows.append(row)
    warnings = []
    utilisations = [row[name] for row in rows for name in UTILISATION_COLUMNS
                    if row[name] is not None]
    if len(rows) > 1 and max(utilisations, default=0) <= 1.0 and any(utilisations):
        # DCGM's profiling fields (e.g. GR_ENGINE_ACTIVE) are ratios, NVML's are percentages.
        warnings.append(f"{path}: every utilisation is at most 1%: they are read as percentages "
                        "(95 for a GPU busy 95% of the time); ratios (0.95) would make every "
                        "job look idle")
    return rows, warnings


def read_coruns(path: str, jobs: set[str]) -> tuple[list[CoRunRow], list[str]]:
    """``(rows, warnings)`` of a CORUNS.csv: ``(job_a, job_b, speed_a, speed_b)`` per co-run
    whose jobs are both in ``jobs`` (a speed None where blank)."""
    out: list[CoRunRow] = []
    unknown: list[str] = []
    skipped = 0
    for line, raw in _csv_rows(path, CORUN_COLUMNS):
        speeds = []
        for name in ("speed_a", "speed_b"):
            value = _number(path, line, name, raw[name], optional=True)
            if value is not None and value > MAX_SPEED:
                raise PairFileError(
                    f"{path} line {line}: {name} {value:g} is not a normalised speed "
                    "(throughput shared / alone, e.g. 0.95, not 95)")
            speeds.append(value)
        missing = [raw[name] for name in ("job_a", "job_b") if raw[name] not in jobs]
        if missing:
            skipped += 1
            unknown += [job for job in missing if job not in unknown]
            continue
        out.append((raw["job_a"], raw["job_b"], speeds[0], speeds[1]))
    warnings = []
    if skipped:
        names = ", ".join(repr(job) for job in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        warnings.append(f"{path}: {skipped} co-run(s) left out: {len(unknown)} job(s) without "
                        f"a profile ({names})")
    return out, warnings
