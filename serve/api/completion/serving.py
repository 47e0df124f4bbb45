"""POST /v1/completions (vLLM's `entrypoints/openai/completion/serving.py`): a prompt as text, token ids,
or a list of either (one choice each), answered whole or streamed as server-sent events. The text
comes from the shared Generation path (serve/api/serving.py), cut at the request's stop strings.
`return_token_ids` adds `token_ids` (generated) and `prompt_token_ids` to each choice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse

from eyas.serve.api.completion.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from eyas.serve.api.protocol import random_id
from eyas.serve.api.serving import (
    SSE_DONE,
    Generation,
    Served,
    check_model,
    merge_deltas,
    open_calls,
    raise_engine_error,
    sglext_field,
    sse,
    sse_engine_error,
    usage_info,
)
from eyas.serve.api.text import PlainText

router = APIRouter()


@router.post("/v1/completions", response_model=None)
async def completions(
    body: CompletionRequest, request: HttpRequest
) -> CompletionResponse | StreamingResponse:
    return await create_completion(request.app.state.served, body)


async def create_completion(
    served: Served, body: CompletionRequest
) -> CompletionResponse | StreamingResponse:
    check_model(served, body.model)
    tok = served.tokenizer
    prompts = [tok.encode(p) if isinstance(p, str) else list(p) for p in body.prompts()]
    calls = open_calls(served, prompts, body, body.max_tokens)
    stops = body.stop_strings()
    gens = [Generation(c, PlainText(tok, body.skip_special_tokens), stops) for c in calls]
    head = {"id": random_id("cmpl"), "created": int(time.time()), "model": served.name}
    if body.stream:
        return StreamingResponse(_stream(served, body, gens, head), media_type="text/event-stream")
    await asyncio.gather(*[g.collect() for g in gens])
    raise_engine_error(calls)
    choices = [_choice(g, bool(body.return_token_ids)) for g in gens]
    return CompletionResponse(
        **head, choices=choices, usage=usage_info(calls), **sglext_field(body, calls, served)
    )


def _choice(gen: Generation, return_token_ids: bool) -> CompletionResponseChoice:
    c = gen.call
    return CompletionResponseChoice(
        index=c.index,
        text=gen.text,
        finish_reason=c.req.finish_reason,
        stop_reason=c.stop_reason(),
        token_ids=list(c.req.tokens) if return_token_ids else None,
        prompt_token_ids=list(c.req.prompt) if return_token_ids else None,
    )


async def _stream(
    served: Served, body: CompletionRequest, gens: list[Generation], head: dict[str, str | int]
) -> AsyncIterator[str]:
    """One chunk per engine event of each choice, then the usage (include_usage), SGLang's verify
    counts (return_spec_tokens_details) and [DONE]."""
    calls = [g.call for g in gens]
    first = {c.index for c in calls}  # choices that have not sent a chunk yet
    try:
        async for g, d in merge_deltas(gens):
            c = g.call
            if c.req.error:
                yield sse_engine_error(c)
            choice = CompletionResponseStreamChoice(
                index=c.index,
                text=d.text,
                finish_reason=c.req.finish_reason if d.finished else None,
                stop_reason=c.stop_reason() if d.finished else None,
                token_ids=d.token_ids if body.return_token_ids else None,
                prompt_token_ids=list(c.req.prompt) if body.return_token_ids and c.index in first else None,
            )
            first.discard(c.index)
            yield sse(CompletionStreamResponse(**head, choices=[choice]))
        if body.include_usage():
            yield sse(CompletionStreamResponse(**head, choices=[], usage=usage_info(calls)))
        if body.return_spec_tokens_details:
            yield sse(CompletionStreamResponse(**head, choices=[], **sglext_field(body, calls, served)))
        yield SSE_DONE
    finally:
        for c in calls:
            c.abort()
