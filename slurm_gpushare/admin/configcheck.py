"""``slurm-gpushare check-config`` and ``gen-config``: is this cluster set up for sharing?

check-config reads the running configuration (``scontrol show config``, ``scontrol show node``,
``scontrol show partition``; from the environment's ``SLURM_CONF``, i.e. the live slurmctld)
*and* the files (``slurm.conf`` and ``gres.conf``, the hook's files beside them, the daemon's
TOML), and checks everything sharing depends on. Each problem comes with its fix: the exact
line to set, or the command to run. Files and the running controller are checked separately:
a fixed file that slurmctld has not re-read yet, or a file that lost a setting the controller
still runs with (it breaks at the next restart), both show.

gen-config writes the gres.conf / slurm.conf fragments for GPU nodes: one shard per GiB of
GPU memory, the GPU type's feature on each node.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence


from slurm_gpushare import HOOK_DIR
from slurm_gpushare.core.errors import UserError
from slurm_gpushare.core.hostlist import expand_hostlist
from slurm_gpushare.slurm import cmd
from slurm_gpushare.slurm.version import SlurmVersion, installed_version
from slurm_gpushare.core.config import DEFAULT_CONFIG_PATH, CONFIG_ENV, Config, ConfigError, load_config, shards_per_gpu
from slurm_gpushare.user.explain import parse_scontrol_line, request

REPO_LUA = HOOK_DIR
HOOK_FILES = ("job_submit.lua", "gpushare_tres.lua")
HOOK_SETTINGS = "gpushare_hook.json"
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
LUA_VERSION = "5.1"  # Debian's job_submit_lua.so links liblua5.1



class ProblemsFound(UserError):
    """check-config found errors (exit status 1)."""


@dataclass(frozen=True)
class Finding:
    check: str  # stable id, e.g. "gres-types"
    level: str  # "error", "warning" or "ok"
    message: str  # what is wrong (or right)
    fix: str = ""  # the exact line to set or the command to run
    where: str = ""  # file path, or "slurmctld" for the running configuration


# ---- Slurm's files ---------------------------------------------------------------------------

def _logical_lines(path: Path, seen: set[Path] | None = None) -> Iterable[tuple[Path, str]]:
    """A Slurm config file's lines: comments dropped, ``\\`` continuations joined, Include
    files followed (relative to the including file's directory)."""
    seen = seen or set()
    path = path.resolve()
    if path in seen:
        return
    seen.add(path)
    pending = ""
    for raw in path.read_text(errors="replace").splitlines():
        line = re.sub(r"(?<!\\)#.*$", "", raw).rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = (pending + line).strip(), ""
        if not line:
            continue
        include = re.match(r"^include\s+(.+)$", line, re.IGNORECASE)
        if include:
            for name in sorted(glob.glob(str(path.parent / include.group(1).strip()))):
                yield from _logical_lines(Path(name), seen)
            continue
        yield path, line


def _pairs(line: str) -> list[tuple[str, str]]:
    return [(k, v.strip('"')) for k, v in re.findall(r'([A-Za-z][A-Za-z0-9_]*)=("[^"]*"|\S*)',
                                                    line)]


@dataclass
class SlurmConf:
    path: Path
    params: dict[str, str] = field(default_factory=dict)  # lower-case key -> value
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> lower-case keys
    node_lines: dict[str, str] = field(default_factory=dict)  # node -> its NodeName line
    partitions: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def read(cls, path: str | os.PathLike) -> "SlurmConf":
        conf = cls(Path(path))
        node_defaults: dict[str, str] = {}
        for _source, line in _logical_lines(Path(path)):
            pairs = _pairs(line)
            if not pairs:
                continue
            first = pairs[0][0].lower()
            record = {k.lower(): v for k, v in pairs}
            if first == "nodename":
                if record["nodename"].upper() == "DEFAULT":
                    node_defaults.update({k: v for k, v in record.items() if k != "nodename"})
                    continue
                for name in expand_hostlist(record["nodename"]):
                    conf.nodes[name] = {**node_defaults, **record}
                    conf.node_lines[name] = line
            elif first == "partitionname":
                conf.partitions[record["partitionname"]] = record
            elif first in ("nodeset", "frontendname", "downnodes", "switchname"):
                continue
            else:
                conf.params.update(record)
        return conf

    def get(self, key: str) -> str | None:
        return self.params.get(key.lower())


def gres_tokens(text: str | None) -> list[tuple[str, str | None, int]]:
    """``gpu:v100:2(S:0-1),shard:v100:32`` -> [(name, type, count)]; ``(null)`` -> []."""
    tokens = []
    for raw in re.sub(r"\([^)]*\)", "", text or "").split(","):
        parts = [p for p in raw.strip().split(":") if p != ""]
        if not parts or parts[0] in ("(null)", "null"):
            continue
        if parts[0] == "gres" and len(parts) > 1:
            parts = parts[1:]
        name, gtype, count = parts[0], None, 1
        rest = parts[1:]
        if rest and re.fullmatch(r"\d+[KMGkmg]?", rest[-1]):
            number = rest.pop()
            scale = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}.get(number[-1].lower(), 1)
            count = int(number.rstrip("KMGkmg")) * scale
        if rest:
            gtype = rest[0]
        tokens.append((name, gtype, count))
    return tokens


