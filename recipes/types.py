"""The value types of recipe keys (recipes/schema.py): numbers YAML reads as strings, mappings whose keys
are names, and unions whose member is picked by the value's shape so that an error names the exact item.
"""

import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Discriminator, Tag


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
