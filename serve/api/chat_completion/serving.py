"""POST /v1/chat/completions (vLLM's `entrypoints/openai/chat_completion/serving.py`): messages rendered
with the target's chat template, one choice, answered whole or streamed as server-sent events. The text
comes from the shared Generation path (serve/api/serving.py) through ChatText: harmony targets (gpt-oss)
return the analysis channel as `reasoning_content`; stop strings cut the content.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse

from eyas.data.chat import render_prompt
from eyas.serve.api.chat_completion.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    DeltaMessage,
)
from eyas.serve.api.protocol import random_id
from eyas.serve.api.serving import (
    SSE_DONE,
    BadRequest,
    Delta,
    Generation,
    Served,
    check_model,
    open_calls,
    raise_engine_error,
    sglext_field,
    sse,
    sse_engine_error,
    usage_info,
)
from eyas.serve.api.text import ChatText

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(
    body: ChatCompletionRequest, request: HttpRequest
) -> ChatCompletionResponse | StreamingResponse:
    return await create_chat_completion(request.app.state.served, body)


def render(served: Served, body: ChatCompletionRequest) -> list[int]:
    """The prompt's token ids: the messages through the chat template."""
    try:
        return render_prompt(
            served.tokenizer, body.messages, body.add_generation_prompt, **body.template_kwargs()
        )
    except Exception as e:  # noqa: BLE001  (a template that cannot render these messages)
        raise BadRequest(f"messages: the chat template cannot render them: {e}") from None


async def create_chat_completion(
    served: Served, body: ChatCompletionRequest
) -> ChatCompletionResponse | StreamingResponse:
    check_model(served, body.model)
    calls = open_calls(served, [render(served, body)], body, body.max_completion_tokens or body.max_tokens)
    call = calls[0]
    gen = Generation(call, ChatText(served.tokenizer, body.skip_special_tokens), body.stop_strings())
    head = {"id": random_id("chatcmpl"), "created": int(time.time()), "model": served.name}
    if body.stream:
        return StreamingResponse(_stream(served, body, gen, head), media_type="text/event-stream")
    await gen.collect()
    raise_engine_error(calls)
    message = ChatMessage(content=gen.text, reasoning_content=gen.reasoning or None)
    choice = ChatCompletionResponseChoice(
        message=message,
        finish_reason=call.req.finish_reason,
        stop_reason=call.stop_reason(),
        token_ids=list(call.req.tokens) if body.return_token_ids else None,
    )
    return ChatCompletionResponse(
        **head,
        choices=[choice],
        usage=usage_info(calls),
        prompt_token_ids=list(call.req.prompt) if body.return_token_ids else None,
        **sglext_field(body, calls, served),
    )


def _stream_choice(gen: Generation, d: Delta, return_token_ids: bool) -> ChatCompletionResponseStreamChoice:
    """A chunk's choice: the reasoning delta if any, the content delta if any (or if there is neither);
    stop_reason on the last chunk only, token_ids with return_token_ids only."""
    delta = {}
    if d.reasoning:
        delta["reasoning_content"] = d.reasoning
    if d.text or not d.reasoning:
        delta["content"] = d.text
    extra = {"stop_reason": gen.call.stop_reason()} if d.finished else {}
    if return_token_ids:
        extra["token_ids"] = d.token_ids
    finish_reason = gen.call.req.finish_reason if d.finished else None
    return ChatCompletionResponseStreamChoice(
        delta=DeltaMessage(**delta), finish_reason=finish_reason, **extra
    )


async def _stream(
    served: Served, body: ChatCompletionRequest, gen: Generation, head: dict[str, str | int]
) -> AsyncIterator[str]:
    """The role chunk, one chunk per engine event, then the usage (include_usage), SGLang's verify
    counts (return_spec_tokens_details) and [DONE]."""
    call = gen.call
    prompt_ids = {"prompt_token_ids": list(call.req.prompt)} if body.return_token_ids else {}
    role = ChatCompletionResponseStreamChoice(delta=DeltaMessage(role="assistant", content=""))
    yield sse(ChatCompletionStreamResponse(**head, choices=[role], **prompt_ids))
    try:
        async for d in gen.deltas():
            if call.req.error:
                yield sse_engine_error(call)
            choice = _stream_choice(gen, d, bool(body.return_token_ids))
            yield sse(ChatCompletionStreamResponse(**head, choices=[choice]))
        if body.include_usage():
            yield sse(ChatCompletionStreamResponse(**head, choices=[], usage=usage_info([call])))
        if body.return_spec_tokens_details:
            yield sse(ChatCompletionStreamResponse(**head, choices=[], **sglext_field(body, [call], served)))
        yield SSE_DONE
    finally:
        call.abort()
