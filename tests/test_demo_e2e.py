"""The README's main job: `eyas run recipes/demo.yaml` on the built-in demo target reaches
τ >= 2.5 at k = 4 on >= 32 held-out prompts, losslessly. Minutes, not seconds: marked slow."""

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
    assert report["acceptance_length"] >= 2.5, report
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