def gres_conf_shards(path: Path, nodes: Iterable[str], name: str = "shard") -> dict[str, int]:
    """Units of a sharing gres (shard, or mps) per node as gres.conf declares them (lines
    without NodeName= apply to all)."""
    nodes = list(nodes)
    shards: dict[str, int] = {}
    for _source, line in _logical_lines(path):
        record = {k.lower(): v for k, v in _pairs(line)}
        if record.get("name") != name:
            continue
        if "count" in record:
            count_value = gres_tokens(f"{name}:{record['count']}")[0][2]
        else:  # one shard per File= entry, as Slurm counts them
            count_value = len(expand_hostlist(record["file"])) if "file" in record else 1
        targets = expand_hostlist(record["nodename"]) if "nodename" in record else nodes
        for node in targets:
            shards[node] = shards.get(node, 0) + count_value
    return shards


# ---- the running configuration ---------------------------------------------------------------

@dataclass
class LiveSlurm:
    """What slurmctld reports; ``error`` set when it could not be asked."""

    config: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    partitions: set[str] = field(default_factory=set)
    error: str = ""

    @classmethod
    def query(cls) -> "LiveSlurm":
        live = cls()
        try:
            result = cmd.run(["scontrol", "show", "config"], timeout=20)
        except cmd.SlurmError as exc:
            live.error = str(exc)
            return live
        if not result.ok:
            live.error = result.message
            return live
        for line in result.stdout.splitlines():
            match = re.match(r"^(\S+)\s+=\s?(.*)$", line)
            if match:
                live.config[match.group(1).lower()] = match.group(2).strip()
        for line in (cmd.output(["scontrol", "-o", "show", "node"], timeout=20) or "").splitlines():
            fields = parse_scontrol_line(line)
            if fields.get("NodeName"):
                live.nodes[fields["NodeName"]] = fields
        for line in (cmd.output(["scontrol", "-o", "show", "partition"], timeout=20)
                     or "").splitlines():
            fields = parse_scontrol_line(line)
            if fields.get("PartitionName"):
                live.partitions.add(fields["PartitionName"])
        return live

    def get(self, key: str) -> str | None:
        value = self.config.get(key.lower())
        return None if value in (None, "(null)") else value


# ---- the checks ------------------------------------------------------------------------------

# The factors of priority/multifactor that add to a job's priority (TRES weights left out).
PRIORITY_WEIGHTS = ("Age", "Assoc", "Fairshare", "JobSize", "Partition", "QOS")


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _duration_s(text: str) -> float | None:
    """Slurm's time format (``minutes``, ``m:s``, ``h:m:s``, ``d-h[:m[:s]]``) in seconds."""
    days, dash, rest = text.strip().partition("-")
    try:
        if not dash:
            parts = [int(p) for p in days.split(":")]
            scale = {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}[len(parts)]
            return float(sum(p * s for p, s in zip(parts, scale)))
        parts = [int(p) for p in rest.split(":")]
        return float(int(days) * 86400 + sum(p * s for p, s in zip(parts, (3600, 60, 1))))
    except (ValueError, KeyError):
        return None


def _tokens(value: str | None) -> list[str]:
    return [t.strip() for t in (value or "").split(",") if t.strip() and t.strip() != "(null)"]


def _with(value: str | None, token: str) -> str:
    tokens = _tokens(value)
    return ",".join(tokens + ([token] if token not in tokens else []))


