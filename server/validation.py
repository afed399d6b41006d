"""Reading and validating a request, for every API: the JSON body under a size limit (read_json),
the strict base model, parse(), and the rules that are the same.

Each API's request models (openai/, responses/, anthropic/ protocol.py) build on these. A
problem found here is a ValueError inside a model's validator, or an APIError from parse(); either
way it reaches the client as a 400 in the shape of the route it came in on (server/errors.py).
Rules that only look alike stay with their API: Anthropic's temperature (0 to 1), top_k and stop
sequences (8, not OpenAI's 4) are its own.

The body: an over-size body is a 413, known from Content-Length when the client sends one, or counted while
reading (chunked uploads). Either way the rest of the body is read and thrown away (up to a cap),
never kept: a client still sending when we answered would otherwise get a reset connection
instead of the 413. A client that sent `Expect: 100-continue` waits to be asked for its body: an
over-size one is refused before it is asked, and the connection closed.

What Python's json module accepts beyond JSON is a 400 too, found by fuzzing: NaN and Infinity,
nesting deeper than the parser's recursion limit, and lone UTF-16 surrogates ("\ud800"), which
are no text a tokenizer can take. So are numbers Python cannot hold: an integer literal longer
than its int-string limit (4,300 digits: int() raises), and one too large for a double (1e400).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect, Request

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


# --- the body ----------------------------------------------------------------------------------

MAX_BODY_BYTES = 4 * 1024 * 1024
DRAIN_CAP_BYTES = 64 * 1024 * 1024  # past this, stop draining and let the connection drop


async def read_json(request: Request, limit: int = MAX_BODY_BYTES) -> object:
    """The parsed JSON body; 413 if it is over `limit` bytes, 400 if it is not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and not declared.isdigit():
        raise invalid("Content-Length is not a number")
    over = declared is not None and int(declared) > limit
    if over and request.headers.get("expect", "").lower() == "100-continue":
        # The client sends the body only once asked to (our first read asks): refuse it unasked.
        raise APIError(
            413,
            f"request body is over the limit of {limit} bytes",
            code="request_too_large",
            headers={"Connection": "close"},
        )
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            over = over or size > limit
            if over and size > DRAIN_CAP_BYTES:
                break
            if not over:
                chunks.append(chunk)
    except ClientDisconnect:
        raise APIError(400, "the client went away while sending the body") from None
    if over:
        raise APIError(413, f"request body is over the limit of {limit} bytes", code="request_too_large")
    body = b"".join(chunks)
    if not body.strip():
        raise invalid("the request body is empty; send a JSON object")
    try:
        data = _decode(body.decode(json.detect_encoding(body), "surrogatepass"))  # as json.loads decodes bytes
    except UnicodeDecodeError:
        raise invalid("the request body is not UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise invalid(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise invalid("the request body is nested too deeply") from None
    if b"\0" in body or _ESCAPED_SURROGATE.search(body) or _ENCODED_SURROGATE.search(body):  # a bytes scan, not a walk
        _check_text(data)
    return data


# Where a UTF-8 body can carry a surrogate: a \uD800-\uDFFF escape, or the bytes that would encode
# one (json.loads decodes with "surrogatepass"). A body with NUL bytes is UTF-16 or -32: walked always.
# Two patterns, each led by a literal the scan can jump to: as one alternation it stepped through
# every byte, and took longer than json.loads on a long conversation's body.
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")


def _not_json(constant: str) -> None:
    raise invalid(f"the request body is not valid JSON: {constant} is not a JSON number")


def _int(literal: str) -> int:
    try:
        return int(literal)
    except ValueError:  # over sys.get_int_max_str_digits(): no field takes a number that long
        raise invalid(
            f"the request body has an integer of {len(literal)} digits; that is no number this API takes"
        ) from None


def _float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise invalid(f"the request body has a number too large to hold: {literal[:40]}")
    return value


_decode = json.JSONDecoder(parse_constant=_not_json, parse_int=_int, parse_float=_float).decode  # built once


def _check_text(data: object) -> None:
    """Every string (keys too) must be Unicode text: no lone surrogates. Iterative: depth is unbounded here."""
    pending = [data]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise invalid("the request body contains a lone UTF-16 surrogate escape; it is not text") from None
        elif isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
