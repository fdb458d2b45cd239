"""The hook's WRITABLE table and the protocol's WRITABLE_FIELDS say the same thing.

The daemon validates a decision's writes before replying and the hook validates them again
before writing (it trusts nothing it reads); a field or character allowed on one side only
would be a decision the daemon thinks valid and the hook refuses, or the reverse.
"""

from __future__ import annotations

import itertools
import re

import lupa.lua51 as lupa51
import pytest

from lua_harness import HOOK
from slurm_gpushare.core.types import WRITABLE_FIELDS

_ENTRY = re.compile(r'\{\s*"(\w+)",\s*"((?:[^"\\]|\\.)*)"\s*\}')


def lua_writable() -> dict[str, str]:
    source = HOOK.read_text()
    block = re.search(r"local WRITABLE = \{(.*?)\n\}", source, re.S)
    assert block, "the hook defines no WRITABLE table"
    return dict(_ENTRY.findall(block.group(1)))


def test_the_same_fields_are_writable_on_both_sides():
    assert set(lua_writable()) == set(WRITABLE_FIELDS)


# Values a decision might carry, and characters that must never pass (quotes, spaces, shell
# and Lua pattern specials, newlines, non-ASCII).
SAMPLES = ["", "gres:shard:8", "gres/shard:12,gres/gpu:0", "v100|a100", "(a100&gpumem80g)",
           "[v100*2|a100]", "n[1-3,05],gpu7", "gpushare:v1:share:id=0a1b:shard=8:types=a+b:why=x",
           "gpushare:v1:keep:id=-:why=first-run", "gpushare:v12:keep:why=y", "gpushare:vx:keep",
           "a b", "a;b", "a'b", 'a"b', "a\nb", "a$b", "a%b", "é", "a=b", "a+b", "1.5", "-x"]
SAMPLES += ["".join(p) for p in itertools.product("a:|&[]%=+", repeat=2)]


@pytest.mark.parametrize("field", sorted(WRITABLE_FIELDS))
def test_each_pattern_accepts_and_refuses_the_same_values(field):
    lua = lupa51.LuaRuntime(unpack_returned_tuples=True)
    match = lua.eval("function(s, p) return string.match(s, p) ~= nil end")
    pattern = lua_writable()[field].encode().decode("unicode_escape")
    for value in SAMPLES:
        python = bool(WRITABLE_FIELDS[field].match(value)) and "\n" not in value
        assert match(value, pattern) == python, (field, value)
