"""/v1/completions request and response bodies, with vLLM's field names and defaults (vLLM 0.10.2+
`entrypoints/openai/completion/protocol.py`): the request, the whole response and its choices, and the
streamed chunks (server-sent events) and their choices. Shared pieces: serve/api/protocol.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from eyas.serve.api.protocol import OpenAIBaseModel, SamplingRequest, SGLangExtension, UsageInfo


class CompletionRequest(SamplingRequest):
    """The prompt as text, token ids, or a list of either (one choice each)."""

    prompt: list[int] | list[list[int]] | str | list[str] | None = None
    max_tokens: int | None = Field(16, ge=1)
    echo: bool | None = False
    logprobs: int | None = None

    @model_validator(mode="after")
    def _prompt(self):
        if self.prompt is None or self.prompt == "" or self.prompt == []:
            raise ValueError("Either prompt or prompt_embeds must be provided and non-empty.")
        if self.echo:
            raise ValueError("echo is not supported by this server")
        if self.logprobs is not None:
            raise ValueError("logprobs is not supported by this server")
        return self

    def prompts(self) -> list[str | list[int]]:
        """One entry per choice: a text, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class CompletionResponseChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    prompt_logprobs: list[Any] | None = None
    token_ids: list[int] | None = None  # return_token_ids: the generated ids
    prompt_token_ids: list[int] | None = None


class CompletionResponse(OpenAIBaseModel):
    omit_unless_set = frozenset({"sglext"})

    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    service_tier: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    sglext: SGLangExtension | None = None


class CompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    text: str  # the delta
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # return_token_ids: the ids this chunk adds
    prompt_token_ids: list[int] | None = None  # return_token_ids: on a choice's first chunk


class CompletionStreamResponse(OpenAIBaseModel):
    """One chunk: a choice's delta, or (no choices) the usage, or SGLang's verify counts."""

    omit_unless_set = frozenset({"sglext"})

    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    sglext: SGLangExtension | None = None
