"""/v1/chat/completions request and response bodies, with vLLM's field names and defaults (vLLM 0.10.2+
`entrypoints/openai/chat_completion/protocol.py`): the request, the whole response, its choice and
message, and the streamed chunks with their choice and delta. Harmony targets (gpt-oss) return the
analysis channel as `reasoning_content`. Shared pieces: serve/api/protocol.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from eyas.serve.api.protocol import OpenAIBaseModel, SamplingRequest, SGLangExtension, UsageInfo


class ChatCompletionRequest(SamplingRequest):
    """Messages, rendered with the target's chat template (chat_template_kwargs and reasoning_effort
    reach it)."""

    messages: list[dict[str, Any]]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    logprobs: bool | None = False

    @model_validator(mode="after")
    def _chat(self):
        if not self.messages:
            raise ValueError("messages must hold at least one message")
        if self.logprobs:
            raise ValueError("logprobs is not supported by this server")
        return self

    def template_kwargs(self) -> dict[str, Any]:
        """What reaches the chat template: chat_template_kwargs, and reasoning_effort unless they set it."""
        kwargs = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            kwargs.setdefault("reasoning_effort", self.reasoning_effort)
        return kwargs


class ChatMessage(OpenAIBaseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None  # harmony: the analysis channel
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int = 0
    message: ChatMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    token_ids: list[int] | None = None  # return_token_ids: the generated ids


class ChatCompletionResponse(OpenAIBaseModel):
    omit_unless_set = frozenset({"sglext"})

    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    prompt_logprobs: list[Any] | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids
    system_fingerprint: str | None = None
    service_tier: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    sglext: SGLangExtension | None = None


class DeltaMessage(OpenAIBaseModel):
    """What one chunk adds; only the keys given appear (the first chunk: role and empty content)."""

    omit_unless_set = frozenset({"role", "reasoning_content", "content"})

    role: str | None = None
    reasoning_content: str | None = None
    content: str | None = None


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    """stop_reason appears on the last chunk only, token_ids only with return_token_ids."""

    omit_unless_set = frozenset({"stop_reason", "token_ids"})

    index: int = 0
    delta: DeltaMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    """One chunk: the choice's delta (the first one also carries prompt_token_ids with
    return_token_ids), or (no choices) the usage, or SGLang's verify counts."""

    omit_unless_set = frozenset({"usage", "prompt_token_ids", "sglext"})

    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None
    sglext: SGLangExtension | None = None
