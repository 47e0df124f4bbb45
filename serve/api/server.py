"""`eyas serve`: an OpenAI-compatible HTTP server over the built-in speculative loop (FastAPI).

    eyas serve RUN_OR_RECIPE [--draft DIR] [--k K | --tree S,K,N] [--host 127.0.0.1] [--port 8000]

A run directory serves its target with its own trained draft (RUN/train/checkpoint-final) at the
recipe's eval.k; a recipe serves its target with `--draft` (or without speculation). The target is
loaded as every stage loads it, on the recipe's device(s).

Endpoints, with vLLM's request fields, response shapes and names (vLLM 0.10.2+):
    POST /v1/completions        prompt as text, token ids, or a list of either; `return_token_ids`
                                adds `token_ids` (generated) and `prompt_token_ids` to each choice
    POST /v1/chat/completions   messages rendered with the target's chat template
                                (chat_template_kwargs / reasoning_effort reach it); harmony targets
                                return the analysis channel as `reasoning_content`
    both: `stream` (server-sent events, `data: [DONE]`), `stream_options.include_usage`,
          temperature / top_p / top_k / seed / max_tokens / stop / stop_token_ids / ignore_eos,
          and `speculative: false` (eyas) to decode a request without the draft
    GET  /v1/models, /health, /metrics (vLLM's Prometheus names: serve/api/metrics.py)
A malformed request gets a 400 with vLLM's error body; the server keeps serving.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from eyas.serve.api.metrics import ServerMetrics
from eyas.serve.api.protocol import ChatCompletionRequest, CompletionRequest, error_body
from eyas.serve.api.runner import EngineRunner
from eyas.serve.api.text import ChatText, TextStream
from eyas.serve.decoding.engine import Engine, Request
from eyas.serve.decoding.sampling import SamplingParams
from eyas.serve.decoding.tree import TreeShape


@dataclass
class Served:
    name: str
    root: str
    tokenizer: object
    runner: EngineRunner
    metrics: ServerMetrics
    max_model_len: int
    shape: TreeShape | None  # None: no draft
    spec_default: bool


class BadRequest(ValueError):
    pass


def _rid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _params(body, prompt_len: int, max_tokens: int | None, served: Served) -> SamplingParams:
    room = served.max_model_len - prompt_len
    if max_tokens is None:
        max_tokens = room
    if max_tokens > room:
        raise BadRequest(f"This model's maximum context length is {served.max_model_len} tokens. However, you "
                         f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} "
                         "in the completion). Please reduce the length of the messages or completion.")
    try:
        return SamplingParams(temperature=1.0 if body.temperature is None else body.temperature,
                              top_p=1.0 if body.top_p is None else body.top_p,
                              top_k=0 if body.top_k is None else body.top_k, seed=body.seed,
                              max_tokens=max_tokens, ignore_eos=body.ignore_eos,
                              stop_token_ids=list(body.stop_token_ids or []))
    except ValueError as e:
        raise BadRequest(str(e)) from None


class Call:
    """One request's tokens arriving from the engine thread, as an asyncio queue."""

    def __init__(self, served: Served, prompt: list[int], params: SamplingParams, index: int, speculative: bool):
        self.served, self.index = served, index
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.req = Request(prompt, params, id=_rid("req"), on_tokens=self._on_tokens)
        self.engine = "spec" if speculative else "plain"
        self.seen_verifications = 0
        self.stop_reason = None

    def _on_tokens(self, req: Request, tokens: list[int]) -> None:  # the engine thread
        m, now = self.served.metrics, time.perf_counter()
        if tokens:
            if len(req.tokens) == len(tokens):
                m.ttft.observe(now - req.arrival)
            else:
                m.itl.observe(now - req.token_times[-len(tokens) - 1])
        for a in req.accepted[self.seen_verifications:]:
            m.verification(self.served.shape.num_draft_tokens - 1, a)
        self.seen_verifications = len(req.accepted)
        if req.finished:
            m.finished(req.finish_reason, len(req.prompt), len(req.tokens), now - req.arrival)
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (list(tokens), req.finish_reason))

    def start(self) -> None:
        self.served.runner.submit(self.engine, self.req)

    async def events(self):
        """-> (new token ids, finish reason or None) until finished."""
        while True:
            tokens, reason = await self.queue.get()
            yield tokens, reason
            if reason is not None:
                return

    def abort(self) -> None:
        if not self.req.finished:
            self.served.runner.abort(self.req)


def _stop_reason(call: Call):
    if call.stop_reason is not None:
        return call.stop_reason
    r = call.req
    if r.finish_reason == "stop" and r.tokens and r.tokens[-1] in r.params.stop_token_ids:
        return r.tokens[-1]
    return None


