"""The target's hidden states from vLLM's own forward, for `capture.backend: vllm`: offline capture (eyas
the one client) and online training (every trainer process a client) (runs under vLLM's Python: stdlib,
torch, safetensors and vllm only; never imports eyas).

    python vllm_capture_worker.py JOB.json

JOB.json: {"target", "dtype", "layer_ids": [vLLM ids], "storage": DIR, "address": socket path,
           "authkey": hex, "engine_args": [`vllm serve` arguments: tensor parallel size, ...],
           "parent_pid": the process that started this one (the worker exits when it is gone)}

vLLM runs the target with `speculative_config.method: "extract_hidden_states"` (the hidden states
of `layer_ids` are kept per token, vLLM numbering: id k = the input of decoder layer k, id N = the
last layer's output before the final norm) and the CPU-capable hidden-states connector
(vllm_hidden_states.py), which writes one safetensors file per request under DIR:
{"hidden_states": (T, len(layer_ids), H), "token_ids": (T,)}, with the lock file hs_connectors'
readers wait on. Each whole sequence goes in as the prompt with max_tokens 1: its prefill is the
forward whose states are kept. Prefix caching is off, so every token's states come from this forward.

Protocol (multiprocessing.connection; the worker listens on `address` before it loads the target, so
the process that started it connects at once and learns whether it loaded):
    worker -> client   {"ready": true} once the target is loaded, or {"error": "Type: message"}
    client -> worker   {"id", "sequences": [[token ids], ...]}
    worker -> client   {"id", "params": [vLLM's kv_transfer_params per sequence: "hidden_states_path"]}
    client -> worker   {"close": true}                                      the worker exits
Requests from every client that are waiting are prefilled together (one vLLM batch), each client's
answered in the order it asked. A failure answers {"error": ...} to the clients it concerns and the
worker exits; so does the worker whose parent process is gone.
"""

import json
import os
import sys
import threading
import time
from multiprocessing.connection import Listener, wait

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # vllm_hidden_states.py, for vLLM's loader


def engine_kwargs(args: list[str]) -> dict:
    """`vllm serve` arguments -> the LLM keyword arguments they change from vLLM's defaults (vLLM's own
    parser reads them, so the server and this worker take the same arguments)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    defaults, given = vars(parser.parse_args([])), vars(parser.parse_args(args))
    return {k: v for k, v in given.items() if v != defaults.get(k) and k != "model"}


def make_llm(job: dict):
    from vllm import LLM

    settings = {
        "dtype": job.get("dtype", "float32"),
        "enable_prefix_caching": False,  # (--enforce-eager comes in the engine arguments where it applies)
        "seed": 0,
        **engine_kwargs(job.get("engine_args", [])),
    }
    if settings.get("tensor_parallel_size", 1) == 1:
        settings["distributed_executor_backend"] = "uni"  # the worker in this process
    return LLM(
        model=job["target"],
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
        **settings,
    )


def capture(llm, sequences: list[list[int]]) -> list[dict]:
    """Prefill each sequence; -> the kv_transfer_params of each, in order, once its file is written."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=s) for s in sequences]
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    params = [dict(o.kv_transfer_params) for o in outs]
    deadline = time.monotonic() + 600
    while not all(os.path.exists(p["hidden_states_path"]) for p in params):  # written at later engine steps
        if time.monotonic() > deadline:
            raise TimeoutError(f"hidden-state files not written within 600 s: {params}")
        llm.llm_engine.step()
    return params


def error_line(e: BaseException) -> str:
    while e.__cause__ is not None:
        e = e.__cause__
    return f"{type(e).__name__}: {e}"


class Clients:
    """The connections of every client, accepted on a thread; each learns whether the target loaded."""

    def __init__(self, job: dict):
        self.listener = Listener(job["address"], authkey=bytes.fromhex(job["authkey"]))
        self.conns, self.lock, self.state = [], threading.Lock(), None  # state: None, True, or the error
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            c = self.listener.accept()
            with self.lock:
                self.conns.append(c)
                if self.state is not None:
                    self._tell(c)

    def _tell(self, c) -> None:
        try:
            c.send({"ready": True} if self.state is True else {"error": self.state})
        except OSError:
            pass

    def loaded(self, state) -> None:
        with self.lock:
            self.state = state
            for c in self.conns:
                self._tell(c)

    def waiting(self, timeout: float) -> list[tuple]:
        """Every (connection, request) waiting; a closed connection is dropped. {"close"} -> None."""
        with self.lock:
            live = list(self.conns)
        out = []
        for c in wait(live, timeout) if live else time.sleep(timeout) or []:
            try:
                while c.poll():
                    msg = c.recv()
                    if msg.get("close"):
                        return None
                    out.append((c, msg))
            except (EOFError, OSError):
                with self.lock:
                    self.conns.remove(c)
        return out


def serve(llm, clients: Clients, parent_pid: int | None) -> int:
    while parent_pid is None or os.getppid() == parent_pid:
        asked = clients.waiting(1.0)
        if asked is None:
            return 0
        if not asked:
            continue
        try:
            params = capture(llm, [s for _, m in asked for s in m["sequences"]])
        except Exception as e:  # noqa: BLE001 - vLLM's own message goes to the clients, whatever its type
            for c, m in asked:
                c.send({"id": m.get("id"), "error": error_line(e)})
            raise
        for c, m in asked:
            n = len(m["sequences"])
            mine, params = params[:n], params[n:]
            try:
                c.send({"id": m.get("id"), "params": mine})
            except OSError:  # that client is gone; its files are left for the storage's owner to delete
                pass
    return 0  # the process that started this worker is gone


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    clients = Clients(job)
    try:
        llm = make_llm(job)
    except Exception as e:  # noqa: BLE001 - vLLM refuses a target with many exception types
        clients.loaded(error_line(e))
        time.sleep(1.0)  # for the clients to read it
        raise
    clients.loaded(True)
    return serve(llm, clients, job.get("parent_pid"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
