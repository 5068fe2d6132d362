"""A bed of tests/netbed.py built (root only; slow, in conftest's SLOW table): its hosts are their
own hostnames, its shaped link delays and rate-limits what crosses it, its teardown leaves
nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

import netbed  # noqa: E402


def _bed_or_skip():
    if os.geteuid() != 0:
        pytest.skip("the bed needs root (network namespaces)")
    try:
        return netbed.Bed(2).build()
    except netbed.Unavailable as e:
        pytest.skip(f"the bed cannot be built here: {e}")


def _probe(bed) -> dict:
    got = bed.probe_link(port=47001, count=40, mib=4)
    assert "error" not in got, got
    return got


def test_a_built_bed_delays_and_limits_its_shaped_link():
    """2 ms one way and 100 Mbit/s through bedlink: every round trip at least 4 ms, one stream
    at most the rate; then unshaped again, the round trip well under it. Each host is its own
    hostname and namespace; the teardown leaves no namespace behind."""
    bed = _bed_or_skip()
    try:
        names = [subprocess.run(bed.in_host(i, ["hostname"]), capture_output=True, text=True).stdout.strip()
                 for i in (1, 2)]
        assert names == ["host1", "host2"]
        bed.set_link(2000, 100 * 10**6)
        shaped = _probe(bed)
        assert shaped["tcp_rtt_us"]["min"] >= 4000 and shaped["udp_rtt_us"]["min"] >= 4000
        assert shaped["stream_bytes_received"] == 4 << 20 and shaped["stream_gbit_s"] <= 0.1 * 1.05
        bed.set_link()
        assert _probe(bed)["tcp_rtt_us"]["median"] < 4000
    finally:
        bed.teardown()
    assert not [ns for ns in os.listdir(netbed.NETNS_DIR) if ns.startswith(bed.prefix)]
