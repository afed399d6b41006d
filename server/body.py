"""Reading a request's JSON body under a size limit.

An over-size body is a 413, known from Content-Length when the client sends one, or counted while
reading (chunked uploads). Either way the rest of the body is read and thrown away (up to a cap),
never kept: a client still sending when we answered would otherwise get a reset connection
instead of the 413.

What Python's json module accepts beyond JSON is a 400 too, found by fuzzing: NaN and Infinity,
nesting deeper than the parser's recursion limit, and lone UTF-16 surrogates ("\ud800"), which
are no text a tokenizer can take. So are numbers Python cannot hold: an integer literal longer
than its int-string limit (4,300 digits: int() raises), and one too large for a double (1e400).
"""

from __future__ import annotations

import json
import math

from starlette.requests import ClientDisconnect, Request

from lingcode.server.errors import APIError, invalid

MAX_BODY_BYTES = 4 * 1024 * 1024
DRAIN_CAP_BYTES = 64 * 1024 * 1024  # past this, stop draining and let the connection drop


async def read_json(request: Request, limit: int = MAX_BODY_BYTES) -> object:
    """The parsed JSON body; 413 if it is over `limit` bytes, 400 if it is not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and not declared.isdigit():
        raise invalid("Content-Length is not a number")
    over = declared is not None and int(declared) > limit
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
        data = json.loads(body, parse_constant=_not_json, parse_int=_int, parse_float=_float)
    except UnicodeDecodeError:
        raise invalid("the request body is not UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise invalid(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise invalid("the request body is nested too deeply") from None
    _check_text(data)
    return data


def _not_json(constant: str) -> None:
    raise invalid(f"the request body is not valid JSON: {constant} is not a JSON number")


def _int(literal: str) -> int:
    try:
        return int(literal)
    except ValueError:  # over sys.get_int_max_str_digits(): no field takes a number that long
        raise invalid(f"the request body has an integer of {len(literal)} digits; that is no number this API "
                      "takes") from None  # fmt: skip


def _float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise invalid(f"the request body has a number too large to hold: {literal[:40]}")
    return value


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
