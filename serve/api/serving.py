"""What both generation endpoints share (vLLM's `entrypoints/openai/engine/serving.py`): the served model
(`Served`), a request's tokens arriving from the engine thread (`Call`), the sampling parameters of a
request, and the one path from engine tokens to response text cut at the stop strings (`Generation`),
which /v1/completions and /v1/chat/completions use streaming or not; then usage, SGLang's verify
counts, server-sent-event framing and the error responses (`ServingError` and the handlers).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from eyas.recipes.types import TreeShape
from eyas.serve.api.metrics import ServerMetrics
from eyas.serve.api.protocol import (
    ErrorInfo,
    ErrorResponse,
    SamplingRequest,
    SGLangExtension,
    SpecTokensDetails,
    UsageInfo,
    error_body,
    random_id,
)
from eyas.serve.api.runner import EngineRunner
from eyas.serve.api.text import ChatText, PlainText
from eyas.serve.decoding.engine import Request
from eyas.serve.decoding.sampling import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class Served:
    """The model behind the server: its name, tokenizer, engine thread and metrics."""

    name: str
    root: str
    tokenizer: PreTrainedTokenizerBase
    runner: EngineRunner
    metrics: ServerMetrics
    max_model_len: int
    shape: TreeShape | None  # None: no draft
    spec_default: bool


# ---------------------------------------------------------------- errors


class ServingError(Exception):
    """A request answered with vLLM's error body instead of a response (the engine failed it: 500)."""

    code, err_type = 500, "InternalServerError"

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(str(self), self.err_type, self.code), status_code=self.code)


class BadRequest(ServingError, ValueError):
    code, err_type = 400, "BadRequestError"


class ModelNotFound(ServingError):
    code, err_type = 404, "NotFoundError"


async def serving_error(_: HttpRequest, exc: ServingError) -> JSONResponse:
    return exc.response()


async def invalid_request(_: HttpRequest, exc: RequestValidationError) -> JSONResponse:
    """A body that does not parse or validate: a 400 naming each field (vLLM answers 400, not 422)."""
    errors = exc.errors()
    msg = "; ".join(
        f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}"
        for e in errors
    ) or str(exc)
    return JSONResponse(error_body(msg, "Bad Request", 400), status_code=400)


def check_model(served: Served, model: str | None) -> None:
    if model is not None and model != served.name:
        raise ModelNotFound(f"The model `{model}` does not exist.")


def raise_engine_error(calls: list[Call]) -> None:
    """The first engine error among `calls`, as a 500."""
    for c in calls:
        if c.req.error:
            raise ServingError(c.req.error)


# ---------------------------------------------------------------- a request in the engine


def sampling_params(
    body: SamplingRequest, prompt_len: int, max_tokens: int | None, served: Served
) -> SamplingParams:
    """The request's sampling; max_tokens defaults to the room left in the context."""
    room = served.max_model_len - prompt_len
    if max_tokens is None:
        max_tokens = room
    if max_tokens > room:
        raise BadRequest(
            f"This model's maximum context length is {served.max_model_len} tokens. "
            f"However, you requested {prompt_len + max_tokens} tokens ({prompt_len} in the "
            f"messages, {max_tokens} in the completion). Please reduce the length of the "
            "messages or completion."
        )
    try:
        return SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=0 if body.top_k is None else body.top_k,
            seed=body.seed,
            max_tokens=max_tokens,
            ignore_eos=body.ignore_eos,
            stop_token_ids=list(body.stop_token_ids or []),
        )
    except ValueError as e:
        raise BadRequest(str(e)) from None


class Call:
    """One request's tokens arriving from the engine thread, as an asyncio queue."""

    def __init__(
        self, served: Served, prompt: list[int], params: SamplingParams, index: int, speculative: bool
    ):
        self.served, self.index = served, index
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[list[int], str | None]] = asyncio.Queue()
        self.req = Request(prompt, params, id=random_id("req"), on_tokens=self._on_tokens)
        self.engine = "spec" if speculative else "plain"
        self.seen_verifications = 0
        self.stop_string: str | None = None  # the stop string the text was cut at

    def _on_tokens(self, req: Request, tokens: list[int]) -> None:  # the engine thread
        m, now = self.served.metrics, time.perf_counter()
        if tokens:
            if len(req.tokens) == len(tokens):
                m.ttft.observe(now - req.arrival)
            else:
                m.itl.observe(now - req.token_times[-len(tokens) - 1])
        for a in req.accepted[self.seen_verifications :]:
            m.verification(self.served.shape.num_draft_tokens - 1, a)
        self.seen_verifications = len(req.accepted)
        if req.finished:
            m.finished(req.finish_reason, len(req.prompt), len(req.tokens), now - req.arrival)
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (list(tokens), req.finish_reason))

    def start(self) -> None:
        self.served.runner.submit(self.engine, self.req)

    async def events(self) -> AsyncIterator[tuple[list[int], str | None]]:
        """-> (new token ids, finish reason or None) until finished."""
        while True:
            tokens, reason = await self.queue.get()
            yield tokens, reason
            if reason is not None:
                return

    def abort(self) -> None:
        if not self.req.finished:
            self.served.runner.abort(self.req)

    def stop_at(self, stop: str) -> None:
        """The text reached the stop string `stop`: the request ends here, finish_reason "stop"."""
        self.stop_string = stop
        self.abort()
        self.req.finish_reason = "stop"

    def stop_reason(self) -> int | str | None:
        """vLLM's stop_reason: the stop string or the stop token id that ended the request, else None."""
        if self.stop_string is not None:
            return self.stop_string
        r = self.req
        if r.finish_reason == "stop" and r.tokens and r.tokens[-1] in r.params.stop_token_ids:
            return r.tokens[-1]
        return None


