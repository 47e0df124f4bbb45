"""The README's main job: `eyas run recipes/demo.yaml` on the built-in demo target reaches
τ >= 3.2 at k = 4 on >= 32 held-out prompts, losslessly. Minutes, not seconds: marked slow.

The floor, against weakened drafts in the same loop on the same 32 prompts (2-core AMD EPYC, AVX512-BF16):
the trained draft 3.570; the same draft fed its aux states in reverse order (a capture or serving that
swaps the layers) 2.829; trained 1 epoch instead of 5, 2.009; untrained (1 step at lr 1e-12) 1.004. Other
CPUs build other demo targets: their trained drafts measured 3.475 and 3.493 (AVX2 only: two builds; the
latter's 1-epoch draft 1.885) to 3.588 (AMX)."""

import json
import os

import pytest

pytestmark = pytest.mark.slow


def test_demo_recipe_end_to_end(demo_run):
    from eyas.cli import main

    run = demo_run
    report = json.loads((run / "report.json").read_text())
    assert report["k"] == 4 and report["num_prompts"] >= 32
    assert report["lossless"] is True
    assert report["acceptance_length"] >= 3.2, report
    assert report["target_entropy"] > 0.1  # the demo target is not trivially predictable
    capture = json.loads((run / "capture" / "index.json").read_text())
    assert capture["aux_layer_ids"] == [1, 2, 3]
    # resume: a second run skips every stage and leaves the report as it was
    before = (run / "report.json").read_text()
    assert main(["run", "demo", "--out", str(run), "--no-progress"]) == 0
    assert (run / "report.json").read_text() == before
    print(
        f"demo: tau={report['acceptance_length']:.3f} stage times {report['stage_times']} "
        f"(EYAS_CACHE={os.environ.get('EYAS_CACHE')})"
    )
