"""Can Slurm run the share we would write? The GPU types a rewrite may name, checked node by node.

A rewrite replaces a whole GPU by a share and adds a feature constraint naming GPU types. It is
only safe when at least one node the job could use today has one of those types. A node counts
when it is in one of the job's partitions, satisfies the user's ``--constraint``, is in the
``--nodelist`` (all of them, for ``-w``), not in ``--exclude``, in the job's reservation (or in
none, without one) and in a state that takes new jobs. Anything that cannot be checked keeps the
job as submitted: the constraint is parsed with a small grammar that knows Slurm's operators for
one-node jobs and refuses the rest.

``check`` is a pure function of the request, the types that fit and the cluster view; it is called
by ``policy.decide`` and so serves the daemon and the simulator alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from slurm_gpushare.core.config import GpuType
from slurm_gpushare.core.hostlist import expand_hostlist

# sinfo %t states (suffix flags such as ``*`` not responding, ``~`` powered off, stripped first)
# in which a node takes no new job.
# ("plnd", planned by backfill, and "idle~", powered off, do take jobs.)
UNUSABLE_STATES = frozenset({"down", "drain", "drng", "fail", "failg", "maint", "inval", "futr",
                             "unk", "npc", "reboot", "resv", "pow_dn", "powering_down"})


class ConstraintError(ValueError):
    """A --constraint this module does not evaluate (the job is then kept as submitted)."""


# --- Slurm feature expressions (--constraint), for jobs on one node ------------------------
#
# Slurm (22.05, build_feature_list in job_mgr.c) reads features joined by ``&`` (AND) and ``|``
# (OR), grouped by ``()``, ``[]`` (matching OR: all nodes share one alternative) and counted by
# ``name*N`` (N nodes with it). For a one-node job ``[a|b]`` is ``(a|b)`` and ``a*1`` is ``a``.
# Mixing ``&`` and ``|`` without brackets, counts above one and any other character are refused:
# Slurm evaluates such expressions left to right, and a rewrite must not guess.

_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z0-9_.\-]+)(?:\*(?P<count>\d+))?|(?P<op>[&|()\[\]]))")


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            raise ConstraintError(f"unsupported character {text[pos]!r}")
        if match.group("name"):
            if match.group("count") is not None and int(match.group("count")) != 1:
                raise ConstraintError("a node count above one")
            out.append(("name", match.group("name")))
        else:
            out.append(("op", match.group("op")))
        pos = match.end()
    return out


Expr = tuple  # ("name", feature) | ("and", [Expr, ...]) | ("or", [Expr, ...])


def parse_constraint(text: str) -> Expr | None:
    """Parse a --constraint (None when empty); raises ConstraintError."""
    tokens = _tokens(text)
    if not tokens:
        return None
    expr, pos = _parse_group(tokens, 0)
    if pos != len(tokens):
        raise ConstraintError("unbalanced brackets")
    return expr


def _parse_group(tokens, pos):
    operands, operator = [], None
    while True:
        if pos >= len(tokens):
            raise ConstraintError("expression ends early")
        kind, value = tokens[pos]
        if kind == "name":
            operands.append(("name", value))
            pos += 1
        elif value in "([":
            closing = ")" if value == "(" else "]"
            inner, pos = _parse_group(tokens, pos + 1)
            if pos >= len(tokens) or tokens[pos][1] != closing:
                raise ConstraintError("unbalanced brackets")
            operands.append(inner)
            pos += 1
        else:
            raise ConstraintError(f"unexpected {value!r}")
        if pos >= len(tokens) or tokens[pos][1] in ")]":
            break
        op = tokens[pos][1]
        if op not in "&|":
            raise ConstraintError(f"unexpected {op!r}")
        if operator is not None and op != operator:
            raise ConstraintError("& and | mixed without brackets")
        operator = op
        pos += 1
    if len(operands) == 1:
        return operands[0], pos
    return ("and" if operator == "&" else "or", operands), pos


def satisfies(expr: Expr | None, features: set[str] | frozenset[str]) -> bool:
    """Whether a node with ``features`` satisfies the parsed constraint."""
    if expr is None:
        return True
    kind, value = expr
    if kind == "name":
        return value in features
    results = (satisfies(e, features) for e in value)
    return all(results) if kind == "and" else any(results)


def render(expr: Expr, parent: str = "") -> str:
    """The canonical text of a parsed constraint (brackets only where needed)."""
    kind, value = expr
    if kind == "name":
        return value
    text = ("&" if kind == "and" else "|").join(render(e, kind) for e in value)
    return f"({text})" if parent and parent != kind else text


# --- Which types and nodes a rewrite may name ---------------------------------------------

@dataclass(frozen=True)
class Placement:
    """Where a share of the job could run: types (best first, as given) and the user's
    constraint in canonical form; or why nothing can be said (``code`` set)."""

    types: tuple[str, ...] = ()
    constraint: str = ""
    code: str = ""
    reason: str = ""
    dropped: Mapping[str, str] = field(default_factory=dict)  # type -> why no node of it serves


def state_usable(state: str, in_reservation: bool = False) -> bool:
    """Whether a node in this sinfo %t state can start a job now."""
    base = state.rstrip("*~#!%$@^-+").lower()
    if not base:
        return True
    if state.endswith("*"):
        return False  # not responding
    if base in ("resv", "maint"):
        return in_reservation  # reserved nodes take only their reservation's jobs
    return base not in UNUSABLE_STATES


def check(request, fits: Sequence[GpuType], view, *,
          reservations: Mapping[str, Sequence[str]] | None = None) -> Placement:
    """``_check``, answered once per view snapshot for jobs that ask for the same thing: the
    daemon's snapshots never change and carry a ``checks`` dict (many submissions of a large
    cluster would otherwise each scan its nodes)."""
    checks = getattr(view.nodes(), "checks", None) if view is not None and reservations is None \
        else None
    if checks is None:
        return _check(request, fits, view, reservations=reservations)
    key = ("feasibility", request.partition, request.features, request.req_nodes,
           request.exc_nodes, request.reservation, tuple(g.name for g in fits))
    if key not in checks:
        checks[key] = _check(request, fits, view)
    return checks[key]


def _check(request, fits: Sequence[GpuType], view, *,
           reservations: Mapping[str, Sequence[str]] | None = None) -> Placement:
    """The types among ``fits`` where a share of ``request`` can run.

    ``view`` is the policy's ClusterView or None. Without a view only the constraint is checked
    (the simulator's traces carry no node lists); the daemon always passes its view, and an
    empty one (not yet read from Slurm) keeps the job.
    """
    try:
        expr = parse_constraint(request.features or "")
    except ConstraintError as exc:
        return Placement(code="constraint-unsupported",
                         reason=f"the job's --constraint cannot be checked safely ({exc})")
    # Rendered as an operand of AND, ready for the rewrite to append its types.
    constraint = render(expr, "and") if expr is not None else ""
    if view is None:
        return Placement(types=tuple(g.name for g in fits), constraint=constraint)
    nodes = view.nodes()
    if not nodes:
        return Placement(code="not-checkable",
                         reason="the service has not read the cluster's nodes yet")
    try:
        required = set(expand_hostlist(request.req_nodes)) if request.req_nodes else set()
        excluded = set(expand_hostlist(request.exc_nodes)) if request.exc_nodes else set()
    except ValueError as exc:
        return Placement(code="not-checkable", reason=f"unreadable node list ({exc})")
    reserved: set[str] | None = None
    if request.reservation:
        known = (reservations if reservations is not None
                 else getattr(view, "reservations", lambda: {})())
        if request.reservation not in known:
            return Placement(code="not-checkable",
                             reason=f"reservation {request.reservation} is not known to the service")
        reserved = set(known[request.reservation])
    partitions = [p for p in request.partition.split(",") if p]
    feature_of = {g.name: g.feature for g in fits}
    by_name = {n.name: n for n in nodes if n.name in required} if required else {}
    if required - by_name.keys():
        return Placement(code="no-valid-type", reason="--nodelist names nodes without a "
                                                      "sharing GPU type")

    # Runs on the submit path for every eligible job: the per-node tests that do not depend on
    # the node's name are answered once per kind of node (type, partitions, features, state),
    # and a type is settled by its first usable node.
    verdict_of_kind: dict[tuple, str] = {}

    def kind_verdict(node) -> str:
        kind = (node.gpu_type, node.partitions, getattr(node, "features", ()),
                getattr(node, "state", ""))
        verdict = verdict_of_kind.get(kind)
        if verdict is None:
            features = set(kind[2] or ()) | {feature_of[node.gpu_type]}
            if node.partitions and partitions and not any(p in node.partitions
                                                          for p in partitions):
                verdict = "partition"
            elif not state_usable(kind[3], reserved is not None):
                verdict = "state"
            elif not satisfies(expr, features):
                verdict = "--constraint"
            else:
                verdict = ""
            verdict_of_kind[kind] = verdict
        return verdict

    def why_not(node) -> str:
        """Empty when the node can take a share of this job; else why not."""
        if node.gpu_type not in feature_of:
            return "type"
        if node.name in excluded:
            return "--exclude"
        if required and node.name not in required:
            return "--nodelist"
        if reserved is not None and node.name not in reserved:
            return "reservation"
        return kind_verdict(node)

    if required:
        bad = sorted(f"{name} ({why})" for name in required
                     if (why := why_not(by_name[name])))
        if bad:
            return Placement(code="no-valid-type",
                             reason=f"--nodelist node(s) cannot take a share: {', '.join(bad)}")
    usable_types: set[str] = set()
    reasons: dict[str, set[str]] = {name: set() for name in feature_of}
    # With --nodelist only its nodes can serve (all of them passed above).
    for node in (by_name.values() if required else nodes):
        if node.gpu_type not in feature_of or node.gpu_type in usable_types:
            continue
        why = why_not(node)
        if why:
            reasons[node.gpu_type].add(why)
        else:
            usable_types.add(node.gpu_type)
    types = tuple(g.name for g in fits if g.name in usable_types)
    dropped = {g.name: ", ".join(sorted(reasons[g.name])) or "no node"
               for g in fits if g.name not in usable_types}
    if not types:
        detail = "; ".join(f"{t}: {why}" for t, why in dropped.items())
        return Placement(code="no-valid-type", dropped=dropped,
                         reason=f"no node of a type the job fits can take it ({detail})")
    return Placement(types=types, constraint=constraint, dropped=dropped)
