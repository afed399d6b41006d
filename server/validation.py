"""Request validation every API shares: the strict base model, parse(), and the rules that are the same.

Each API's request models (openai/, responses/, anthropic/ protocol.py) build on these. A
problem found here is a ValueError inside a model's validator, or an APIError from parse(); either
way it reaches the client as a 400 in the shape of the route it came in on (server/errors.py).
Rules that only look alike stay with their API: Anthropic's temperature (0 to 1), top_k and stop
sequences (8, not OpenAI's 4) are its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lingcode.server.errors import APIError, invalid
from lingcode.pipeline.turns import ToolChoice


class StrictModel(BaseModel):
    """Types are strict (a max_tokens of "5" or true is a 400, not a guess); unknown fields are
    ignored, since SDKs and frameworks send many of them."""

    model_config = ConfigDict(strict=True, extra="ignore")


TokenCount = Annotated[int, Field(ge=1)]  # max_tokens, under any of its names
TopP = Annotated[float, Field(gt=0, le=1)]
ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]


def check_unique_tool_names(names: Iterable[str]) -> None:
    names = list(names)
    if len(set(names)) != len(names):
        raise ValueError("tools: two tools have the same name")


def check_tool_choice(choice: ToolChoice, tool_names: Iterable[str], required: str = "required") -> None:
    """A named tool_choice must name one of the tools, and forcing a call needs tools.

    `required` is what the API calls forcing a call (Anthropic's is 'any'), so the message uses its word.
    """
    names = set(tool_names)
    if choice.name is not None and choice.name not in names:
        raise ValueError(f"tool_choice: no tool named {choice.name!r} in tools")
    if choice.mode == "required" and not names:
        raise ValueError(f"tool_choice: {required!r} needs tools")


# Pydantic names union members in error locations ("content", "list[TextPart]", 0, "type"); a
# client wants the field path, so those tags are dropped.
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|[A-Z]\w*|\w+\[.*\]|[\w-]+-\w+\[.*\])$")


def parse(model: type[StrictModel], data: object) -> StrictModel:
    """Validate a parsed JSON body; the first problem becomes a 400 naming the field."""
    if not isinstance(data, dict):
        raise invalid("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        parts: list[str] = []
        for part in error["loc"]:
            if isinstance(part, int):
                parts.append(f"[{part}]")
            elif not _UNION_TAG.match(part):
                parts.append(("." if parts else "") + part)
        param = "".join(parts) or None
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            message = "this field is required"
        raise APIError(400, f"{param}: {message}" if param else message, param=param) from None
