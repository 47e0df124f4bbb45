"""What the OpenAI-compatible API's endpoints share, with vLLM's field names and defaults (vLLM 0.10.2+
`entrypoints/openai/engine/protocol.py` and `models/protocol.py`): the base of every response body,
the request fields both generation endpoints take, usage, SGLang's per-request verify counts, the
models list and the error envelope. Each endpoint's own request and response bodies live beside its
serving code: completion/protocol.py (/v1/completions), chat_completion/protocol.py (/v1/chat/completions).

Like vLLM, unknown request fields are accepted and ignored. What this server does not implement is
refused with a 400 that names the field (n > 1, logprobs, echo) rather than silently ignored.
Extensions: `speculative` (eyas: false decodes this request without the draft), and SGLang's
`return_spec_tokens_details` (per-request verify counts under `sglext`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator


def random_id(prefix: str) -> str:
    """`prefix-<32 hex digits>`, as vLLM names responses (cmpl-, chatcmpl-, modelperm-)."""
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIBaseModel(BaseModel):
    """A response body. JSON keys come in field order; a field named in `omit_unless_set` is left out
    of the JSON unless it was given (to the constructor): vLLM omits those keys rather than send null."""

    omit_unless_set: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler) -> dict[str, Any]:
        data = handler(self)
        for name in self.omit_unless_set - self.model_fields_set:
            data.pop(name, None)
        return data


# ---------------------------------------------------------------- requests


class StreamOptions(BaseModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class SamplingRequest(BaseModel):
    """The request fields both /v1/completions and /v1/chat/completions take."""

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

    def include_usage(self) -> bool:
        """A last streamed chunk with the usage (stream_options.include_usage)."""
        return self.stream_options is not None and bool(self.stream_options.include_usage)


# ---------------------------------------------------------------- response pieces


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None


class SpecTokensDetails(OpenAIBaseModel):
    """SGLang's verify counts of one choice (`return_spec_tokens_details`)."""

    spec_verify_ct: int  # verifications (target forwards after the prefill)
    spec_accept_length: float | None  # emitted tokens per verification
    spec_num_correct_drafts: int
    spec_num_proposed_drafts: int
    spec_accept_rate: float | None


class SGLangExtension(OpenAIBaseModel):
    """`sglext`: one SpecTokensDetails for a single choice, a list of them for several."""

    spec_tokens_details: SpecTokensDetails | list[SpecTokensDetails]


# ---------------------------------------------------------------- /v1/models


class ModelPermission(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("modelperm"))
    object: str = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = False
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(OpenAIBaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "eyas"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(OpenAIBaseModel):
    object: str = "list"
    data: list[ModelCard]


# ---------------------------------------------------------------- errors


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    """vLLM's ErrorResponse (0.10.1+): {"error": {"message", "type", "param", "code"}}."""

    error: ErrorInfo


def error_body(
    message: str, err_type: str = "BadRequestError", code: int = 400, param: str | None = None
) -> dict:
    """vLLM's error envelope as a dict: {"error": {"message", "type", "param", "code"}}."""
    return ErrorResponse(error=ErrorInfo(message=message, type=err_type, param=param, code=code)).model_dump()
