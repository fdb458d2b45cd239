"""Hostlists and index ranges: malformed, reversed or huge ones are a clear error, never
garbage names or a hang."""

from __future__ import annotations

import time

import pytest

from slurm_gpushare.core.hostlist import (MAX_HOSTS, HostlistError, compress_hostlist,
                                          expand_hostlist, expand_ranges)


def test_well_formed_hostlists_expand_as_before():
    assert expand_hostlist("gpu-[01-03,07],login1") == ["gpu-01", "gpu-02", "gpu-03", "gpu-07",
                                                        "login1"]
    assert expand_hostlist("rack[1-2]-n[09-10]") == ["rack1-n09", "rack1-n10", "rack2-n09",
                                                     "rack2-n10"]
    assert expand_hostlist("/dev/nvidia[0-3]") == [f"/dev/nvidia{i}" for i in range(4)]
    assert expand_hostlist("") == [] and expand_hostlist("a,,b") == ["a", "b"]
    assert expand_ranges("0-2,5") == [0, 1, 2, 5] and expand_ranges("") == []
    names = expand_hostlist(f"n[1-{MAX_HOSTS}]")
    assert len(names) == MAX_HOSTS and expand_hostlist(compress_hostlist(names)) == names


@pytest.mark.parametrize("text", ["gpu[01-", "gpu[01-:a100", "gpu01]", "gpu[[1-2]]", "gpu[a-b]",
                                  "gpu[1-]", "gpu[]", "gpu[1,,2]", "gpu[-3]", "gpu[1-2-3]"])
def test_a_malformed_hostlist_is_an_error(text):
    with pytest.raises(HostlistError, match="malformed"):
        expand_hostlist(text)


def test_a_reversed_range_is_an_error():
    with pytest.raises(HostlistError, match="reversed range 04-01"):
        expand_hostlist("gpu[04-01]")
    with pytest.raises(HostlistError, match="reversed range 5-2"):
        expand_ranges("5-2")


@pytest.mark.parametrize("text", ["gpu[01-99999999]", f"n[0-{MAX_HOSTS}]",
                                  "a[1-300]b[1-300]", "a[1-40000],b[1-40000]"])
def test_a_hostlist_naming_too_many_hosts_is_an_error_at_once(text):
    started = time.monotonic()
    with pytest.raises(HostlistError, match=f"more than {MAX_HOSTS}"):
        expand_hostlist(text)
    assert time.monotonic() - started < 5


def test_an_index_range_too_large_is_an_error_at_once():
    with pytest.raises(HostlistError, match=f"more than {MAX_HOSTS}"):
        expand_ranges("0-99999999999")
