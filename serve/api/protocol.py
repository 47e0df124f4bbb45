"""Request bodies of the OpenAI-compatible API, with vLLM's field names and defaults (vLLM 0.10.2+
`entrypoints/openai/protocol.py`), and its error envelope.

Like vLLM, unknown fields are accepted and ignored. What this server does not implement is refused
with a 400 that names the field (n > 1, logprobs, echo) rather than silently ignored.
Extensions: `speculative` (eyas: false decodes this request without the draft), and SGLang's
`return_spec_tokens_details` (per-request verify counts under `sglext`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StreamOptions(BaseModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(default_factory=list)
    stop_token_ids: list[int] | None = Field(default_factory=list)
    n: int = 1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    return_token_ids: bool | None = None
    speculative: bool | None = None
    return_spec_tokens_details: bool | None = None

    @model_validator(mode="after")
    def _supported(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        if self.n != 1:
            raise ValueError(f"n={self.n}: this server returns one choice per prompt (n must be 1)")
        return self

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(_Common):
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


class ChatCompletionRequest(_Common):
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


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400, param: str | None = None) -> dict:
    """vLLM's ErrorResponse (0.10.1+): {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}
