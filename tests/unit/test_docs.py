"""The docs name only things that exist, and document everything that exists: commands and
their options, repository files, configuration keys, the fields the hook sends, the daemon's
log events, the hook's log lines and the reason codes users see."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import pytest

from slurm_gpushare.daemon import protocol

from slurm_gpushare.user import wrapper
from slurm_gpushare.cli import cli
from slurm_gpushare.core.config import DaemonConfig, HookConfig, PolicyConfig

REPO = Path(__file__).resolve().parents[2]
DOCS = {name: (REPO / "docs" / name).read_text()
        for name in ("admin-guide.md", "user-guide.md", "privacy.md", "operations.md",
                     "reports.md")}
ALL = "\n".join(DOCS.values())


def _code(text: str) -> str:
    """The docs' code: fenced blocks and `inline spans`, one per line."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
    return "\n".join(blocks + spans)


def _command_lines(text: str) -> list[str]:
    """Code lines that run slurm-gpushare, with shell continuations joined."""
    code = re.sub(r"\\\n\s*", " ", _code(text))
    return [m.group(0) for m in re.finditer(r"slurm-gpushare [a-z][^\n`|#()]*", code)]


def _resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    ctx = click.Context(cli)
    command: click.Command = cli
    while isinstance(command, click.Group) and words:
        sub = command.get_command(ctx, words[0])
        assert sub is not None, f"no command {words[0]!r} (docs mention it)"
        command, words = sub, words[1:]
    return command, words


def test_every_command_and_option_named_in_the_docs_exists():
    lines = _command_lines(ALL)
    assert len(lines) > 20
    for line in lines:
        words = line.split()[1:]
        names = [w for w in words if re.fullmatch(r"[a-z][a-z-]*", w)]
        command, _ = _resolve(names[:2])  # a group resolves to its subcommand
        if command.name == "sbatch":
            continue  # its options are sbatch's
        known = {opt for param in command.params for opt in param.opts + param.secondary_opts}
        for word in words:
            option = word.split("=")[0]
            if re.fullmatch(r"--?[a-z][a-z-]*", option):
                assert option in known, f"{line!r}: {command.name} has no option {option}"


def test_the_wrappers_flags_in_the_docs_exist():
    for flag in set(re.findall(r"gpushare-sbatch [^\n`]*?(--explain|--no-share|--json)", ALL)):
        assert flag in wrapper.WRAPPER_FLAGS
    assert "--explain" in DOCS["user-guide.md"] and "--no-share" in DOCS["user-guide.md"]


def test_repository_files_named_in_the_docs_exist():
    named = set(re.findall(r"(?<![\w/.\-])((?:etc|slurm_gpushare/lua|scripts|docs)/[\w.\-]+)", ALL))
    assert {"etc/gpushare.toml", "etc/slurm-gpushare.service", "slurm_gpushare/lua/job_submit.lua",
            "scripts/prolog.sh"} <= named
    for path in named:
        assert (REPO / path.rstrip(".")).exists(), f"docs name {path}, which does not exist"


def _anchors(text: str) -> set[str]:
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_links_between_docs_resolve():
    for name, text in DOCS.items():
        for target, anchor in re.findall(r"\]\(([\w\-]+\.md)?(?:#([\w\-]+))?\)", text):
            linked = DOCS.get(target or name)
            assert linked is not None, f"{name} links to missing {target}"
            if anchor:
                assert anchor in _anchors(linked), f"{name} links to missing #{anchor}"


@pytest.mark.parametrize("section,cls", [("daemon", DaemonConfig), ("policy", PolicyConfig),
                                         ("hook", HookConfig)])
def test_every_configuration_key_is_in_the_reference(section, cls):
    reference = DOCS["admin-guide.md"].split("## Configuration reference")[1]
    for field in dataclasses.fields(cls):
        assert f"`{section}.{field.name}`" in reference, f"{section}.{field.name} undocumented"


def test_gpu_type_keys_are_in_the_reference():
    reference = DOCS["admin-guide.md"].split("## Configuration reference")[1]
    for key in ("memory_gib", "feature", "model"):
        assert f"`gpu_types.<name>.{key}`" in reference


def test_privacy_statement_lists_every_field_the_hook_sends():
    hook = (REPO / "slurm_gpushare" / "lua" / "job_submit.lua").read_text()
    body = re.search(r"local function read_request.*?\n  return \{(.*?)\n  \}", hook, re.S).group(1)
    sent = set(re.findall(r"^\s*(\w+) = ", body, re.M))
    assert sent == set(protocol.JOB_FIELDS), "the hook and the protocol disagree"
    for name in sent:
        assert f"`{name}`" in DOCS["privacy.md"], f"privacy.md does not mention {name}"


def test_privacy_statement_covers_every_table_of_the_store():
    store = (REPO / "slurm_gpushare" / "daemon" / "store.py").read_text()
    for table in re.findall(r"CREATE TABLE (\w+)", store):
        assert f"FROM {table}" in DOCS["privacy.md"], f"privacy.md: how to delete from {table}?"


def _daemon_events() -> set[str]:
    source = "".join(path.read_text() for path in (REPO / "slurm_gpushare" / "daemon").glob("*.py"))
    events = set(re.findall(r'\bevent\(logging\.\w+,\s*"([a-z-]+)"', source))
    events |= set(re.findall(r'log\.exception\("([a-z-]+)"', source))
    events |= set(re.findall(r'"([a-z-]+)" if op == "decide" else "([a-z-]+)"', source)[0])
    return events


def test_operations_page_documents_every_daemon_event():
    events = _daemon_events()
    assert {"decision", "explain", "reloaded", "reload-failed"} <= events
    for event in events:
        assert f"`{event}`" in DOCS["operations.md"], f"operations.md lacks event {event}"


def test_hook_log_lines_quoted_in_the_docs_are_the_hooks():
    hook = (REPO / "slurm_gpushare" / "lua" / "job_submit.lua").read_text()
    formats = [re.escape(f).replace("%s", ".*").replace("%d", ".*")
               for f in re.findall(r'slurm\.log_\w+\("([^"]*)"', hook)]
    quoted = re.findall(r"`(gpushare: [^`]*)`", DOCS["operations.md"])
    assert len(quoted) >= 5
    for text in quoted:
        line = re.sub(r"<[^>]*>", "X", text)
        assert any(re.fullmatch(f, line) for f in formats), f"the hook never logs {text!r}"


def test_user_guide_explains_every_reason_code_in_a_tag():
    policy = (REPO / "slurm_gpushare" / "core" / "policy.py").read_text()
    codes = set(re.findall(r'keep_tagged\(\s*"([a-z-]+)"', policy))
    codes |= {f"{source}-share" for source in ("history", "hint", "default")}
    assert "first-run" in codes
    codes |= set(re.findall(r'(?<![_\w])keep\(\s*"([a-z-]+)"', policy))  # untagged keeps
    codes |= set(re.findall(r'return "([a-z-]+)"', policy))  # gpu_request's keep codes
    feasibility = (REPO / "slurm_gpushare" / "core" / "feasibility.py").read_text()
    codes |= set(re.findall(r'code="([a-z-]+)"', feasibility))
    assert {"allocation", "no-valid-type", "constraint-unsupported"} <= codes
    for code in codes:
        assert f"`{code}`" in DOCS["user-guide.md"], f"user-guide.md lacks reason {code}"
