"""The multi-host test cluster's addressing: one /24 per port base, never shared."""

import pytest

from devcluster.netns import NetworkError, subnet_for


def test_each_port_base_has_its_own_subnet_of_ten_slash_eight():
    subnets = {base: subnet_for(base) for base in range(16000, 26000, 250)}
    assert len(set(subnets.values())) == len(subnets)
    assert str(subnet_for(23250)) == "10.90.210.0/24"
    assert all(s.prefixlen == 24 and str(s).startswith("10.") for s in subnets.values())


@pytest.mark.parametrize("base", [0, -1, 65536])
def test_a_port_base_that_is_no_port_is_refused(base):
    with pytest.raises(NetworkError):
        subnet_for(base)
