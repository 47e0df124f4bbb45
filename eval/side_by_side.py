"""eyas's serving loop and vLLM on the same target, draft and prompts, counted the same way.

Both sides are reduced to vLLM's spec-decode counters (vllm/v1/spec_decode/metrics.py):

    drafts        verifications (target forwards that checked drafted tokens)
    draft_tokens  tokens drafted
    accepted      drafted tokens the target accepted
    per_pos[i]    verifications that accepted more than i drafted tokens

    tau = 1 + accepted / drafts          (vLLM's "mean acceptance length", every engine's row)
    acceptance at position i = per_pos[i] / drafts

The reduction (`counters_from_loop`) and the rates live in eval/load.py, where the eval report takes
them too. eyas's loop counts accepted drafts before a stop (eos, max_tokens) cuts a verification
short, as vLLM's scheduler does, so the two sides count the same events. The loop also knows what
it emitted: `tokens_per_forward` (emitted / drafts) is tau less the verifications cut short.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from eyas.data.chat import eos_token_ids
from eyas.eval.load import counters_from_loop, run_engine
from eyas.serve.decoding.engine import Engine
from eyas.serve.decoding.sampling import SamplingParams
from eyas.serve.decoding.tree import TreeShape
from eyas.serve.external.vllm_jobs import run_offline
from eyas.serve.external.vllm_server import speculative_config
from eyas.serve.interchange.importer import load_published


def eyas_loop(
    target_model,
    tokenizer,
    draft_dir: str | Path | None,
    prompts: list[list[int]],
    sampling: dict,
    k: int,
    concurrency: int = 1,
) -> dict:
    """eyas's loop on `target_model` (its `tokenizer`: the eos ids) with the exported draft at `draft_dir`
    (None: plain decoding).
    `sampling`: vLLM SamplingParams fields (temperature, max_tokens, ignore_eos, seed).
    -> {"outputs", "counters" (None without a draft), "wall_s"}."""
    draft = shape = None
    if draft_dir is not None:
        draft = load_published(draft_dir, embed=target_model.get_input_embeddings().weight.detach())[0]
        draft = draft.to(next(target_model.parameters()).dtype)
        shape = TreeShape.chain(k)
    eos = () if sampling.get("ignore_eos") else eos_token_ids(target_model, tokenizer)
    engine = Engine(target_model, draft, shape, eos_ids=eos, max_batch=max(concurrency, 1))
    params = [SamplingParams(**sampling) for _ in prompts]
    t0 = time.perf_counter()
    with torch.no_grad():
        res = run_engine(engine, prompts, params, concurrency)
    wall = time.perf_counter() - t0
    counters = counters_from_loop(res.emitted, res.accepted, k) if draft is not None else None
    return {"outputs": res.outputs, "counters": counters, "wall_s": wall}


def vllm_runs(
    target_dir: str | Path,
    drafts: dict[str, str | Path | None],
    prompts: list[list[int]],
    sampling: dict,
    k: int,
    max_model_len: int | None = None,
    log_path: str | Path | None = None,
) -> dict[str, dict]:
    """vLLM (offline, one process) serving `target_dir` with each draft of `drafts` (name -> export
    dir, None: no speculation). -> {name: {"outputs", "counters"} or {"error": vLLM's message}}."""
    runs = [{"name": n, "speculative_config": speculative_config(d, k)} for n, d in drafts.items()]
    return run_offline(target_dir, runs, prompts, sampling, max_model_len=max_model_len, log_path=log_path)
