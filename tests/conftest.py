import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))  # tests/ helpers (tiny_targets) importable


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def vllm_python():
    """The Python that runs vLLM (`eyas install-vllm`; EYAS_VLLM_PYTHON). Absent: the test is skipped
    with the reason, except where EYAS_REQUIRE_VLLM=1 (CI, which installs it): there it fails."""
    from eyas.serve.external.vllm_env import find_vllm_python, install_hint

    python = find_vllm_python()
    if python is None:
        why = f"vLLM is not installed: {install_hint()}"
        if os.environ.get("EYAS_REQUIRE_VLLM") == "1":
            pytest.fail(f"EYAS_REQUIRE_VLLM=1 but {why}")
        pytest.skip(why)
    return python


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """`eyas run demo` once per session (the README's main job): test_demo_e2e checks it, the vLLM
    tests serve its draft. EYAS_TEST_DEMO_RUN=DIR runs (or resumes) it in DIR instead, so that a
    developer's second session of tests reuses the finished stages."""
    from eyas.cli import main

    given = os.environ.get("EYAS_TEST_DEMO_RUN")
    run = Path(given) if given else tmp_path_factory.mktemp("demo-run") / "demo"
    assert main(["run", "demo", "--out", str(run), "--no-progress"]) == 0
    return run