def _cut_at_stop(text: str, stops: list[str]) -> tuple[str, str | None]:
    hits = [(text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return text, None
    pos, s = min(hits)
    return text[:pos], s


def _usage(calls: list[Call]) -> dict:
    p = sum(len(c.req.prompt) for c in calls)
    g = sum(len(c.req.tokens) for c in calls)
    return {"prompt_tokens": p, "completion_tokens": g, "total_tokens": p + g, "prompt_tokens_details": None}


def _spec_details(calls: list[Call], served: Served) -> dict:
    """SGLang's `sglext.spec_tokens_details` (return_spec_tokens_details), one per choice."""
    out = []
    for c in calls:
        ct = len(c.req.emitted)
        drafts = sum(c.req.accepted)
        proposed = ct * (served.shape.num_draft_tokens - 1) if served.shape else 0
        out.append({"spec_verify_ct": ct, "spec_accept_length": len(c.req.tokens) / ct if ct else None,
                    "spec_num_correct_drafts": drafts, "spec_num_proposed_drafts": proposed,
                    "spec_accept_rate": drafts / proposed if proposed else None})
    return {"spec_tokens_details": out[0] if len(out) == 1 else out}


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def build_app(served: Served) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app):
        yield
        served.runner.stop()

    app = FastAPI(title="eyas serve", docs_url=None, redoc_url=None, lifespan=lifespan)
    tok = served.tokenizer

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, exc: RequestValidationError):
        errors = exc.errors()
        msg = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}"
                        for e in errors) or str(exc)
        return JSONResponse(error_body(msg, "Bad Request", 400), status_code=400)

    @app.exception_handler(BadRequest)
    async def _bad(_, exc: BadRequest):
        return JSONResponse(error_body(str(exc)), status_code=400)

    def check_model(model: str | None):
        if model is not None and model != served.name:
            return JSONResponse(error_body(f"The model `{model}` does not exist.", "NotFoundError", 404),
                                status_code=404)
        return None

    def spec_for(body) -> bool:
        return served.shape is not None and (served.spec_default if body.speculative is None else body.speculative)

    def open_calls(prompts: list[list[int]], body, max_tokens) -> list[Call]:
        engine = served.runner.engines["spec" if spec_for(body) else "plain"]
        calls = []
        for i, p in enumerate(prompts):
            try:
                engine.validate(p)
            except ValueError as e:
                raise BadRequest(str(e)) from None
            calls.append(Call(served, p, _params(body, len(p), max_tokens, served), i, spec_for(body)))
        for c in calls:
            c.start()
        return calls

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": served.name, "object": "model", "created": int(time.time()), "owned_by": "eyas",
            "root": served.root, "parent": None, "max_model_len": served.max_model_len,
            "permission": [{"id": _rid("modelperm"), "object": "model_permission", "created": int(time.time()),
                            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": False,
                            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}]}]}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(served.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        if (err := check_model(body.model)) is not None:
            return err
        prompts = [tok.encode(p) if isinstance(p, str) else list(p) for p in body.prompts()]
        calls = open_calls(prompts, body, body.max_tokens)
        rid, created, stops = _rid("cmpl"), int(time.time()), body.stop_strings()
        base = {"id": rid, "object": "text_completion", "created": created, "model": served.name}
        if body.stream:
            return StreamingResponse(_stream_completion(calls, base, body, stops), media_type="text/event-stream")
        texts = await asyncio.gather(*[_collect(c, TextStream(tok, body.skip_special_tokens), stops) for c in calls])
        if any(c.req.error for c in calls):
            return _engine_error(calls)
        out = {**base, "choices": [{
            "index": c.index, "text": text, "logprobs": None, "finish_reason": c.req.finish_reason,
            "stop_reason": _stop_reason(c), "prompt_logprobs": None,
            "token_ids": list(c.req.tokens) if body.return_token_ids else None,
            "prompt_token_ids": list(c.req.prompt) if body.return_token_ids else None,
        } for c, text in zip(calls, texts)], "usage": _usage(calls), "system_fingerprint": None,
            "service_tier": None, "kv_transfer_params": None}
        if body.return_spec_tokens_details:
            out["sglext"] = _spec_details(calls, served)
        return out

    async def _collect(call: Call, stream, stops) -> str:
        text = ""
        try:
            async for tokens, _ in call.events():
                text += stream.push(tokens)
                text, hit = _cut_at_stop(text, stops)
                if hit is not None and call.stop_reason is None:
                    call.stop_reason = hit
                    call.abort()
            if call.stop_reason is None:
                text, hit = _cut_at_stop(text + stream.flush(), stops)
                call.stop_reason = hit
        finally:
            call.abort()
        if call.stop_reason is not None:
            call.req.finish_reason = "stop"
        return text

    async def _stream_completion(calls: list[Call], base: dict, body, stops):
        streams = {c.index: TextStream(tok, body.skip_special_tokens) for c in calls}
        texts = {c.index: "" for c in calls}
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(c: Call):
            async for item in c.events():
                await merged.put((c, *item))

        tasks = [asyncio.create_task(pump(c)) for c in calls]
        first = {c.index: True for c in calls}
        try:
            done = 0
            while done < len(calls):
                c, tokens, reason = await merged.get()
                if c.stop_reason is not None:
                    continue
                delta = streams[c.index].push(tokens) + (streams[c.index].flush() if reason else "")
                full, hit = _cut_at_stop(texts[c.index] + delta, stops)
                delta = full[len(texts[c.index]):]
                texts[c.index] = full
                if hit is not None:
                    c.stop_reason = hit
                    c.abort()
                    c.req.finish_reason, reason = "stop", "stop"
                if c.req.error:
                    yield _sse(error_body(c.req.error, "InternalServerError", 500))
                choice = {"index": c.index, "text": delta, "logprobs": None,
                          "finish_reason": c.req.finish_reason if reason else None,
                          "stop_reason": _stop_reason(c) if reason else None,
                          "token_ids": tokens if body.return_token_ids else None,
                          "prompt_token_ids": list(c.req.prompt) if body.return_token_ids and first[c.index] else None}
                first[c.index] = False
                yield _sse({**base, "choices": [choice], "usage": None})
                if reason is not None:
                    done += 1
            opts = body.stream_options
            if opts is not None and opts.include_usage:
                yield _sse({**base, "choices": [], "usage": _usage(calls)})
            if body.return_spec_tokens_details:
                yield _sse({**base, "choices": [], "usage": None, "sglext": _spec_details(calls, served)})
            yield "data: [DONE]\n\n"
        finally:
            for t in tasks:
                t.cancel()
            for c in calls:
                c.abort()

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest):
        if (err := check_model(body.model)) is not None:
            return err
        kwargs = dict(body.chat_template_kwargs or {})
        if body.reasoning_effort is not None:
            kwargs.setdefault("reasoning_effort", body.reasoning_effort)
        from eyas.data.regenerate import render_prompt

        try:
            prompt = render_prompt(tok, body.messages, body.add_generation_prompt, **kwargs)
        except Exception as e:  # noqa: BLE001  (a template that cannot render these messages)
            raise BadRequest(f"messages: the chat template cannot render them: {e}") from None
        calls = open_calls([prompt], body, body.max_completion_tokens or body.max_tokens)
        call = calls[0]
        rid, created, stops = _rid("chatcmpl"), int(time.time()), body.stop_strings()
        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": served.name}
        text = ChatText(tok, body.skip_special_tokens)
        if body.stream:
            return StreamingResponse(_stream_chat(call, base, body, text, stops), media_type="text/event-stream")
        reasoning, content = "", ""
        try:
            async for tokens, reason in call.events():
                r, c = text.push(tokens)
                reasoning, content = reasoning + r, content + c
                content, hit = _cut_at_stop(content, stops)
                if hit is not None and call.stop_reason is None:
                    call.stop_reason = hit
                    call.abort()
        finally:
            call.abort()
        r, c = text.flush()
        reasoning, (content, hit) = reasoning + r, _cut_at_stop(content + c, stops)
        call.stop_reason = call.stop_reason or hit
        if call.stop_reason is not None:
            call.req.finish_reason = "stop"
        if call.req.error:
            return _engine_error(calls)
        out = {"id": rid, "object": "chat.completion", "created": created, "model": served.name, "choices": [{
            "index": 0, "message": {"role": "assistant", "content": content,
                                    "reasoning_content": reasoning or None, "tool_calls": []},
            "logprobs": None, "finish_reason": call.req.finish_reason, "stop_reason": _stop_reason(call),
            "token_ids": list(call.req.tokens) if body.return_token_ids else None}],
            "usage": _usage(calls), "prompt_logprobs": None,
            "prompt_token_ids": list(call.req.prompt) if body.return_token_ids else None,
            "system_fingerprint": None, "service_tier": None, "kv_transfer_params": None}
        if body.return_spec_tokens_details:
            out["sglext"] = _spec_details(calls, served)
        return out

    async def _stream_chat(call: Call, base: dict, body, text: ChatText, stops):
        first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                      "finish_reason": None}]}
        if body.return_token_ids:
            first["prompt_token_ids"] = list(call.req.prompt)
        yield _sse(first)
        content = ""
        try:
            async for tokens, reason in call.events():
                if call.stop_reason is not None:
                    break
                r, c = text.push(tokens)
                if reason:
                    r2, c2 = text.flush()
                    r, c = r + r2, c + c2
                full, hit = _cut_at_stop(content + c, stops)
                c, content = full[len(content):], full
                if hit is not None:
                    call.stop_reason, reason = hit, "stop"
                    call.req.finish_reason = "stop"
                    call.abort()
                if call.req.error:
                    yield _sse(error_body(call.req.error, "InternalServerError", 500))
                delta = {}
                if r:
                    delta["reasoning_content"] = r
                if c or not r:
                    delta["content"] = c
                choice = {"index": 0, "delta": delta, "logprobs": None,
                          "finish_reason": call.req.finish_reason if reason else None}
                if reason:
                    choice["stop_reason"] = _stop_reason(call)
                if body.return_token_ids:
                    choice["token_ids"] = tokens
                yield _sse({**base, "choices": [choice]})
                if reason:
                    break
            if body.stream_options is not None and body.stream_options.include_usage:
                yield _sse({**base, "choices": [], "usage": _usage([call])})
            if body.return_spec_tokens_details:
                yield _sse({**base, "choices": [], "sglext": _spec_details([call], served)})
            yield "data: [DONE]\n\n"
        finally:
            call.abort()

    def _engine_error(calls: list[Call]):
        msg = next(c.req.error for c in calls if c.req.error)
        return JSONResponse(error_body(msg, "InternalServerError", 500), status_code=500)

    return app