def open_calls(
    served: Served, prompts: list[list[int]], body: SamplingRequest, max_tokens: int | None
) -> list[Call]:
    """Check every prompt and its sampling (BadRequest before anything starts), then start them all."""
    speculative = served.shape is not None and (
        served.spec_default if body.speculative is None else body.speculative
    )
    engine = served.runner.engines["spec" if speculative else "plain"]
    calls = []
    for i, p in enumerate(prompts):
        try:
            engine.validate(p)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        calls.append(Call(served, p, sampling_params(body, len(p), max_tokens, served), i, speculative))
    for c in calls:
        c.start()
    return calls


# ---------------------------------------------------------------- tokens -> text cut at the stop strings


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, str | None]:
    """`text` up to the first stop string in it, and that stop string (None: none occurs)."""
    hits = [(text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return text, None
    pos, s = min(hits)
    return text[:pos], s


@dataclass
class Delta:
    """What one engine event of a call adds."""

    token_ids: list[int]  # the ids the engine emitted (all of them, also past a stop string)
    reasoning: str  # harmony chats: analysis-channel text
    text: str  # content text, cut at the first stop string
    finished: bool  # the call's last delta


class Generation:
    """One call's output as text cut at the request's stop strings: the one path from engine tokens to
    response text, streamed (`deltas`) or whole (`collect`, then `text` and `reasoning`). Reaching a
    stop string ends the request with finish_reason "stop" and stop_reason the string."""

    def __init__(self, call: Call, detok: PlainText | ChatText, stops: list[str]):
        self.call, self.detok, self.stops = call, detok, stops
        self.text = ""  # content so far, cut at the first stop string
        self.reasoning = ""

    async def deltas(self) -> AsyncIterator[Delta]:
        """One Delta per engine event until the call finishes or its text reaches a stop string."""
        call = self.call
        try:
            async for tokens, reason in call.events():
                r, c = self.detok.push(tokens)
                if reason is not None:
                    r_rest, c_rest = self.detok.flush()
                    r, c = r + r_rest, c + c_rest
                full, hit = cut_at_stop(self.text + c, self.stops)
                c, self.text = full[len(self.text) :], full
                self.reasoning += r
                if hit is not None:
                    call.stop_at(hit)
                yield Delta(tokens, r, c, finished=reason is not None or hit is not None)
                if reason is not None or hit is not None:
                    return
        finally:
            call.abort()

    async def collect(self) -> Generation:
        """Run to the end; the whole text is then in `text` and `reasoning`."""
        async for _ in self.deltas():
            pass
        return self


async def merge_deltas(gens: list[Generation]) -> AsyncIterator[tuple[Generation, Delta]]:
    """The deltas of several generations in the order they arrive, until every one has finished."""
    merged: asyncio.Queue[tuple[Generation, Delta]] = asyncio.Queue()

    async def pump(g: Generation) -> None:
        async for d in g.deltas():
            await merged.put((g, d))

    tasks = [asyncio.create_task(pump(g)) for g in gens]
    try:
        done = 0
        while done < len(gens):
            g, d = await merged.get()
            yield g, d
            done += d.finished
    finally:
        for t in tasks:
            t.cancel()
        for g in gens:
            g.call.abort()


# ---------------------------------------------------------------- response pieces


def usage_info(calls: list[Call]) -> UsageInfo:
    p = sum(len(c.req.prompt) for c in calls)
    g = sum(len(c.req.tokens) for c in calls)
    return UsageInfo(prompt_tokens=p, completion_tokens=g, total_tokens=p + g)


def spec_details(calls: list[Call], served: Served) -> SGLangExtension:
    """SGLang's `sglext.spec_tokens_details` (return_spec_tokens_details), one per choice."""
    out = []
    for c in calls:
        ct = len(c.req.emitted)
        drafts = sum(c.req.accepted)
        proposed = ct * (served.shape.num_draft_tokens - 1) if served.shape else 0
        out.append(
            SpecTokensDetails(
                spec_verify_ct=ct,
                spec_accept_length=len(c.req.tokens) / ct if ct else None,
                spec_num_correct_drafts=drafts,
                spec_num_proposed_drafts=proposed,
                spec_accept_rate=drafts / proposed if proposed else None,
            )
        )
    return SGLangExtension(spec_tokens_details=out[0] if len(out) == 1 else out)


def sglext_field(body: SamplingRequest, calls: list[Call], served: Served) -> dict[str, SGLangExtension]:
    """{"sglext": ...} when the request asked for SGLang's verify counts, else {} (no key at all)."""
    return {"sglext": spec_details(calls, served)} if body.return_spec_tokens_details else {}


def sse(obj: BaseModel) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(obj.model_dump(mode='json'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def sse_engine_error(call: Call) -> str:
    return sse(ErrorResponse(error=ErrorInfo(message=call.req.error, type="InternalServerError", code=500)))
