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
from typing import Callable, Iterable, Iterator, Sequence


from slurm_gpushare import HOOK_DIR
from slurm_gpushare.core.errors import UserError
from slurm_gpushare.core.hostlist import HostlistError, compress_hostlist, expand_hostlist
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

def _conf_error(check: str, path: Path, number: int, message: str, fix: str) -> Finding:
    return Finding(check, "error", f"{path}:{number}: {message}", fix, str(path))


def _names(text: str, key: str, check: str, path: Path, number: int,
           problems: list[Finding]) -> list[str] | None:
    """The names of a hostlist on line ``number`` of ``path``; None (the line added to
    ``problems``) where Slurm would refuse it."""
    try:
        return expand_hostlist(text)
    except HostlistError as exc:
        problems.append(_conf_error(check, path, number, f"{key}={text}: {exc}",
                                    "write it in Slurm's hostlist syntax (e.g. gpu[01-04], "
                                    "/dev/nvidia[0-3])"))
        return None


def _logical_lines(path: Path, problems: list[Finding], *, top: Path | None = None,
                   state: dict[str, str] | None = None,
                   chain: tuple[Path, ...] = ()) -> Iterator[tuple[Path, int, str]]:
    """A Slurm config file's lines and their numbers: comments dropped, ``\\`` continuations
    joined, Include files followed as Slurm follows them (``%c``: the ClusterName set so
    far, lower-cased; no wildcards). An Include Slurm cannot read is added to ``problems``;
    the file itself unreadable raises OSError."""
    top = top or path
    state = {} if state is None else state
    text = path.read_text(errors="replace")
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(?<!\\)#.*$", "", raw).rstrip()
        start = start or number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending, first = (pending + line).strip(), "", start
        start = 0
        if not line:
            continue
        include = re.match(r"^include\s+(\S+)", line, re.IGNORECASE)
        if include:
            target, why = _include_path(include.group(1), path, top, state)
            if target is not None and target.resolve() in chain + (path.resolve(),):
                why = "includes itself"
            if why is None:
                try:
                    yield from _logical_lines(target, problems, top=top, state=state,
                                              chain=chain + (path.resolve(),))
                except OSError as exc:
                    why = f"cannot read {target}: {exc.strerror}"
            if why is not None:
                problems.append(_conf_error(
                    "include", path, first, f"Include {include.group(1)}: {why}",
                    f"fix the Include line: Slurm fails to start on it (\"Include\" failed in "
                    f"file {path.name} line {first})"))
            continue
        for key, value in _pairs(line):
            if key.lower() == "clustername":
                state["cluster"] = value.lower()
        yield path, first, line


def _include_path(name: str, path: Path, top: Path,
                  state: dict[str, str]) -> tuple[Path | None, str | None]:
    """(file, None), or (None, why Slurm cannot include it)."""
    if "%c" in name:
        if "cluster" not in state:
            return None, "%c needs ClusterName set before this line"
        name = name.replace("%c", state["cluster"])
    if "*" in name:
        return None, "Slurm does not expand wildcards in Include paths"
    if name.startswith("/"):
        return Path(name), None
    # Relative to the including file (Slurm 22.05) or to slurm.conf (23.02+).
    candidates = list(dict.fromkeys([path.parent / name, top.parent / name]))
    found = [c for c in candidates if c.exists()]
    if found:
        return found[0], None
    return None, f"cannot read {' or '.join(map(str, candidates))}: No such file or directory"


def _pairs(line: str) -> list[tuple[str, str]]:
    # Slurm's key=value (s_p_parse_line): spaces allowed around '=', "..." quotes a value.
    return [(k, v.strip('"')) for k, v in
            re.findall(r'([A-Za-z][A-Za-z0-9_.]*)\s*=\s*("[^"]*"|\S+)', line)]