def build_served(recipe, draft_dir: str | None, shape: TreeShape | None, name: str | None = None,
                 max_num_seqs: int = 64, max_model_len: int | None = None, speculate: bool = True) -> Served:
    """Load the target (as every stage does) and the draft; start the engine thread."""
    import torch

    from eyas.data.regenerate import eos_token_ids
    from eyas.data.target import input_device, load_recipe_target, resolve_path
    from eyas.train.checkpoint import load_draft

    model, tok = load_recipe_target(recipe.target)
    eos = set(eos_token_ids(model, tok))
    engines = {"plain": Engine(model, max_batch=max_num_seqs, eos_ids=eos, max_model_len=max_model_len)}
    draft = None
    if draft_dir is not None and speculate:
        dtype = next(model.parameters()).dtype
        draft = load_draft(draft_dir, device=input_device(model),
                           dtype=dtype if dtype != torch.float16 else torch.float32).eval()
        engines["spec"] = Engine(model, draft, shape, max_batch=max_num_seqs, eos_ids=eos,
                                 max_model_len=max_model_len)
    served_name = name or recipe.target.model
    metrics = ServerMetrics(served_name, shape.steps if draft is not None else 0)
    limit = engines["plain"].max_model_len
    return Served(name=served_name, root=resolve_path(recipe.target.model), tokenizer=tok,
                  runner=EngineRunner(engines, metrics), metrics=metrics, max_model_len=limit,
                  shape=shape if draft is not None else None, spec_default=draft is not None)


