"""sbatch's command line and ``#SBATCH`` lines, read as sbatch 22.05 reads them.

Two uses: the wrapper must find where sbatch's options end (the script and its own arguments
follow and must pass untouched), and ``--explain`` must build the same job_desc fields the
``job_submit`` hook would see for the submission.

The option table is sbatch 22.05.8's own (``slurm_option_table_create`` in
``src/common/slurm_opt.c``: each long name, whether it takes an argument, its short letter).
``getopt_long`` rules apply: options stop at the first non-option (the optstring starts with
``+``) or at ``--``; a long option may be shortened to a unique prefix; a short option's
argument is attached (``-pgpu``) or the next word (``-p gpu``).

Precedence is sbatch's: ``#SBATCH`` lines, then ``SBATCH_*`` environment variables, then the
command line, each overriding the one before. The translation into job_desc fields mirrors
``_fill_job_desc_from_opts`` in ``src/sbatch/sbatch.c`` (22.05): GPU options become
``gres:gpu:...`` TRES strings, ``--gres`` gets ``gres:`` before each of its tokens.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

NO_ARG, REQUIRED, OPTIONAL = 0, 1, 2

# name -> (has_arg, short letter or "")
LONG_OPTIONS: dict[str, tuple[int, str]] = {
    "account": (REQUIRED, "A"), "acctg-freq": (REQUIRED, ""), "array": (REQUIRED, "a"),
    "batch": (REQUIRED, ""), "bb": (REQUIRED, ""), "bbf": (REQUIRED, ""),
    "begin": (REQUIRED, "b"), "chdir": (REQUIRED, "D"), "cluster": (REQUIRED, ""),
    "cluster-constraint": (REQUIRED, ""), "clusters": (REQUIRED, "M"),
    "comment": (REQUIRED, ""), "constraint": (REQUIRED, "C"), "container": (REQUIRED, ""),
    "context": (REQUIRED, ""), "contiguous": (NO_ARG, ""), "core-spec": (REQUIRED, "S"),
    "cores-per-socket": (REQUIRED, ""), "cpu-freq": (REQUIRED, ""),
    "cpus-per-gpu": (REQUIRED, ""), "cpus-per-task": (REQUIRED, "c"),
    "deadline": (REQUIRED, ""), "delay-boot": (REQUIRED, ""), "dependency": (REQUIRED, "d"),
    "distribution": (REQUIRED, "m"), "error": (REQUIRED, "e"), "exclude": (REQUIRED, "x"),
    "exclusive": (OPTIONAL, ""), "export": (REQUIRED, ""), "export-file": (REQUIRED, ""),
    "extra-node-info": (REQUIRED, "B"), "get-user-env": (OPTIONAL, ""), "gid": (REQUIRED, ""),
    "gpu-bind": (REQUIRED, ""), "gpu-freq": (REQUIRED, ""), "gpus": (REQUIRED, "G"),
    "gpus-per-node": (REQUIRED, ""), "gpus-per-socket": (REQUIRED, ""),
    "gpus-per-task": (REQUIRED, ""), "gres": (REQUIRED, ""), "gres-flags": (REQUIRED, ""),
    "help": (NO_ARG, "h"), "hint": (REQUIRED, ""), "hold": (NO_ARG, "H"),
    "ignore-pbs": (NO_ARG, ""), "input": (REQUIRED, "i"), "job-name": (REQUIRED, "J"),
    "kill-on-invalid-dep": (REQUIRED, ""), "licenses": (REQUIRED, "L"),
    "mail-type": (REQUIRED, ""), "mail-user": (REQUIRED, ""), "mcs-label": (REQUIRED, ""),
    "mem": (REQUIRED, ""), "mem-bind": (REQUIRED, ""), "mem-per-cpu": (REQUIRED, ""),
    "mem-per-gpu": (REQUIRED, ""), "mincpus": (REQUIRED, ""), "network": (REQUIRED, ""),
    "nice": (OPTIONAL, ""), "no-kill": (OPTIONAL, "k"), "no-requeue": (NO_ARG, ""),
    "nodefile": (REQUIRED, "F"), "nodelist": (REQUIRED, "w"), "nodes": (REQUIRED, "N"),
    "ntasks": (REQUIRED, "n"), "ntasks-per-core": (REQUIRED, ""),
    "ntasks-per-gpu": (REQUIRED, ""), "ntasks-per-node": (REQUIRED, ""),
    "ntasks-per-socket": (REQUIRED, ""), "ntasks-per-tres": (REQUIRED, ""),
    "open-mode": (REQUIRED, ""), "output": (REQUIRED, "o"), "overcommit": (NO_ARG, "O"),
    "oversubscribe": (NO_ARG, "s"), "parsable": (NO_ARG, ""), "partition": (REQUIRED, "p"),
    "power": (REQUIRED, ""), "prefer": (REQUIRED, ""), "priority": (REQUIRED, ""),
    "profile": (REQUIRED, ""), "propagate": (OPTIONAL, ""), "qos": (REQUIRED, "q"),
    "quiet": (NO_ARG, "Q"), "reboot": (NO_ARG, ""), "requeue": (NO_ARG, ""),
    "reservation": (REQUIRED, ""), "signal": (REQUIRED, ""),
    "sockets-per-node": (REQUIRED, ""), "spread-job": (NO_ARG, ""), "switches": (REQUIRED, ""),
    "tasks-per-node": (REQUIRED, ""), "test-only": (NO_ARG, ""), "thread-spec": (REQUIRED, ""),
    "threads-per-core": (REQUIRED, ""), "time": (REQUIRED, "t"), "time-min": (REQUIRED, ""),
    "tmp": (REQUIRED, ""), "uid": (REQUIRED, ""), "usage": (NO_ARG, ""),
    "use-min-nodes": (NO_ARG, ""), "verbose": (NO_ARG, "v"), "version": (NO_ARG, "V"),
    "wait": (NO_ARG, "W"), "wait-all-nodes": (REQUIRED, ""), "wckey": (REQUIRED, ""),
    "wrap": (REQUIRED, ""),
}
SHORT_OPTIONS: dict[str, str] = {short: name for name, (_, short) in LONG_OPTIONS.items() if short}

# SBATCH_* input environment variables that set an option the decision depends on.
ENV_OPTIONS = {
    "SBATCH_ACCOUNT": "account", "SBATCH_CONSTRAINT": "constraint",
    "SBATCH_CPUS_PER_GPU": "cpus-per-gpu", "SBATCH_EXCLUSIVE": "exclusive",
    "SBATCH_GPUS": "gpus", "SBATCH_GPUS_PER_NODE": "gpus-per-node",
    "SBATCH_GPU_FREQ": "gpu-freq",
    "SBATCH_GPUS_PER_SOCKET": "gpus-per-socket", "SBATCH_GPUS_PER_TASK": "gpus-per-task",
    "SBATCH_GRES": "gres", "SBATCH_JOB_NAME": "job-name", "SBATCH_MEM_PER_GPU": "mem-per-gpu",
    "SBATCH_PARTITION": "partition", "SBATCH_QOS": "qos", "SBATCH_TIMELIMIT": "time",
}

MAGIC = "#SBATCH"
WRAP_HEADER = "#!/bin/sh\n# This script was created by sbatch --wrap.\n\n"
INFINITE = 0xFFFFFFFF


class SbatchArgsError(ValueError):
    """Arguments sbatch itself would refuse (or that --explain cannot model)."""


@dataclass(frozen=True)
class Option:
    name: str  # long name, e.g. "partition"
    value: str | None  # None for options without an argument


@dataclass
class CommandLine:
    """sbatch's argv split where sbatch splits it."""

    options: list[Option]
    option_words: list[str]  # the words that made up the options (wrapper flags removed)
    script: str | None  # path as given; None: --wrap or the script comes on stdin
    script_args: list[str]
    wrapper_flags: set[str] = field(default_factory=set)
    hetjob: bool = False  # a " : " separated heterogeneous job

    def last(self, name: str) -> Option | None:
        found = [o for o in self.options if o.name == name]
        return found[-1] if found else None