@dataclass
class SlurmConf:
    path: Path
    params: dict[str, str] = field(default_factory=dict)  # lower-case key -> value
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> lower-case keys
    node_lines: dict[str, str] = field(default_factory=dict)  # node -> its NodeName line
    partitions: dict[str, dict[str, str]] = field(default_factory=dict)
    members: dict[str, set[str]] = field(default_factory=dict)  # partition -> its nodes
    problems: list[Finding] = field(default_factory=list)  # what Slurm would refuse

    @classmethod
    def read(cls, path: str | os.PathLike) -> "SlurmConf":
        conf = cls(Path(path))
        node_defaults: dict[str, str] = {}
        partition_defaults: dict[str, str] = {}
        nodesets: dict[str, dict[str, str]] = {}
        node_at: dict[str, tuple[Path, int]] = {}
        partition_at: dict[str, tuple[Path, int]] = {}
        for source, number, line in _logical_lines(Path(path), conf.problems):
            pairs = _pairs(line)
            if not pairs:
                continue
            first = pairs[0][0].lower()
            record = {k.lower(): v for k, v in pairs}
            if first == "nodename":
                if record["nodename"].upper() == "DEFAULT":
                    node_defaults.update({k: v for k, v in record.items() if k != "nodename"})
                    continue
                again = []
                for name in conf._hostlist(record["nodename"], "NodeName", source, number):
                    if name in conf.nodes:
                        again.append(name)
                        continue
                    conf.nodes[name] = {**node_defaults, **record}
                    conf.node_lines[name] = line
                    node_at[name] = (source, number)
                if again:
                    at_source, at = node_at[again[0]]
                    earlier = f"line {at}" if at_source == source else f"{at_source}:{at}"
                    conf.problems.append(_conf_error(
                        "node-names", source, number, f"NodeName {compress_hostlist(again)} "
                        f"defined again (first at {earlier}): slurmctld refuses to start "
                        "(\"Duplicated NodeName\")",
                        "keep one NodeName line per node (settings shared by several: "
                        "NodeName=DEFAULT before them)"))
            elif first == "partitionname":
                if record["partitionname"].upper() == "DEFAULT":
                    partition_defaults.update(record)
                    continue
                conf.partitions[record["partitionname"]] = {**partition_defaults, **record}
                partition_at[record["partitionname"]] = (source, number)
            elif first == "nodeset":
                nodesets[record["nodeset"]] = record
            elif first in ("frontendname", "downnodes", "switchname"):
                continue
            else:
                conf.params.update(record)
        for name, record in conf.partitions.items():
            conf.members[name] = conf._partition_nodes(record.get("nodes", ""), nodesets,
                                                       *partition_at[name])
        return conf

    def _hostlist(self, text: str, key: str, source: Path, number: int) -> list[str]:
        return _names(text, key, "slurm-conf", source, number, self.problems) or []

    def _partition_nodes(self, text: str, nodesets: dict[str, dict[str, str]], source: Path,
                         number: int) -> set[str]:
        """A partition's Nodes=: node names, ALL, or NodeSet names (Nodes= or Feature=)."""
        members: set[str] = set()
        for item in self._hostlist(text, "Nodes", source, number):
            if item.upper() == "ALL":
                members |= set(self.nodes)
            elif item in nodesets:
                nodeset = nodesets[item]
                if "feature" in nodeset:
                    members |= {n for n, r in self.nodes.items()
                                if nodeset["feature"] in _tokens(r.get("features"))}
                members |= self._partition_nodes(nodeset.get("nodes", ""), {}, source, number)
            else:
                members.add(item)
        return members

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


def gpu_counts(tokens: Iterable[tuple[str, str | None, int]]) -> list[tuple[str | None, int]]:
    """GPUs per type from ``gres_tokens``: one type on several sockets
    (``gpu:a100:2(S:0),gpu:a100:2(S:1)``) is one type, its counts added."""
    counts: dict[str | None, int] = {}
    for name, gpu_type, count in tokens:
        if name == "gpu":
            counts[gpu_type] = counts.get(gpu_type, 0) + count
    return list(counts.items())


