"""The value types of recipe keys (recipes/schema.py): numbers YAML reads as strings, mappings whose keys
are names, unions whose member is picked by the value's shape so that an error names the exact item, and a
draft's tree shape (TreeShape).
"""

import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Tag


class Section(BaseModel):
    """A recipe section: strict types (an int is a number, "1" no integer), unknown keys refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _number(v: Any) -> Any:  # YAML 1.1 reads `3e-4` (no dot) as a string
    try:
        return float(v) if isinstance(v, str) else v
    except ValueError:
        return v


def _names(m: Any, values: bool) -> Any:
    """Mapping keys are names (YAML reads `0:`, a GPU index, as an int); with `values`, so are int values."""
    if not isinstance(m, dict):
        return m
    return {str(k): str(v) if values and type(v) is int else v for k, v in m.items()}


def either(a: Any, b: Any, expected: str) -> Any:
    """`a | b`, the member picked by the value's shape so that an error inside it names the exact item; a
    value of neither shape is the one error `expected {expected}`, which names the shapes ("str or list")."""
    tags = dict(zip(expected.split(" or ")[:2], (a, b), strict=True))
    shape = Discriminator(
        lambda v: f"|{type(v).__name__}" if type(v).__name__ in tags else None,
        custom_error_type="either",
        custom_error_message=f"expected {expected}",
    )
    return Annotated[typing.Union[tuple(Annotated[t, Tag(f"|{k}")] for k, t in tags.items())], shape]  # noqa: UP007


def tagged_member(tp: Any, tag: str) -> type[BaseModel] | None:
    """The model of the member tagged `tag` in a tagged union annotation `tp` (`either`'s, the draft
    section's), None if none is."""
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    for member in typing.get_args(tp):
        args = typing.get_args(member) if typing.get_origin(member) is Annotated else ()
        if any(isinstance(m, Tag) and m.tag == tag for m in args[1:]):
            return inner_model(args[0])
    return None


def inner_model(tp: Any) -> type[BaseModel] | None:
    """The model an annotation holds: a section, or PromptSource in `str | list[PromptSource]`."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    return next((m for a in typing.get_args(tp) if (m := inner_model(a))), None)


Num = Annotated[float, BeforeValidator(_number)]  # an int is a number too
Names = Annotated[dict[str, str], BeforeValidator(lambda m: _names(m, values=True))]
Weights = Annotated[dict[str, Num], BeforeValidator(lambda m: _names(m, values=False))]
DeviceMap = either(str, Names, "str or dict or NoneType")
Dtype = Literal["float32", "bfloat16", "float16"]


# A draft's shape (eval.tree, `--tree`, the loop's rounds): serve/decoding/tree.py says how a tree is built.
#   steps S: tree depth; topk K: children expanded per node; num_draft_tokens N: tokens the target verifies
#   per row, the root included (SGLang's count). A chain of k drafts is (S=k, K=1, N=k+1).
@dataclass(frozen=True)
class TreeShape:
    steps: int
    topk: int
    num_draft_tokens: int

    def __post_init__(self):
        if self.steps < 1 or self.topk < 1:
            raise ValueError(f"tree steps and topk must be >= 1, got {self}")
        most = 1 + self.topk + (self.steps - 1) * self.topk**2  # the root and every proposed node
        if not 2 <= self.num_draft_tokens <= most:
            raise ValueError(
                f"num_draft_tokens={self.num_draft_tokens} for steps={self.steps}, topk={self.topk}: "
                f"must be in [2, {most}] (the root plus at most the {most - 1} proposed nodes)"
            )
        if self.topk == 1 and self.num_draft_tokens != self.steps + 1:
            raise ValueError(
                f"a chain (topk=1) of {self.steps} steps verifies steps+1 = {self.steps + 1} tokens, "
                f"not num_draft_tokens={self.num_draft_tokens}"
            )

    @classmethod
    def chain(cls, k: int) -> "TreeShape":
        return cls(steps=k, topk=1, num_draft_tokens=k + 1)

    @classmethod
    def parse(cls, text: str) -> "TreeShape":
        """'S,K,N' (as `--tree 5,8,32`)."""
        try:
            s, k, n = (int(x) for x in text.split(","))
        except ValueError:
            raise ValueError(f"tree {text!r}: expected STEPS,TOPK,NUM_DRAFT_TOKENS, e.g. 5,8,32") from None
        return cls(s, k, n)

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    @property
    def label(self) -> str:
        return (
            f"k={self.steps}" if self.is_chain else f"tree {self.steps},{self.topk},{self.num_draft_tokens}"
        )

    def to_json(self):
        return None if self.is_chain else [self.steps, self.topk, self.num_draft_tokens]