def _long(word: str) -> tuple[str, int]:
    """Resolve a (possibly shortened) long option name as getopt_long does."""
    if word in LONG_OPTIONS:
        return word, LONG_OPTIONS[word][0]
    matches = [n for n in LONG_OPTIONS if n.startswith(word)]
    if len(matches) == 1:
        return matches[0], LONG_OPTIONS[matches[0]][0]
    if not matches:
        raise SbatchArgsError(f"unrecognized option '--{word}'")
    raise SbatchArgsError(f"option '--{word}' is ambiguous ({', '.join(sorted(matches))})")


def parse_options(words: list[str], *, wrapper_flags: Iterable[str] = (),
                  stop_at_script: bool = True) -> tuple[list[Option], int, list[str], set[str]]:
    """getopt_long over ``words``. Returns (options, index of the first non-option word,
    the option words kept, wrapper flags seen). Wrapper flags (exact ``--name`` only) are
    taken out; everything else is kept word for word."""
    wrapper_flags = set(wrapper_flags)
    options: list[Option] = []
    kept: list[str] = []
    seen_flags: set[str] = set()
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            kept.append(word)
            return options, i + 1, kept, seen_flags
        if word in wrapper_flags:
            seen_flags.add(word)
            i += 1
            continue
        if word.startswith("--"):
            body = word[2:]
            name_part, eq, inline = body.partition("=")
            name, has_arg = _long(name_part)
            used = [word]
            if eq:
                if has_arg == NO_ARG:
                    raise SbatchArgsError(f"option '--{name}' doesn't allow an argument")
                value: str | None = inline
            elif has_arg == REQUIRED:
                if i + 1 >= len(words):
                    raise SbatchArgsError(f"option '--{name}' requires an argument")
                value = words[i + 1]
                used.append(value)
            else:
                value = None
            options.append(Option(name, value))
            kept += used
            i += len(used)
            continue
        if word.startswith("-") and word != "-":
            used = [word]
            j = 1
            while j < len(word):
                letter = word[j]
                if letter not in SHORT_OPTIONS:
                    raise SbatchArgsError(f"invalid option -- '{letter}'")
                name = SHORT_OPTIONS[letter]
                has_arg = LONG_OPTIONS[name][0]
                rest = word[j + 1:]
                if has_arg == NO_ARG:
                    options.append(Option(name, None))
                    j += 1
                    continue
                if rest:
                    options.append(Option(name, rest))
                elif has_arg == REQUIRED:
                    if i + 1 >= len(words):
                        raise SbatchArgsError(f"option requires an argument -- '{letter}'")
                    used.append(words[i + 1])
                    options.append(Option(name, words[i + 1]))
                else:
                    options.append(Option(name, None))
                break
            kept += used
            i += len(used)
            continue
        if word == ":" or not stop_at_script:
            # ":" separates the components of a heterogeneous job; other non-options in
            # #SBATCH lines are ignored by sbatch.
            kept.append(word)
            if word == ":":
                options.append(Option(":", None))
            i += 1
            continue
        return options, i, kept, seen_flags
    return options, len(words), kept, seen_flags


