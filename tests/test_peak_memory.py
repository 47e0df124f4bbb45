"""A stage's peak memory is its own: eyas/infra/peak_memory.py resets the process's peak resident set per
stage."""

import sys

import pytest

from eyas.infra.peak_memory import describe, reset_own_peak, stage_peak


@pytest.mark.skipif(not reset_own_peak(), reason="VmHWM and a writable clear_refs are Linux's")
def test_a_stage_after_a_bigger_one_reports_its_own_peak():
    import mmap

    with stage_peak() as big:
        # an anonymous mapping of its own: a bytearray can come from heap pages a test before this one freed
        # but malloc kept resident (the suite's worker at 2.2 GB), and then adds nothing to the resident set
        block = mmap.mmap(-1, 400 * 2**20)
        block[::4096] = b"x" * len(block[::4096])  # touch every page: resident, not just reserved
        block.close()
    with stage_peak() as small:
        pass
    assert big.own_bytes - small.own_bytes > 380 * 2**20  # the 400 MiB block, not carried into the next stage
    own, anon = small.own_bytes / 1e9, small.anon_bytes / 1e9
    assert describe(small) == f", peak memory {own:,.1f} GB (eyas's process; {anon:,.1f} GB anonymous)"


@pytest.mark.skipif(not reset_own_peak(), reason="VmHWM and a writable clear_refs are Linux's")
def test_anonymous_memory_and_a_child_process_are_counted_apart():
    """A child's memory (a vLLM server eyas started) counts as the children's, not eyas's; a block this
    process allocates counts as its anonymous memory."""
    import subprocess
    import time

    child_code = (
        "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); input()"
    )
    with stage_peak() as peak:
        child = subprocess.Popen(
            [sys.executable, "-c", child_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert child.stdout.readline() == b"ready\n"
        time.sleep(0.5)  # several samples
        child.communicate(b"\n", timeout=30)
        block = bytearray(200 * 2**20)
        block[::4096] = b"x" * len(block[::4096])
        time.sleep(0.5)
        del block
    assert 290 * 2**20 < peak.children_bytes < 400 * 2**20  # the child's 300 MiB + its interpreter, not ours
    assert peak.anon_bytes > 190 * 2**20  # this process's 200 MiB block, held for several samples
    assert peak.anon_bytes <= peak.own_bytes
    assert ", child processes " in describe(peak)


@pytest.mark.skipif(not reset_own_peak(), reason="VmHWM and a writable clear_refs are Linux's")
def test_heap_an_earlier_stage_freed_is_not_the_next_stages():
    """glibc keeps freed heap chunks resident (here: 300 MB of 100 KB chunks, under its mmap threshold,
    below one that stays); stage_peak hands them back first (malloc_trim), so the next stage's peak is its
    own. A fresh interpreter: the suite's own heap would blur the numbers."""
    import ctypes
    import subprocess

    if not hasattr(ctypes.CDLL(None), "malloc_trim"):
        pytest.skip("no glibc malloc_trim")
    code = """
from eyas.infra.peak_memory import STATUS, stage_peak, status_field
base = status_field(STATUS, "RssAnon")
xs = [bytearray(100_000) for _ in range(3000)]
keep = xs[-1]
del xs
held = status_field(STATUS, "RssAnon") - base
with stage_peak() as peak:
    pass
print(held, peak.anon_bytes - base)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    held, stage = map(int, out.split())
    assert held > 280e6  # freed, but still resident: what the next stage would have counted
    assert stage < 20e6
