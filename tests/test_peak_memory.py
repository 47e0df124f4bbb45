"""A stage's peak memory is its own: eyas/peak_memory.py resets the process's peak resident set per stage."""

import sys

import pytest

from eyas.peak_memory import describe, stage_peak


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
def test_a_stage_after_a_bigger_one_reports_its_own_peak():
    with stage_peak() as big:
        block = bytearray(400 * 2**20)
        block[::4096] = b"x" * len(block[::4096])  # touch every page: resident, not just reserved
        del block
    with stage_peak() as small:
        pass
    assert big.own_bytes - small.own_bytes > 380 * 2**20  # the 400 MiB block, not carried into the next stage
    assert describe(small) == f", peak memory {small.own_bytes / 1e9:,.1f} GB (eyas's process)"