class Checker:
    """Runs every check and collects findings (``ok`` ones too, for --verbose and --json)."""

    def __init__(self, slurm_conf: Path, config_path: str | None, *, live: LiveSlurm | None,
                 lua_binary: str | None = None, lua_dirs: Sequence[str] | None = None):
        self.slurm_conf_path = slurm_conf
        self.conf_dir = slurm_conf.parent
        self.config_path = config_path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH
        self.live = live
        self.lua_binary = lua_binary if lua_binary is not None else shutil.which(
            f"lua{LUA_VERSION}") or ""
        self.lua_dirs = lua_dirs
        self.findings: list[Finding] = []
        self.conf: SlurmConf | None = None
        self.config: Config | None = None

    def add(self, check: str, level: str, message: str, fix: str = "", where: str = "") -> None:
        self.findings.append(Finding(check, level, message, fix, where))

    def run(self) -> list[Finding]:
        self.read_inputs()
        if self.conf:
            self.check_slurm_params()
            self.check_slurm_version()
            self.check_hook_files()
            self.check_nodes()
        if self.conf and self.config:
            self.check_priority()
        if self.config:
            self.check_hook_settings()
            self.check_partitions()
            self.check_daemon()
        self.check_lua()
        self.check_prolog()
        return self.findings

    # -- inputs
    def read_inputs(self) -> None:
        try:
            self.conf = SlurmConf.read(self.slurm_conf_path)
            self.add("slurm-conf", "ok", f"read {self.slurm_conf_path}")
        except OSError as exc:
            self.add("slurm-conf", "error", f"cannot read {self.slurm_conf_path}: {exc.strerror}",
                     "pass --slurm-conf PATH (or set SLURM_CONF) to the cluster's slurm.conf",
                     str(self.slurm_conf_path))
        try:
            self.config = load_config(self.config_path)
            self.add("daemon-config", "ok", f"read {self.config_path}")
        except ConfigError as exc:
            self.add("daemon-config", "error", str(exc),
                     f"install etc/gpushare.toml as {self.config_path} (or pass --config PATH) "
                     "and fix what it names", self.config_path)
        if self.live is not None and self.live.error:
            self.add("slurmctld", "warning", f"cannot ask slurmctld ({self.live.error}): only the "
                     "files were checked", "run check-config where `scontrol ping` works",
                     "slurmctld")
        if self.config and not self.config.gpu_types:
            self.add("gpu-types", "error", "no [gpu_types] in the daemon config: nothing can be "
                     "shared", '[gpu_types.a100] memory_gib = 80   (one table per GPU type)',
                     self.config_path)
        from slurm_gpushare.core.gpus import UnknownGpu, default_catalogue

        catalogue = default_catalogue()
        for gpu_type in self.config.gpu_types if self.config else ():
            named = gpu_type.model or gpu_type.name
            try:
                catalogue.lookup(named, memory_gib=gpu_type.memory_gib)
            except UnknownGpu:
                self.add("gpu-types", "warning",
                         f"GPU type {gpu_type.name}: {named!r} is no model of the GPU catalogue "
                         f"(slurm_gpushare/data/gpus.csv): jobs are sized there from their "
                         f"own runs on it only, and runs elsewhere do not carry over",
                         f"if it is one of {', '.join(catalogue.models)}, set "
                         f"[gpu_types.{gpu_type.name}] model = \"<that model>\"",
                         self.config_path)

    def _sources(self) -> list[tuple[str, Callable[[str], str | None]]]:
        sources: list[tuple[str, Callable[[str], str | None]]] = [
            (str(self.slurm_conf_path), self.conf.get)]
        if self.live is not None and not self.live.error:
            sources.append(("slurmctld", self.live.get))
        return sources

    def _where_fix(self, where: str, line: str) -> str:
        if where == "slurmctld":
            return (f"set {line} in {self.slurm_conf_path}, then restart slurmctld "
                    "(and slurmd where it concerns nodes)")
        return f"in {where} set: {line}"

    # -- slurm.conf parameters
    def check_slurm_params(self) -> None:
        # The sharing gres the configured GPU types use (shard unless a type says mps).
        needed = sorted({g.sharing for g in self.config.gpu_types} if self.config else {"shard"})
        for where, get in self._sources():
            gres = _tokens(get("GresTypes"))
            missing = [name for name in needed if name not in gres]
            fixed = get("GresTypes")
            for name in missing:
                fixed = _with(fixed, name)
            if not missing:
                self.add("gres-types", "ok", f"GresTypes has {', '.join(needed)} ({where})",
                         where=where)
            elif not {"shard", "mps"} & set(gres):
                self.add("gres-types", "error", f"GresTypes={','.join(gres) or '(unset)'} has "
                         "neither shard nor mps: no share can be scheduled",
                         self._where_fix(where, f"GresTypes={fixed}"), where)
            else:
                self.add("gres-types", "error", f"GresTypes={','.join(gres)} lacks "
                         f"{', '.join(missing)}, which the configured GPU types share by",
                         self._where_fix(where, f"GresTypes={fixed}"), where)
            select = get("SelectType") or "(unset)"
            if select == "select/cons_tres":
                self.add("select-type", "ok", f"SelectType=select/cons_tres ({where})", where=where)
            else:
                self.add("select-type", "error", f"SelectType={select}: shared gres need "
                         "select/cons_tres", self._where_fix(where, "SelectType=select/cons_tres"),
                         where)
            # Every sharing gres in use must be accounted, or its shares show no GPU at all
            # in AllocTRES (and the reports miss them).
            tres = get("AccountingStorageTRES")
            wanted = [f"gres/{name}" for name in needed]
            unaccounted = [t for t in wanted if t not in _tokens(tres)]
            if not unaccounted:
                self.add("accounting-tres", "ok", f"AccountingStorageTRES has "
                         f"{', '.join(wanted)} ({where})", where=where)
            else:
                self.add("accounting-tres", "error", f"AccountingStorageTRES={tres or '(unset)'} "
                         f"lacks {', '.join(unaccounted)}: shares are missing from AllocTRES "
                         "and the reports", self._where_fix(where, self._accounting_line(wanted)),
                         where)
            plugins = [p.split("/")[-1] for p in _tokens(get("JobSubmitPlugins"))]
            if "lua" in plugins:
                self.add("job-submit", "ok", f"JobSubmitPlugins has lua ({where})", where=where)
            else:
                value = ",".join(_tokens(get("JobSubmitPlugins")) + ["lua"])
                self.add("job-submit", "error", f"JobSubmitPlugins={get('JobSubmitPlugins') or '(unset)'}"
                         " lacks lua: the hook never runs", self._where_fix(
                             where, f"JobSubmitPlugins={value}"), where)

    def _accounting_line(self, sharing: list[str]) -> str:
        current = _tokens(self.conf.get("AccountingStorageTRES"))
        for token in ("gres/gpu", *sharing):
            if token not in current:
                current.append(token)
        return f"AccountingStorageTRES={','.join(current)}"

    # -- traps of the running Slurm version (see slurm_gpushare/slurm/version.py)
    def check_slurm_version(self) -> None:
        live = self.live is not None and not self.live.error
        version = (SlurmVersion.parse(self.live.get("SLURM_VERSION")) if live
                   else installed_version())
        where = "slurmctld" if live else "scontrol -V"
        if version is None:
            self.add("slurm-version", "warning", "cannot tell which Slurm this is: "
                     "version-specific traps are not checked", "run check-config where "
                     "`scontrol -V` works", where)
            return
        if not version.supported:
            self.add("slurm-version", "error", f"Slurm {version} has no gres/shard (22.05+)",
                     "upgrade Slurm to 22.05 or later", where)
            return
        self.add("slurm-version", "ok", f"Slurm {version}", where=where)
        shards = "shard" in _tokens(self.conf.get("GresTypes"))
        if shards and version.gpu_whole_and_shard_bug:
            self.add("slurm-version", "warning",
                     f"Slurm {version} can allocate a GPU whole and as shards at the same time "
                     "(fixed in 23.11.5, NEWS: \"Fix issue where you could have a gpu allocated "
                     "as well as a shard on that gpu allocated at the same time.\", SchedMD "
                     "bug 19110): a whole-GPU job may land on a GPU that shares run on",
                     "upgrade to Slurm 23.11.5 or later, or keep whole-GPU jobs off the sharing "
                     "partitions' nodes", where)
        gres_conf = self.conf_dir / "gres.conf"
        try:
            nvml = re.search(r"(?im)^\s*autodetect\s*=\s*nvml", gres_conf.read_text())
        except OSError:
            nvml = None
        tres = _tokens(self.conf.get("AccountingStorageTRES"))
        missing = [t for t in ("gres/gpumem", "gres/gpuutil") if t not in tres]
        if version.accounts_gpu_usage and nvml and missing:
            self.add("slurm-version", "warning",
                     f"Slurm {version} with AutoDetect=nvml can account each job's GPU memory and "
                     f"utilisation, but AccountingStorageTRES lacks {', '.join(missing)}: the "
                     "reports and history miss that second telemetry source",
                     f"in {self.slurm_conf_path} set: AccountingStorageTRES="
                     f"{','.join(tres + missing)}", str(self.slurm_conf_path))

    # -- the SJF lever against the site's priority weights
    def check_priority(self) -> None:
        """With ``priority = "sjf"``: nice is weighed by priority/multifactor against age and the
        other factors (docs/admin-guide.md, "Shortest job first")."""
        policy = self.config.policy
        if policy.priority != "sjf":
            return
        for where, get in self._sources():
            kind = get("PriorityType") or "priority/basic"
            if kind != "priority/multifactor":
                self.add("priority", "warning", f"PriorityType={kind}: the SJF lever's nice is "
                         "meant to be weighed against age and fair-share (under priority/basic "
                         "it moves a job by as many submissions)",
                         self._where_fix(where, "PriorityType=priority/multifactor"), where)
                continue
            weights = {name: _int(get(f"PriorityWeight{name}")) for name in PRIORITY_WEIGHTS}
            top = sum(weights.values())
            if policy.sjf_nice_max >= top:
                self.add("priority", "warning", f"a penalty of up to +{policy.sjf_nice_max} "
                         f"(sjf_nice_max) exceeds any job's priority (the PriorityWeight* add up "
                         f"to {top}): Slurm raises a priority below 1 to 1, so the jobs "
                         "predicted longest tie instead of keeping their order",
                         self._where_fix(where, "PriorityWeightPartition="
                                         f"{policy.sjf_nice_max + max(1000, top)}   (a base "
                                         "every job of the partition gets)")
                         + f", or lower sjf_nice_max in {self.config_path}", where)
                continue
            age, max_age_text = weights["Age"], get("PriorityMaxAge") or "7-0"
            max_age = _duration_s(max_age_text)
            if max_age is None:
                self.add("priority", "warning", f"PriorityMaxAge={max_age_text} is not a Slurm "
                         "time: how long age takes to make up a penalty cannot be told",
                         self._where_fix(where, "PriorityMaxAge=7-0"), where)
                continue
            if not age:
                self.add("priority", "warning", "PriorityWeightAge=0: no waiting makes up for "
                         "a penalty, so a job predicted longer waits behind shorter ones for "
                         "as long as they keep coming", self._where_fix(
                             where, "PriorityWeightAge=1000"), where)
                continue
            # Age grows by PriorityWeightAge over PriorityMaxAge, then stops: the waiting
            # that makes up for one decade of predicted run time, if any does.
            if policy.sjf_nice_per_decade <= age:
                catch_up = (f"a job predicted ten times longer than another catches up with it "
                            f"after {policy.sjf_nice_per_decade / age * max_age / 86400:.1f} "
                            "days of waiting")
            else:
                catch_up = (f"age (at most {age}) never makes up one decade of predicted run "
                            f"time (nice {policy.sjf_nice_per_decade}): shortest first, age "
                            "orders only jobs of about the same predicted length")
            self.add("priority", "ok", f"SJF lever under priority/multifactor: {catch_up}",
                     where=where)

    # -- the hook's files beside slurm.conf
    def check_hook_files(self) -> None:
        for name in HOOK_FILES:
            path = self.conf_dir / name
            shipped = REPO_LUA / name
            source = shipped if shipped.exists() else Path("lua") / name
            if not path.exists():
                self.add("hook-files", "error", f"{path} is missing: slurmctld loads the hook "
                         "from the directory of slurm.conf",
                         f"install -m 0644 {source} {path}", str(path))
            elif shipped.exists() and path.read_bytes() != shipped.read_bytes():
                self.add("hook-files", "warning", f"{path} differs from this version's {name}",
                         f"install -m 0644 {shipped} {path}", str(path))
            else:
                self.add("hook-files", "ok", f"{path} present", where=str(path))

    def check_hook_settings(self) -> None:
        path = self.conf_dir / HOOK_SETTINGS
        fix = f"slurm-gpushare hook-config --config {self.config_path} -o {path}"
        if not path.exists():
            self.add("hook-settings", "error", f"{path} is missing: the hook would use its "
                     "built-in socket path and timeouts", fix, str(path))
            return
        try:
            settings = json.loads(path.read_text())
            if not isinstance(settings, dict):
                raise ValueError("not an object")
        except (OSError, ValueError) as exc:
            self.add("hook-settings", "error", f"{path} is unreadable ({exc})", fix, str(path))
            return
        wanted = self.config.hook_settings()
        if settings.get("socket") != wanted["socket"]:
            self.add("hook-settings", "error", f"{path} points the hook at "
                     f"{settings.get('socket')!r} but the daemon listens on {wanted['socket']!r}",
                     fix, str(path))
            return
        stale = sorted(k for k, v in wanted.items() if settings.get(k) != v)
        if stale:
            self.add("hook-settings", "warning", f"{path} differs from the daemon config in "
                     f"{', '.join(stale)}", fix, str(path))
        else:
            self.add("hook-settings", "ok", f"{path} matches the daemon config", where=str(path))

    # -- nodes: GPU types, shard counts, features
    def _expected_units(self, gpu_type: str | None, gpus: int) -> tuple[str, int] | None:
        """The sharing gres a node of this type must offer and its count: one shard per
        GiB, or 100 MPS percent per GPU."""
        if not self.config or not gpu_type:
            return None
        spec = self.config.gpu_type(gpu_type)
        if spec is None:
            return None
        return spec.sharing, gpus * (100 if spec.sharing == "mps" else shards_per_gpu(spec))

    def check_nodes(self) -> None:
        sources = [(str(self.slurm_conf_path), {n: (r.get("gres"), r.get("features", ""))
                                                 for n, r in self.conf.nodes.items()})]
        if self.live is not None and not self.live.error:
            sources.append(("slurmctld", {n: (r.get("Gres"), r.get("AvailableFeatures", ""))
                                          for n, r in self.live.nodes.items()}))
        gres_conf = self.conf_dir / "gres.conf"
        file_nodes: dict[str, tuple[str, int]] = {}
        any_gpu = False
        for where, nodes in sources:
            for node, (gres, features) in sorted(nodes.items()):
                tokens = gres_tokens(gres)
                gpus = [(t, c) for n, t, c in tokens if n == "gpu"]
                if not gpus:
                    continue
                any_gpu = True
                self._check_node(where, node, gpus, tokens, features or "")
                if where != "slurmctld" and len(gpus) == 1 and gpus[0][0]:
                    file_nodes[node] = (gpus[0][0], gpus[0][1])
        if not any_gpu:
            self.add("nodes", "warning", "no node declares gres gpu: nothing to share",
                     "NodeName=<node> Gres=gpu:<type>:<count>,shard:<count x GiB> ...",
                     str(self.slurm_conf_path))
        if not file_nodes:
            return
        if not gres_conf.exists():
            self.add("gres-conf", "error", f"{gres_conf} is missing: slurmd cannot offer shards",
                     "slurm-gpushare gen-config --nodes-from-sinfo (gres.conf lines)",
                     str(gres_conf))
            return
        declared = {name: gres_conf_shards(gres_conf, self.conf.nodes, name)
                    for name in ("shard", "mps")}
        wrong = []
        for node, (gpu_type, gpus) in sorted(file_nodes.items()):
            expected = self._expected_units(gpu_type, gpus)
            if expected is not None and declared[expected[0]].get(node, 0) != expected[1]:
                wrong.append((node, expected[0], declared[expected[0]].get(node, 0), expected[1]))
        for node, name, have, expected in wrong:
            unit = "GPUs x 100" if name == "mps" else "GPUs x GiB"
            self.add("gres-conf", "error", f"gres.conf gives {node} {have} "
                     f"{'shards' if name == 'shard' else 'MPS percent'}; {expected} expected ({unit})",
                     f"in {gres_conf} set: NodeName={node} Name={name} Count={expected}",
                     str(gres_conf))
        if not wrong:
            self.add("gres-conf", "ok", f"{gres_conf}: shard counts match", where=str(gres_conf))

    def _check_node(self, where: str, node: str, gpus: list[tuple[str | None, int]],
                    tokens: list, features: str) -> None:
        if len(gpus) > 1:
            self.add("node-gpu-type", "warning", f"{node} has GPUs of several types "
                     f"({', '.join(str(t) for t, _ in gpus)}): shares cannot be limited to one",
                     "split mixed nodes or leave them out of sharing partitions", where)
            return
        gpu_type, count = gpus[0]
        line = self.conf.node_lines.get(node, f"NodeName={node} ...") if self.conf else ""
        if not gpu_type:
            self.add("node-gpu-type", "error", f"{node} declares untyped GPUs (gpu:{count}): "
                     "shares are placed by GPU type",
                     self._node_fix(where, line, gres=f"gpu:<type>:{count}"), where)
            return
        spec = self.config.gpu_type(gpu_type) if self.config else None
        if self.config and spec is None:
            self.add("node-gpu-type", "error", f"{node}'s GPU type {gpu_type} is not in "
                     "[gpu_types] of the daemon config",
                     f"in {self.config_path} add: [gpu_types.{gpu_type}] memory_gib = <GiB>",
                     self.config_path)
            return
        if spec is None:
            return
        name, expected = self._expected_units(gpu_type, count)
        shards = sum(c for n, _, c in tokens if n == name)
        if shards != expected:
            gres = f"gpu:{gpu_type}:{count},{name}:{expected}"
            rule = (f"{count} x 100 MPS percent" if name == "mps" else
                    f"{count} x {spec.memory_gib} GiB {gpu_type}, one shard per "
                    + ("GiB" if spec.shard_mib == 1024 else f"{spec.shard_mib} MiB"))
            unit = "shards" if name == "shard" else "MPS percent"
            self.add("shard-count", "error", f"{node} has {shards} {unit}; {expected} expected "
                     f"({rule})", self._node_fix(where, line, gres=gres), where)
        else:
            unit = "shards" if name == "shard" else "MPS percent"
            self.add("shard-count", "ok", f"{node}: {shards} {unit} ({where})", where=where)
        have = [f for f in re.split(r"[,&|]", features) if f and f != "(null)"]
        if spec.feature not in have:
            self.add("node-features", "error", f"{node} lacks feature {spec.feature}: shares are "
                     "constrained to it and would never run there",
                     self._node_fix(where, line, features=",".join(have + [spec.feature])), where)

    def _node_fix(self, where: str, line: str, *, gres: str | None = None,
                  features: str | None = None) -> str:
        fixed = line
        for key, value in (("Gres", gres), ("Features", features)):
            if value is None:
                continue
            pattern = re.compile(rf"\b{key}=\S*", re.IGNORECASE)
            fixed = pattern.sub(f"{key}={value}", fixed) if pattern.search(fixed) \
                else f"{fixed} {key}={value}"
        return self._where_fix(where if where != "slurmctld" else str(self.slurm_conf_path),
                               fixed)

    # -- partitions named in the daemon config
    def check_partitions(self) -> None:
        wanted = list(self.config.policy.sharing_partitions)
        if not wanted:
            self.add("sharing-partitions", "warning", "sharing_partitions is empty: sharing is "
                     "off everywhere", 'sharing_partitions = ["<one GPU partition>"]',
                     self.config_path)
            return
        known = set(self.conf.partitions) if self.conf else set()
        if self.live is not None and not self.live.error:
            known |= self.live.partitions
        missing = [p for p in wanted if known and p not in known]
        if missing:
            keep = [p for p in wanted if p not in missing]
            self.add("sharing-partitions", "error", f"sharing partition(s) {', '.join(missing)} "
                     "do not exist in Slurm", f"in {self.config_path} set: sharing_partitions = "
                     + json.dumps(keep), self.config_path)
        else:
            self.add("sharing-partitions", "ok", f"sharing in {', '.join(wanted)}",
                     where=self.config_path)

    # -- the daemon
    def check_daemon(self) -> None:
        path = self.config.daemon.socket
        try:
            reply = request(path, {"v": 1, "op": "ping"}, 2.0)
        except PermissionError:
            self.add("daemon", "warning", f"not allowed to ping {path} as uid {os.getuid()}",
                     "run check-config as root or SlurmUser", path)
        except (OSError, ValueError) as exc:
            self.add("daemon", "error", f"the daemon does not answer on {path} "
                     f"({getattr(exc, 'strerror', None) or exc}): every job passes unshared",
                     "systemctl enable --now slurm-gpushare   (or: slurm-gpushare serve "
                     f"--config {self.config_path})", path)
        else:
            if reply.get("ok"):
                self.add("daemon", "ok", f"daemon {reply.get('version')} answers on {path}",
                         where=path)
            else:
                self.add("daemon", "error", f"the daemon on {path} refuses this user: "
                         f"{reply.get('error')}", "run check-config as root or SlurmUser", path)
        self.check_daemon_peer(path)
        query_socket = self.config.daemon.query_socket
        if query_socket:
            try:
                request(query_socket, {"v": 1, "op": "ping"}, 2.0)
                self.add("query-socket", "ok", f"query socket {query_socket} answers",
                         where=query_socket)
            except (OSError, ValueError) as exc:
                self.add("query-socket", "warning", f"query socket {query_socket} does not answer"
                         f" ({getattr(exc, 'strerror', None) or exc}): users cannot run explain",
                         "systemctl restart slurm-gpushare", query_socket)

    def check_daemon_peer(self, socket_path: str) -> None:
        """slurmctld (SlurmUser) must be allowed on the daemon's 0600 socket."""
        slurm_user = None
        if self.live is not None and self.live.get("SlurmUser"):
            slurm_user = self.live.get("SlurmUser")
        elif self.conf and self.conf.get("SlurmUser"):
            slurm_user = self.conf.get("SlurmUser")
        if not slurm_user:
            return
        match = re.match(r"^([^(]+)(?:\((\d+)\))?$", slurm_user)
        name, uid = match.group(1), match.group(2)
        try:
            uid = int(uid) if uid else pwd.getpwnam(name).pw_uid
        except KeyError:
            self.add("daemon-peer", "warning", f"SlurmUser {name} is unknown on this host",
                     "run check-config on the slurmctld host", "slurmctld")
            return
        try:
            owner = os.stat(socket_path).st_uid
        except OSError:
            return
        allowed = {0, owner, *self.config.daemon.allowed_uids}
        if uid in allowed:
            self.add("daemon-peer", "ok", f"SlurmUser {name} may use the daemon socket",
                     where=socket_path)
        else:
            self.add("daemon-peer", "error", f"the daemon runs as uid {owner} and refuses "
                     f"SlurmUser {name} (uid {uid}): the hook cannot ask it",
                     f"in {self.config_path} set: allowed_uids = [{uid}]   (or run the daemon "
                     f"as {name}: User={name} in slurm-gpushare.service)", self.config_path)

    # -- Lua libraries for the hook
    def check_lua(self) -> None:
        fix = "apt-get install lua-socket lua-cjson   (Lua 5.1 modules, as Slurm's plugin uses)"
        if self.lua_binary:
            result = subprocess.run([self.lua_binary, "-e", 'require "socket.unix"; '
                                     'require "cjson"'], capture_output=True, text=True,
                                    timeout=20)
            if result.returncode == 0:
                self.add("lua-modules", "ok", "lua-socket and lua-cjson load in Lua 5.1")
            else:
                why = (result.stderr.strip().splitlines() or ["failed"])[0]
                self.add("lua-modules", "error", f"Lua 5.1 cannot load the hook's modules: {why}",
                         fix)
            return
        dirs = self.lua_dirs if self.lua_dirs is not None else (
            glob.glob(f"/usr/lib/*/lua/{LUA_VERSION}") + [f"/usr/lib/lua/{LUA_VERSION}",
                                                          f"/usr/local/lib/lua/{LUA_VERSION}"])
        missing = [m for m in ("socket/unix.so", "cjson.so")
                   if not any(os.path.exists(os.path.join(d, m)) for d in dirs)]
        if missing:
            self.add("lua-modules", "error", f"Lua 5.1 module(s) {', '.join(missing)} not found "
                     f"in {', '.join(dirs) or 'any Lua 5.1 path'}: the hook passes every job "
                     "unshared", fix)
        else:
            self.add("lua-modules", "ok", "lua-socket and lua-cjson installed for Lua 5.1")

    # -- telemetry (warn only: sharing works without it, but nothing is learned)
    def check_prolog(self) -> None:
        if self.live is not None and not self.live.error:
            get, where = self.live.get, "slurmctld"
        elif self.conf:
            get, where = self.conf.get, str(self.slurm_conf_path)
        else:
            return
        for key in ("Prolog", "Epilog"):
            value = get(key)
            if not value:
                self.add("telemetry", "warning", f"no {key}: the telemetry agent never runs, so "
                         "jobs get no history to be shared by",
                         f"{key}=/etc/slurm/gpushare-{key.lower()}.sh   (install "
                         f"scripts/{key.lower()}.sh there on every GPU node)", where)
            else:
                self.add("telemetry", "ok", f"{key}={value}", where=where)