def split_command_line(argv: list[str], wrapper_flags: Iterable[str] = ()) -> CommandLine:
    """Split sbatch's argv into options, the script path and the script's own arguments."""
    options, index, kept, flags = parse_options(list(argv), wrapper_flags=wrapper_flags)
    rest = list(argv[index:])
    hetjob = any(o.name == ":" for o in options)
    options = [o for o in options if o.name != ":"]
    has_wrap = any(o.name == "wrap" for o in options)
    script = None if has_wrap or not rest else rest[0]
    script_args = rest if has_wrap else rest[1:]
    return CommandLine(options=options, option_words=kept, script=script,
                       script_args=script_args, wrapper_flags=flags, hetjob=hetjob)


def script_options(script: str) -> list[Option]:
    """The options of the ``#SBATCH`` lines at the top of a script (first component only).

    Like sbatch, scanning stops at the first line that is neither blank nor a comment; on a
    line, an unquoted ``#`` starts a comment.
    """
    words: list[str] = []
    for line in script.splitlines():
        if line.startswith(MAGIC):
            rest = line[len(MAGIC):]
            if re.match(r"\s*(hetjob|packjob)\b", rest, re.IGNORECASE):
                break  # later components are other jobs
            try:
                words += shlex.split(rest, comments=True)
            except ValueError:  # unbalanced quote: sbatch takes the words as they are
                words += rest.split()
            continue
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
    options, _, _, _ = parse_options(words, stop_at_script=False)
    return [o for o in options if o.name != ":"]


