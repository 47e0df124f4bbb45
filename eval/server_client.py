"""`eyas eval RUN --server URL`: the same prompts, concurrency levels and sampling parameters sent
to an external OpenAI-compatible server (vLLM or SGLang serving the exported draft, or `eyas serve`),
so the production engine's numbers sit next to the built-in loop's in one report.

Requests: POST /v1/completions with the prompt as token ids (rendered by eyas with the target's
chat template, as the loop gets them), `stream: true`, `return_token_ids: true` (vLLM >= 0.10.2,
SGLang >= 0.5.17) so the generated ids are compared token for token with the target's greedy
output, and SGLang's `return_spec_tokens_details: true` (ignored by vLLM).

Acceptance comes from the server's own counters, in the two definitions eyas's loop reports:
    vLLM (and eyas serve)  /metrics before and after the run: the deltas of
                           vllm:spec_decode_num_drafts / _num_accepted_tokens / _per_pos; tau =
                           1 + accepted / drafts and position i's rate = per_pos[i] / drafts (vLLM's
                           own formulas); tokens per forward = (completion tokens - requests) / drafts
    SGLang                 per request `sglext.spec_tokens_details.spec_verify_ct`: tokens per
                           forward = (completion tokens - 1) / verify count (the first token comes
                           from the prefill, not from a verification); tau (vLLM's) is not known
Latencies are measured by the client from the streamed chunks (TTFT: first chunk with tokens;
ITL: between chunks), as vLLM's benchmark_serving does.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from eyas.eval.buckets import bucket_order, length_bucket
from eyas.eval.load import LoadResult, request_latencies
from eyas.serve.decoding.sampling import SamplingParams

SPEC = "vllm:spec_decode_num_"


def base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def scrape(client: httpx.Client, url: str) -> dict:
    """vLLM spec-decode counters summed over engines:
    {"drafts", "draft_tokens", "accepted", "per_pos": {i: n}}."""
    r = client.get(f"{url}/metrics")
    if r.status_code != 200:
        return {}
    out: dict = {"per_pos": {}}
    for fam in text_string_to_metric_families(r.text):
        if not fam.name.startswith(SPEC):
            continue
        what = fam.name[len(SPEC) :]
        for s in fam.samples:
            if not s.name.endswith("_total"):
                continue
            if what == "accepted_tokens_per_pos":
                pos = int(s.labels["position"])
                out["per_pos"][pos] = out["per_pos"].get(pos, 0) + s.value
            else:
                key = {"drafts": "drafts", "draft_tokens": "draft_tokens", "accepted_tokens": "accepted"}.get(
                    what
                )
                if key:
                    out[key] = out.get(key, 0) + s.value
    return out if "drafts" in out else {}


async def _one(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], p: SamplingParams) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k,
        "seed": p.seed,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
        "return_spec_tokens_details": True,
    }
    t0 = time.perf_counter()
    times, tokens, verify_ct = [], [], None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {(await r.aread()).decode()[:500]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"{url}: {chunk['error']}")
            details = (chunk.get("sglext") or {}).get("spec_tokens_details")
            if details:
                verify_ct = details.get("spec_verify_ct")
            for c in chunk.get("choices") or []:
                ids = c.get("token_ids")
                if ids is None and c.get("text"):
                    raise RuntimeError(
                        f"{url}: the server returns no token ids (return_token_ids needs "
                        "vLLM >= 0.10.2 or SGLang >= 0.5.17)"
                    )
                if ids:
                    tokens += ids
                    times.append(time.perf_counter())
    return {"arrival": t0, "times": times, "tokens": tokens, "verify_ct": verify_ct}


async def _all(url: str, model: str, prompts, params, concurrency: int, bar) -> tuple[list[dict], float]:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:

        async def go(i):
            async with sem:
                res = await _one(client, url, model, prompts[i], params[i])
            if bar is not None:
                bar.update(1)
            return res

        t0 = time.perf_counter()
        out = await asyncio.gather(*[go(i) for i in range(len(prompts))])
    return out, t0


def run_server(
    url: str, prompts: list[list[int]], params: list[SamplingParams], concurrency: int, bar=None
) -> tuple[LoadResult, str, int, dict | None, dict | None]:
    """-> (load result, engine name, draft depth, acceptance dict or None when the server reports none,
    acceptance per prompt-length bucket or None when the prompts fall in one bucket).

    Prompts of several length buckets (eval/buckets.py) are sent one bucket at a time, shortest first, with
    the counters read between buckets: vLLM's counters are the server's, so a bucket's acceptance is their
    change over its own requests (the buckets' requests do not overlap in time)."""

    url = base_url(url)
    labels = [length_bucket(len(p)) for p in prompts]
    groups = {b: [i for i, x in enumerate(labels) if x == b] for b in bucket_order(labels)}
    runs: list[dict] = [{}] * len(prompts)
    with httpx.Client(timeout=30) as c:
        card = c.get(f"{url}/v1/models").json()["data"][0]
        marks, t0 = [scrape(c, url)], None
        for idx in groups.values():
            out, t = asyncio.run(
                _all(url, card["id"], [prompts[i] for i in idx], [params[i] for i in idx], concurrency, bar)
            )
            t0 = t if t0 is None else t0
            for i, r in zip(idx, out):
                runs[i] = r
            marks.append(scrape(c, url))
    engine = {"eyas": "eyas-serve", "vllm": "vllm", "sglang": "sglang"}.get(card.get("owned_by"), "server")
    wall = max(r["times"][-1] for r in runs if r["times"]) - t0
    res = LoadResult(outputs=[r["tokens"] for r in runs], wall_s=wall, ttft_s=[], itl_s=[], tpot_s=[])
    for r in runs:
        ttft, itl, tpot = request_latencies(r["times"], r["arrival"])
        if ttft is not None:
            res.ttft_s.append(ttft)
        res.itl_s += itl
        if tpot is not None:
            res.tpot_s.append(tpot)
    acc, depth = server_acceptance(marks[0], marks[-1], runs)
    if engine == "server" and acc is not None and acc["acceptance_length"] is None:
        engine = "sglang"
    per = None
    if len(groups) > 1 and acc is not None:
        per = {
            b: server_acceptance(marks[j], marks[j + 1], [runs[i] for i in idx])[0]
            for j, (b, idx) in enumerate(groups.items())
        }
    return res, engine, depth, acc, per


def server_acceptance(before: dict, after: dict, runs: list[dict]) -> tuple[dict | None, int]:
    """Acceptance of `runs` (their responses) from the counters' change `before` -> `after` (vLLM, eyas
    serve) or else from each response's verify count (SGLang) -> (acceptance dict or None, draft depth)."""
    if after:
        drafts = after["drafts"] - before.get("drafts", 0)
        depth = len(after["per_pos"])
        if drafts <= 0:
            return None, depth
        accepted = after["accepted"] - before.get("accepted", 0)
        pp = [(after["per_pos"][i] - before.get("per_pos", {}).get(i, 0)) / drafts for i in range(depth)]
        return {
            "acceptance_length": 1 + accepted / drafts,
            "tokens_per_forward": sum(len(r["tokens"]) - 1 for r in runs if r["tokens"]) / drafts,
            "per_position_acceptance": pp,
            "target_forwards": int(drafts),
            "cut_verifications": None,
            "cut_drafts": None,
            "num_prompts": len(runs),
        }, depth
    if not all(r["verify_ct"] for r in runs):
        return None, 0
    ct = sum(r["verify_ct"] for r in runs)
    return {
        "acceptance_length": None,
        "tokens_per_forward": sum(len(r["tokens"]) - 1 for r in runs) / ct,
        "per_position_acceptance": [],
        "target_forwards": ct,
        "cut_verifications": None,
        "cut_drafts": None,
        "num_prompts": len(runs),
    }, 0
