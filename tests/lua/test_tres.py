"""TRES parsing: the Python module and the hook's Lua module must read strings the same way."""

from __future__ import annotations

import pytest
import lupa.lua51 as lupa51

from lua_harness import REPO
from slurm_gpushare.core import tres

CASES = [
    ("gres:gpu:1", [("gres:", "gpu", None, 1)]),
    ("gres:gpu:2", [("gres:", "gpu", None, 2)]),
    ("gres:gpu:a100:1", [("gres:", "gpu", "a100", 1)]),
    ("gres/gpu:1", [("gres/", "gpu", None, 1)]),
    ("gpu:1", [("", "gpu", None, 1)]),
    ("gres:gpu:a100", [("gres:", "gpu", "a100", 1)]),
    ("gres:gpu", [("gres:", "gpu", None, 1)]),
    ("gres:gpu:1,gres:nic:1", [("gres:", "gpu", None, 1), ("gres:", "nic", None, 1)]),
    ("gres:shard:2K", [("gres:", "shard", None, 2048)]),
    # Slurm 24.11 (recorded on the 24.11 test cluster): tres_per_task counts after "=".
    ("gres/gpu=1", [("gres/", "gpu", None, 1)]),
    ("cpu=2,gres/gpu:a100=2", [("", "cpu", None, 2), ("gres/", "gpu", "a100", 2)]),
    ("gres/shard:8", [("gres/", "shard", None, 8)]),
    ("", []),
    (None, []),
]
BAD = ["gres::1", "gres:gpu:a100:x", "gres:gpu:a:b:1", "gres/gpu=x", "gres/gpu:a:b=1", "=1"]


@pytest.fixture(scope="module")
def lua_tres():
    lua = lupa51.LuaRuntime(unpack_returned_tuples=True)
    lua.execute(f'package.path = "{REPO}/slurm_gpushare/lua/?.lua;" .. package.path')
    return lua.eval('require("gpushare_tres")')


def _lua_tokens(module, text):
    result = module.parse(text)
    tokens = result[0] if isinstance(result, tuple) else result
    if tokens is None:
        return None
    return [(t.prefix, t.name, t.type, int(t.count)) for t in tokens.values()]


@pytest.mark.parametrize("text,expected", CASES)
def test_python_and_lua_agree(lua_tres, text, expected):
    parsed = [(t.prefix, t.name, t.type, t.count) for t in tres.parse(text)]
    assert parsed == expected
    assert _lua_tokens(lua_tres, text) == expected


@pytest.mark.parametrize("text", BAD)
def test_both_reject_malformed(lua_tres, text):
    with pytest.raises(tres.TresError):
        tres.parse(text)
    assert _lua_tokens(lua_tres, text) is None


def test_replace_keeps_other_tokens_and_spelling():
    shard = tres.TresToken("gres/", "shard", None, 8)
    assert tres.replace("gres/gpu:1,gres/nic:1", "gpu", shard) == "gres/shard:8,gres/nic:1"
    assert tres.replace("gres:gpu:1", "gpu", None) == ""