def main_serve(argv: list[str]) -> int:
    from eyas.cli import parse_with_overrides
    from eyas.pipeline import recipe_and_run
    from eyas.recipes.schema import RecipeError
    from eyas.serve.interchange.run_dir import FINAL_CHECKPOINT

    p = argparse.ArgumentParser(prog="eyas serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="a run directory (its target and trained draft) or a recipe (its target)")
    p.add_argument("overrides", nargs="*", help="dotted recipe overrides, e.g. target.device=cuda:1")
    p.add_argument("--draft", help="an eyas draft checkpoint (default: RUN/train/checkpoint-final)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--k", type=int, help="chain length (default: the recipe's eval.k)")
    shape.add_argument("--tree", help="STEPS,TOPK,NUM_DRAFT_TOKENS: an EAGLE-2 dynamic tree (SGLang's parameters)")
    p.add_argument("--no-speculation", action="store_true", help="serve the target alone")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", help="the model name clients use (default: the recipe's target.model)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests decoded at once (default 64)")
    p.add_argument("--max-model-len", type=int, help="context limit (default: the target's max positions)")
    p.add_argument("--log-level", default="info")
    args = parse_with_overrides(p, argv)
    recipe, run_dir = recipe_and_run(args.source, None, args.overrides)
    is_run = Path(args.source).is_dir()
    draft = args.draft or (str(run_dir / FINAL_CHECKPOINT) if is_run and (run_dir / FINAL_CHECKPOINT).is_dir()
                           else None)
    if args.k is not None and args.k < 1:
        raise RecipeError("--k must be >= 1")
    try:
        tree = TreeShape.parse(args.tree) if args.tree else TreeShape.chain(args.k or recipe.eval.k)
    except ValueError as e:
        raise RecipeError(f"--tree {args.tree}: {e}") from None
    served = build_served(recipe, draft, tree, args.served_model_name, args.max_num_seqs, args.max_model_len,
                          speculate=not args.no_speculation)
    import uvicorn

    what = f"draft {draft}, {tree.label}" if served.shape else "no speculation"
    print(f"[eyas] serving {served.name} ({what}) on http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(build_app(served), host=args.host, port=args.port, log_level=args.log_level)
    return 0