def env_options(environ: Mapping[str, str]) -> list[Option]:
    return [Option(name, environ[var]) for var, name in ENV_OPTIONS.items() if var in environ]


# ---- values --------------------------------------------------------------------------------

def time_minutes(text: str) -> int:
    """sbatch's ``--time`` (``time_str2mins``): min, min:sec, h:min:sec, d-h, d-h:min,
    d-h:min:sec; seconds round up; ``INFINITE``/``UNLIMITED``/``-1`` is infinite."""
    text = text.strip()
    if text.lower() in ("-1", "infinite", "unlimited"):
        return INFINITE
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not match:
        raise SbatchArgsError(f"invalid time limit {text!r}")
    days, first, second, third = match.groups()
    days = int(days or 0)
    if match.group(1) is not None:  # d-h[:m[:s]]
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
    elif third is not None:  # h:m:s
        hours, minutes, seconds = int(first), int(second), int(third)
    else:  # m or m:s
        hours, minutes, seconds = 0, int(first), int(second or 0)
    total = days * 1440 + hours * 60 + minutes + math.ceil(seconds / 60)
    return total


def megabytes(text: str) -> int:
    """``str_to_mbytes``: a number with an optional K/M/G/T suffix, MiB by default."""
    match = re.fullmatch(r"(\d+)([kKmMgGtT]?).*", text.strip())
    if not match:
        raise SbatchArgsError(f"invalid memory size {text!r}")
    number, unit = int(match.group(1)), match.group(2).lower()
    if unit == "k":
        return (number + 1023) // 1024
    return number * {"": 1, "m": 1, "g": 1024, "t": 1024 * 1024}[unit]


def node_counts(text: str) -> tuple[int, int | None]:
    """``-N min[-max]``; a single number sets both."""
    match = re.fullmatch(r"(\d+)(?:-(\d*))?", text.strip())
    if not match:
        raise SbatchArgsError(f"invalid node count {text!r}")
    low = int(match.group(1))
    if match.group(2) is None:
        return low, low
    return low, int(match.group(2)) if match.group(2) else None


def _positive_int(text: str, what: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()):
        raise SbatchArgsError(f"invalid {what} {text!r}")
    return int(text)


def _tres(prefix: str, spec: str | None) -> str:
    """``xfmt_tres``: ``prefix:token`` for each comma-separated token."""
    if not spec:
        return ""
    return ",".join(f"{prefix}:{token}" for token in spec.split(",") if token)


def _gres(spec: str | None, gres: str = "gres:") -> str:
    """``gres_prepend_tres_type``: ``gres:`` (23.11+: ``gres/``) before each token; ``none``
    means no gres."""
    if not spec or spec.lower() == "none":
        return ""
    return gres + spec.replace(",", "," + gres)


def _gpus_per_task(spec: str | None, gres: str) -> str:
    """``--gpus-per-task`` in ``tres_per_task``: ``gres:gpu:N`` (22.05), or from 23.11 on
    ``gres/gpu[:type]=N`` (``_get_gpu_cnt_and_str`` in 24.11's ``src/common/slurm_opt.c``)."""
    if gres == "gres:" or not spec:
        return _tres("gres:gpu", spec)
    gtype, _, count = spec.rpartition(":") if ":" in spec else ("", "", spec)
    return f"gres/gpu{':' + gtype if gtype else ''}={count}"


# ---- the submission as the hook sees it ---------------------------------------------------