def gres_conf_units(path: Path, nodes: Iterable[str],
                    problems: list[Finding] | None = None) -> dict[str, dict[str, int]]:
    """Units of each sharing gres (shard, mps) per node as gres.conf declares them (lines
    without NodeName= apply to all). Lines Slurm refuses go to ``problems``; the file
    unreadable raises OSError."""
    nodes = list(nodes)
    problems = [] if problems is None else problems
    units: dict[str, dict[str, int]] = {"shard": {}, "mps": {}}
    for source, number, line in _logical_lines(path, problems):
        record = {k.lower(): v for k, v in _pairs(line)}
        files = (_names(record["file"], "File", "gres-conf", source, number, problems)
                 if "file" in record else [])
        targets = (_names(record["nodename"], "NodeName", "gres-conf", source, number, problems)
                   if "nodename" in record else nodes)
        if files is None or targets is None:
            continue
        name = record.get("name")
        if name not in units:
            continue
        if "count" in record:
            count = gres_tokens(f"{name}:{record['count']}")[0][2]
        else:  # one unit per File= entry, as Slurm counts them
            count = len(files) or 1
        for node in targets:
            units[name][node] = units[name].get(node, 0) + count
    return units


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
            self.findings.extend(self.conf.problems)
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
            # Shard and mps need gpu too (slurmctld refuses them alone); the fix keeps every
            # gres the nodes use, which Slurm drops from a node when GresTypes lacks it.
            required = ["gpu", *needed]
            missing = [name for name in required if name not in gres]
            fixed = ",".join(dict.fromkeys([*gres, *required, *self._node_gres(where)]))
            fix = self._where_fix(where, f"GresTypes={fixed}")
            if not missing:
                self.add("gres-types", "ok", f"GresTypes has {', '.join(required)} ({where})",
                         where=where)
            elif not {"shard", "mps"} & set(gres):
                self.add("gres-types", "error", f"GresTypes={','.join(gres) or '(unset)'} has "
                         "neither shard nor mps: no share can be scheduled", fix, where)
            else:
                why = (": slurmctld does not start with shard or mps but no gpu"
                       if "gpu" in missing else ", which the configured GPU types share by")
                self.add("gres-types", "error", f"GresTypes={','.join(gres)} lacks "
                         f"{', '.join(missing)}{why}", fix, where)
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

    def _node_gres(self, where: str) -> list[str]:
        """The gres names the nodes' Gres= use, in order."""
        nodes = ([r.get("Gres") for r in self.live.nodes.values()] if where == "slurmctld"
                 else [r.get("gres") for r in self.conf.nodes.values()])
        return list(dict.fromkeys(name for gres in nodes for name, _, _ in gres_tokens(gres)))

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

    def _sharing_nodes(self, where: str) -> set[str] | None:
        """The nodes the sharing partitions can place jobs on (None: unknown, for want of
        the daemon config or of any partition in slurm.conf: check every node)."""
        if not self.config or (where != "slurmctld" and not self.conf.partitions):
            return None
        wanted = set(self.config.policy.sharing_partitions)
        if where == "slurmctld":
            return {n for n, r in self.live.nodes.items()
                    if wanted & set(_tokens(r.get("Partitions")))}
        return {n for p, members in self.conf.members.items() if p in wanted for n in members}

    def check_nodes(self) -> None:
        sources = [(str(self.slurm_conf_path), {n: (r.get("gres"), r.get("features", ""))
                                                 for n, r in self.conf.nodes.items()})]
        if self.live is not None and not self.live.error:
            sources.append(("slurmctld", {n: (r.get("Gres"), r.get("AvailableFeatures", ""))
                                          for n, r in self.live.nodes.items()}))
        gres_conf = self.conf_dir / "gres.conf"
        file_nodes: dict[str, tuple[str, int]] = {}
        any_gpu = any_shared = False
        for where, nodes in sources:
            sharing, left_alone = self._sharing_nodes(where), []
            for node, (gres, features) in sorted(nodes.items()):
                tokens = gres_tokens(gres)
                gpus = gpu_counts(tokens)
                if not gpus:
                    continue
                any_gpu = True
                if sharing is not None and node not in sharing:
                    left_alone.append(node)
                    continue
                any_shared = True
                self._check_node(where, node, gpus, tokens, features or "")
                if where != "slurmctld" and len(gpus) == 1 and gpus[0][0]:
                    file_nodes[node] = (gpus[0][0], gpus[0][1])
            if left_alone:
                self.add("nodes", "ok", f"{compress_hostlist(left_alone)}: GPU nodes outside "
                         f"the sharing partitions, left alone ({where})", where=where)
        if not any_gpu and not any(f.check == "include" for f in self.conf.problems):
            self.add("nodes", "warning", "no node declares gres gpu: nothing to share",
                     "NodeName=<node> Gres=gpu:<type>:<count>,shard:<count x GiB> ...",
                     str(self.slurm_conf_path))
        elif any_gpu and not any_shared and self.config.policy.sharing_partitions:
            self.add("nodes", "warning", "no GPU node is in the sharing partitions "
                     f"({', '.join(self.config.policy.sharing_partitions)}): nothing to share",
                     "add GPU nodes to a sharing partition's Nodes= in "
                     f"{self.slurm_conf_path}, or name their partition in sharing_partitions "
                     f"of {self.config_path}", str(self.slurm_conf_path))
        if not file_nodes:
            return
        if not gres_conf.exists():
            self.add("gres-conf", "error", f"{gres_conf} is missing: slurmd cannot offer shards",
                     "slurm-gpushare gen-config --nodes-from-sinfo (gres.conf lines)",
                     str(gres_conf))
            return
        problems: list[Finding] = []
        try:
            declared = gres_conf_units(gres_conf, self.conf.nodes, problems)
        except OSError as exc:
            self.add("gres-conf", "error", f"cannot read {gres_conf}: {exc.strerror}",
                     "slurm-gpushare gen-config --nodes-from-sinfo (gres.conf lines)",
                     str(gres_conf))
            return
        self.findings.extend(problems)
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
        if not wrong and not problems:
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
            # The node's Gres= with its sharing count replaced (GPUs split by socket kept).
            current = (self.conf.nodes.get(node, {}).get("gres") if self.conf else None)
            gres = ",".join([t for t in (current or f"gpu:{gpu_type}:{count}").split(",")
                             if t.split(":")[0] not in ("shard", "mps")] + [f"{name}:{expected}"])
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
