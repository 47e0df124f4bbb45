"""The target's hidden states from vLLM's own forward, for `capture.backend: vllm` (runs under vLLM's
Python: stdlib, torch, safetensors and vllm only; never imports eyas).

    python vllm_capture_worker.py JOB.json

JOB.json: {"target", "dtype", "layer_ids": [vLLM ids], "storage": DIR, "address": socket path,
           "authkey": hex, "max_model_len": int or null}

vLLM runs the target with `speculative_config.method: "extract_hidden_states"` (the hidden states
of `layer_ids` are kept per token, vLLM numbering: id k = the input of decoder layer k, id N = the
last layer's output before the final norm) and the CPU-capable hidden-states connector
(vllm_hidden_states.py), which writes one safetensors file per request under DIR:
{"hidden_states": (T, len(layer_ids), H), "token_ids": (T,)}. Each whole sequence goes in as
the prompt with max_tokens 1: its prefill is the forward whose states are kept. Prefix caching
is off, so every token's states come from this forward.

Protocol (multiprocessing.connection, a Unix socket eyas listens on):
    eyas -> worker   {"sequences": [[token ids], ...]}        worker -> eyas {"files": [path, ...]}
    eyas -> worker   {"close": true}                          the worker exits
A failure answers {"error": "Type: message"} and the worker exits.
"""

import json
import os
import sys
import time
from multiprocessing.connection import Client

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # vllm_hidden_states.py, for vLLM's loader


def make_llm(job: dict):
    from vllm import LLM

    return LLM(
        model=job["target"],
        dtype=job.get("dtype", "float32"),
        max_model_len=job.get("max_model_len"),
        enforce_eager=True,
        distributed_executor_backend="uni",
        enable_prefix_caching=False,
        seed=0,
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": job["layer_ids"]}},
        },
        kv_transfer_config={
            "kv_connector": "CpuHiddenStatesConnector",
            "kv_connector_module_path": "vllm_hidden_states",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": job["storage"]},
        },
    )


def capture(llm, sequences: list[list[int]]) -> list[str]:
    """Prefill each sequence; -> the file of each, in order, once written."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=s) for s in sequences]
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    files = [o.kv_transfer_params["hidden_states_path"] for o in outs]
    deadline = time.monotonic() + 600
    while not all(os.path.exists(f) for f in files):  # the connector writes them at the next engine steps
        if time.monotonic() > deadline:
            raise TimeoutError(f"hidden-state files not written within 600 s: {files}")
        llm.llm_engine.step()
    return files


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    conn = Client(job["address"], authkey=bytes.fromhex(job["authkey"]))
    try:
        llm = make_llm(job)
        conn.send({"ready": True})
        while True:
            msg = conn.recv()
            if msg.get("close"):
                return 0
            conn.send({"files": capture(llm, msg["sequences"])})
    except Exception as e:  # noqa: BLE001 - vLLM's own message goes back to eyas, whatever its type
        while e.__cause__ is not None:
            e = e.__cause__
        conn.send({"error": f"{type(e).__name__}: {e}"})
        raise
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