@dataclass
class Submission:
    """A job submission reduced to what sbatch sends and the hook reads."""

    values: dict[str, str | None]  # effective option values, last one wins
    script: str
    default_name: str
    argv: list[str] = field(default_factory=list)  # job_desc.argv: script path, then arguments

    @classmethod
    def build(cls, command_line: CommandLine, script: str, *,
              environ: Mapping[str, str] | None = None) -> "Submission":
        environ = os.environ if environ is None else environ
        if command_line.hetjob:
            raise SbatchArgsError("--explain does not model heterogeneous jobs (':' components)")
        wrap = command_line.last("wrap")
        if wrap is not None:
            script = WRAP_HEADER + (wrap.value or "") + "\n"
            default_name = "wrap"
        elif command_line.script:
            default_name = Path(command_line.script).name
        else:
            default_name = "sbatch"
        values: dict[str, str | None] = {}
        for option in [*script_options(script), *env_options(environ), *command_line.options]:
            if option.name == "oversubscribe":
                values["exclusive"] = "oversubscribe"  # one field (job_desc.shared), last wins
            elif option.name == "exclusive":
                values["exclusive"] = option.value or ""
            else:
                values[option.name] = option.value
        argv = ([command_line.script or "", *command_line.script_args]
                if wrap is None and command_line.script_args else [])
        return cls(values=values, script=script, default_name=default_name, argv=argv)

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def job_fields(self, *, uid: int, user: str, default_partition: str = "",
                   gres: str = "gres:") -> dict:
        """The job object of a ``decide``/``explain`` request (see ``protocol.JOB_FIELDS``).
        ``gres``: how the installed sbatch prefixes gres (``gres/`` from 23.11)."""
        job: dict = {"uid": uid, "user": user}
        gpu = gres + "gpu"

        def put(name, value):
            if value not in (None, ""):
                job[name] = value

        put("account", self.get("account"))
        put("partition", self.get("partition") or default_partition)
        put("qos", self.get("qos"))
        # Order as sbatch builds it: --gpus-per-node first, then --gres.
        per_node = [t for t in (_tres(gpu, self.get("gpus-per-node")),
                                _gres(self.get("gres"), gres)) if t]
        put("tres_per_node", ",".join(per_node))
        put("tres_per_job", _tres(gpu, self.get("gpus")))
        put("tres_per_socket", _tres(gpu, self.get("gpus-per-socket")))
        put("tres_per_task", _gpus_per_task(self.get("gpus-per-task"), gres))
        if self.get("cpus-per-gpu"):
            put("cpus_per_tres",
                f"{gpu}:{_positive_int(self.get('cpus-per-gpu'), 'CPUs per GPU')}")
        if self.get("mem-per-gpu"):
            put("mem_per_tres", f"{gpu}:{megabytes(self.get('mem-per-gpu'))}")
        put("tres_freq", f"gpu:{self.get('gpu-freq')}" if self.get("gpu-freq") else "")
        tasks_per_gpu = self.get("ntasks-per-gpu") or self.get("ntasks-per-tres")
        if tasks_per_gpu:
            job["ntasks_per_tres"] = _positive_int(tasks_per_gpu, "tasks per GPU")
        put("features", self.get("constraint"))
        put("prefer", self.get("prefer"))
        put("exc_nodes", self.get("exclude"))
        put("req_nodes", self.get("nodelist"))
        put("reservation", self.get("reservation"))
        if self.get("time"):
            job["time_limit"] = time_minutes(self.get("time"))
        if self.get("nodes"):
            low, high = node_counts(self.get("nodes"))
            job["min_nodes"] = low
            if high is not None:
                job["max_nodes"] = high
        if self.get("ntasks"):
            job["num_tasks"] = _positive_int(self.get("ntasks"), "task count")
        if "exclusive" in self.values:
            # job_desc.shared: 0 exclusive, 1 oversubscribe, 2 exclusive=user, 3 exclusive=mcs
            mode = (self.values["exclusive"] or "").lower()
            job["shared"] = {"oversubscribe": 1, "user": 2, "mcs": 3}.get(mode, 0)
        job["script"] = self.script
        job["batch"] = True
        if self.argv:
            job["argv"] = list(self.argv)
        job["name"] = self.get("job-name") or self.default_name
        put("comment", self.get("comment"))
        return job


def add_comment_token(comment: str | None, token: str) -> str:
    """The comment with ``token`` added (once), the user's own text kept."""
    comment = comment or ""
    if token in re.split(r"[\s,;]+", comment):
        return comment
    return f"{comment} {token}".strip()