def check_config(slurm_conf: str | None = None, config_path: str | None = None, *,
                 live: bool = True,
                 lua_binary: str | None = None,
                 lua_dirs: Sequence[str] | None = None) -> list[Finding]:
    """All findings for a cluster (see the module docstring)."""
    live_slurm = LiveSlurm.query() if live else None
    path = (slurm_conf
            or (live_slurm.get("SLURM_CONF") if live_slurm and not live_slurm.error else None)
            or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF)
    checker = Checker(Path(path), config_path, live=live_slurm, lua_binary=lua_binary,
                      lua_dirs=lua_dirs)
    return checker.run()


def format_findings(findings: Sequence[Finding], *, verbose: bool = False) -> str:
    lines = []
    order = {"error": 0, "warning": 1, "ok": 2}
    for finding in sorted(findings, key=lambda f: order[f.level]):
        if finding.level == "ok" and not verbose:
            continue
        label = {"error": "ERROR", "warning": "WARNING", "ok": "ok"}[finding.level]
        lines.append(f"{label:<8} {finding.check:<18} {finding.message}")
        if finding.fix and finding.level != "ok":
            lines.append(f"{'':<8} {'':<18} fix: {finding.fix}")
    errors = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warning" for f in findings)
    passed = sum(f.level == "ok" for f in findings)
    lines.append(f"{errors} error(s), {warnings} warning(s), {passed} check(s) passed")
    return "\n".join(lines)
