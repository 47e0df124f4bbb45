"""Runs under vLLM's own Python (stdlib + vllm only; never imports eyas): one target, several
speculative configurations, the same prompts, in one process.

    python vllm_offline.py JOB.json OUT.jsonl

JOB.json:
    {"target": DIR, "dtype": "float32", "max_model_len": null, "seed": 0,
     "prompts": [[token ids], ...],
     "sampling": {"temperature": 0.0, "max_tokens": 64, "ignore_eos": false, "seed": 0},
     "runs": [{"name": "plain", "speculative_config": {"model": EXPORT, "method": "eagle3",
               "num_speculative_tokens": 3}}, {"name": "target", "speculative_config": null}, ...]}

OUT.jsonl gets one line per run, written as soon as the run ends:
    {"name", "outputs": [[generated ids], ...], "counters": {"drafts", "draft_tokens", "accepted",
     "per_pos": [n_0, n_1, ...]}, "init_s", "generate_s"}
or, when vLLM refuses the configuration, {"name", "error": vLLM's own message}. With "per_request": true
in JOB.json the prompts go in one at a time (batch 1) and each line adds "per_request": the counters of
each prompt's own generation (the difference of the counters around it), in the order of the prompts.
"max_num_seqs": C keeps at most C requests in flight (vLLM's continuous batching: concurrency C).

The counters are vLLM's own spec-decode metrics (`LLM.get_metrics()`, the same counters
`/metrics` serves: vllm:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens /
_num_accepted_tokens_per_pos), read after each run. The engine core and the worker run inside
this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, executor "uni"), so vLLM is imported once for
every run: a run costs its engine's start (seconds), not three fresh interpreters.
"""

import gc
import json
import os
import sys
import time
import traceback

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

SPEC = "vllm:spec_decode_num_"
COUNTERS = {"drafts": "drafts", "draft_tokens": "draft_tokens", "accepted_tokens": "accepted"}


def counters(llm) -> dict:
    """vLLM's spec-decode counters, summed over engines: {"drafts", "draft_tokens", "accepted", "per_pos"}."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    for m in llm.get_metrics():
        if not m.name.startswith(SPEC):
            continue
        what = m.name[len(SPEC) :]
        if what == "accepted_tokens_per_pos":
            values = list(m.values)
            out["per_pos"] = [a + b for a, b in zip(values, out["per_pos"] + [0] * len(values))]
        elif what in COUNTERS:
            out[COUNTERS[what]] += int(m.value)
    return out


def difference(after: dict, before: dict) -> dict:
    """The counters one generation added: `after` - `before` (counters())."""
    out = {key: after[key] - before[key] for key in ("drafts", "draft_tokens", "accepted")}
    pos = before["per_pos"] + [0] * (len(after["per_pos"]) - len(before["per_pos"]))
    out["per_pos"] = [a - b for a, b in zip(after["per_pos"], pos)]
    return out


def error_line(exc: BaseException) -> str:
    """vLLM's own message: the innermost exception of the chain (config validation wraps it)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    return f"{type(exc).__name__}: {exc}".strip()


def one_run(job: dict, run: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.time()
    try:
        llm = LLM(
            model=job["target"],
            dtype=job.get("dtype", "float32"),
            max_model_len=job.get("max_model_len"),  # None: the target config's
            seed=job.get("seed", 0),
            enforce_eager=job.get("enforce_eager", True),  # eyas: eager on a CPU, CUDA graphs on a GPU
            distributed_executor_backend="uni",
            disable_log_stats=False,
            speculative_config=run.get("speculative_config"),
            # one prompt at a time means alone: no prefix of an earlier prompt's cache reused
            enable_prefix_caching=not job.get("per_request"),
            **({"max_num_seqs": job["max_num_seqs"]} if job.get("max_num_seqs") else {}),
        )
    except Exception as e:  # noqa: BLE001 - vLLM refuses a config with many exception types
        traceback.print_exc()
        return {"name": run["name"], "error": error_line(e)}
    t1 = time.time()
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    params = SamplingParams(**job["sampling"])
    per_request = None
    if job.get("per_request"):
        outs, per_request = [], []
        for prompt in prompts:
            before = counters(llm)
            outs += llm.generate([prompt], params, use_tqdm=False)
            per_request.append(difference(counters(llm), before))
    else:
        outs = llm.generate(prompts, params, use_tqdm=False)
    t2 = time.time()
    result = {
        "name": run["name"],
        "outputs": [list(o.outputs[0].token_ids) for o in outs],
        "counters": counters(llm),
        "init_s": round(t1 - t0, 2),
        "generate_s": round(t2 - t1, 3),
    }
    if per_request is not None:
        result["per_request"] = per_request
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return result


def main(argv: list[str]) -> int:
    job_path, out_path = argv
    with open(job_path) as f:
        job = json.load(f)
    with open(out_path, "w") as out:
        for run in job["runs"]:
            out.write(json.dumps(one_run(job, run)) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":  # vLLM spawns processes that re-import the main module
    sys.exit(main(sys.argv[1:]))
