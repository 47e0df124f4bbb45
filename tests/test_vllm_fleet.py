"""Where vLLM's replicas go (eyas/infra/vllm/vllm_fleet.py): GPU groups of `vllm.tensor_parallel_size`
confined by CUDA_VISIBLE_DEVICES, CPU cores by VLLM_CPU_OMP_THREADS_BIND, and the `vllm serve` arguments
every replica gets. The GPU layouts are this machine's view of GPUs it does not have (visible_gpus
stands in for torch's count); the replicas on real vLLM processes are in test_vllm_server.py and
test_vllm_capture.py."""

import os

import pytest

from eyas.infra.errors import InputError
from eyas.infra.vllm import vllm_fleet
from eyas.infra.vllm.vllm_fleet import engine_args, replicas
from eyas.recipes.load import load_recipe


def placed(monkeypatch, gpus: list[str], **vllm) -> list[tuple[str, dict]]:
    monkeypatch.setattr(vllm_fleet, "visible_gpus", lambda: gpus)
    recipe = load_recipe({"vllm": vllm})
    return [(r.describe(), r.env()) for r in replicas(recipe.vllm)]


def test_a_node_of_8_gpus(monkeypatch):
    eight = [str(i) for i in range(8)]
    assert placed(monkeypatch, eight) == [
        (f"replica {i} on GPU {i}", {"CUDA_VISIBLE_DEVICES": str(i)}) for i in range(8)
    ]
    assert placed(monkeypatch, eight, tensor_parallel_size=2)[1:3] == [
        ("replica 1 on GPUs 2,3", {"CUDA_VISIBLE_DEVICES": "2,3"}),
        ("replica 2 on GPUs 4,5", {"CUDA_VISIBLE_DEVICES": "4,5"}),
    ]
    assert len(placed(monkeypatch, eight, tensor_parallel_size=2)) == 4
    # the producers of online training on GPUs 6 and 7, the trainers on the rest
    assert placed(monkeypatch, eight, devices=[6, 7]) == [
        ("replica 0 on GPU 6", {"CUDA_VISIBLE_DEVICES": "6"}),
        ("replica 1 on GPU 7", {"CUDA_VISIBLE_DEVICES": "7"}),
    ]
    # a launcher's CUDA_VISIBLE_DEVICES (physical ids) passes through
    assert placed(monkeypatch, ["3", "5"], replicas=1, tensor_parallel_size=2) == [
        ("replica 0 on GPUs 3,5", {"CUDA_VISIBLE_DEVICES": "3,5"})
    ]
    with pytest.raises(InputError, match=r"3 replica\(s\) x 2 devices do not fit the 4 GPUs vLLM may use"):
        placed(monkeypatch, eight[:4], replicas=3, tensor_parallel_size=2)


def test_cpu_cores(monkeypatch):
    cores = [str(c) for c in sorted(os.sched_getaffinity(0))]
    assert placed(monkeypatch, []) == [("replica 0 on this machine's CPU cores", {})]  # vLLM's own binding
    two = placed(monkeypatch, [], replicas=2)
    half = len(cores) // 2
    assert [env for _, env in two] == [
        {"VLLM_CPU_OMP_THREADS_BIND": ",".join(cores[:half])},
        {"VLLM_CPU_OMP_THREADS_BIND": ",".join(cores[half : 2 * half])},
    ]
    assert placed(monkeypatch, [], devices=[0, 1], tensor_parallel_size=2) == [
        ("replica 0 on CPU cores 0,1", {"VLLM_CPU_OMP_THREADS_BIND": "0|1"})  # one list per TP rank
    ]


def test_engine_arguments():
    v = load_recipe(
        {"vllm": {"tensor_parallel_size": 2, "max_num_seqs": 64, "extra_args": ["--kv-cache-dtype", "fp8"]}}
    ).vllm
    # a GPU: vLLM's CUDA graphs (no --enforce-eager); a CPU: eager
    assert engine_args(v, "cuda", 4096) == [
        "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9", "--max-model-len", "4096",
        "--max-num-seqs", "64", "--kv-cache-dtype", "fp8",
    ]  # fmt: skip
    assert engine_args(load_recipe({"vllm": {"max_model_len": 8192}}).vllm, "cpu", 4096) == [
        "--tensor-parallel-size", "1", "--enforce-eager", "--max-model-len", "8192",
    ]  # fmt: skip
    # vllm.enforce_eager decides where set
    assert "--enforce-eager" in engine_args(load_recipe({"vllm": {"enforce_eager": True}}).vllm, "cuda", 64)
    assert "--enforce-eager" not in engine_args(
        load_recipe({"vllm": {"enforce_eager": False}}).vllm, "cpu", 64
    )


def test_a_server_is_eager_on_a_cpu_and_takes_the_fleets_arguments_as_given():
    """VllmServer's command: --enforce-eager by default only where torch sees no GPU; a fleet's server takes
    engine_args' choice (eager=False: the arguments carry the flag where it applies), never twice."""
    import torch

    from eyas.infra.vllm.vllm_server import VllmServer

    cmd = VllmServer("t").command("python")
    assert ("--enforce-eager" in cmd) == (not torch.cuda.is_available())
    assert "--enforce-eager" not in VllmServer("t", eager=False).command("python")
    assert (
        VllmServer("t", eager=True, extra_args=("--enforce-eager",))
        .command("python")
        .count("--enforce-eager")
        == 1
    )
    graphs = engine_args(load_recipe({}).vllm, "cuda", 64)
    assert "--enforce-eager" not in VllmServer("t", eager=False, extra_args=tuple(graphs)).command("python")


def test_mxfp4_on_a_cpu_vllm_cannot_run_it_is_refused_up_front(monkeypatch):
    """vLLM's CPU build runs MXFP4 experts only with AMX: without it (this machine's answer replaced, as a CPU
    without AMX answers) the vLLM backends are refused before vLLM starts, naming the key and the fix."""
    from eyas.infra.vllm import vllm_env

    monkeypatch.setattr(vllm_env, "mxfp4_runs_here", lambda: False)
    with pytest.raises(InputError) as e:
        vllm_env.refuse_mxfp4_without_kernels("capture.backend", "openai/gpt-oss-120b", mxfp4=True)
    assert str(e.value) == (
        "capture.backend: vllm: openai/gpt-oss-120b stores its MoE experts in MXFP4, and vLLM's CPU build "
        "runs MXFP4 only on a CPU with AMX (Intel Xeon 4th generation and later), which this one lacks; set "
        "capture.backend: hf (transformers dequantizes them) or run on a GPU"
    )
    vllm_env.refuse_mxfp4_without_kernels("capture.backend", "eyas-demo", mxfp4=False)  # bf16: no refusal
