"""Fuzzing the real daemon from its own OpenAPI document (schemathesis): no 5xx, no crash, auth enforced.

Every operation GET /openapi.json lists is fuzzed, so routes added later are covered as soon as
they are in the document; a test checks that every route of the app that takes a body is in it. Request bodies are generated from the models the routes validate
against (server/openapi.py: `openapi_extra=request_body(Model)`), valid ones and invalid ones.
Checks per response: not a server error; schema-invalid data rejected with a 4xx; the token
actually enforced (schemathesis replays the request without it, and with a wrong one).

The number of examples is fixed, and generation is cut to a few tokens (a valid body without
max_tokens would otherwise generate up to the whole context on the CPU), so the run stays short.
Routes under /v1/sessions/{session_id} get a real session for half of their cases: a made-up id
only ever reaches the 404, never the turn.

Most bodies the document allows break a rule it cannot express (n must be 1, a tool message needs
content, ...), so few of them reach the engine. The last test therefore generates only valid
requests, over the full documented range of every sampling field, and wants each one answered.
"""

from __future__ import annotations

import json
import traceback

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import ignored_auth, negative_data_rejection, not_a_server_error

# Per operation and mode (valid data, invalid data): routes with a body get more, their space is larger.
EXAMPLES_WITH_BODY, EXAMPLES_WITHOUT = 60, 10
MAX_FUZZ_TOKENS = 2
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")  # other fields are ignored where unknown
CHECKS = [not_a_server_error, negative_data_rejection, ignored_auth]
SESSION_TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


@pytest.fixture(scope="session")
def auth(daemon) -> dict:
    return {"Authorization": f"Bearer {daemon.token}"}


@pytest.fixture(scope="session")
def openapi_doc(daemon, auth) -> dict:
    response = httpx.get(daemon.url + "/openapi.json", headers=auth)
    assert response.status_code == 200
    return response.json()


def short_generation(body: object, positive: bool) -> None:
    """In valid data, cut a token budget (a missing or null one too) to a few tokens. Invalid data
    stays as generated: a body that left out a required max_tokens (Anthropic's), or one whose
    budget is over the schema's maximum, is the case, and a cut would make the daemon's 200 look
    like a miss. The daemon refuses such a body before it generates anything."""
    if not isinstance(body, dict) or not positive:
        return
    for field in TOKEN_FIELDS:
        value = body.get(field)
        if value is None or (type(value) is int and value > MAX_FUZZ_TOKENS):
            body[field] = MAX_FUZZ_TOKENS


def fuzz(operation, mode: GenerationMode, auth: dict, new_session) -> None:
    """Hypothesis over one operation's generated cases; raises the (shrunk) first failure."""
    examples = EXAMPLES_WITH_BODY if operation.body else EXAMPLES_WITHOUT

    @given(case=operation.as_strategy(generation_mode=mode), existing_session=st.booleans())
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def run(case, existing_session):
        short_generation(case.body, positive=mode is GenerationMode.POSITIVE)
        if existing_session and "session_id" in (case.path_parameters or {}):
            case.path_parameters["session_id"] = new_session()
        case.call_and_validate(headers=dict(auth), checks=CHECKS, timeout=120)

    try:
        run()
    except Unsatisfiable:  # nothing invalid to generate: the operation takes no input
        assert mode is GenerationMode.NEGATIVE


def test_fuzz_every_operation_of_the_document(daemon, auth):
    # schemathesis' own pytest plugin (from_fixture) does not run on pytest 9 yet; its strategies do.
    schema = schemathesis.openapi.from_url(daemon.url + "/openapi.json", headers=auth)
    schema.config.update(base_url=daemon.url)

    def new_session() -> str:
        return httpx.post(daemon.url + "/v1/sessions", json={"tools": [SESSION_TOOL]}, headers=auth).json()["id"]

    failures, fuzzed = [], []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                fuzz(operation, mode, auth, new_session)
            except Exception as exc:  # collect: one report for every operation that failed, sub-exceptions too
                failures.append(f"{operation.label} ({mode.value}):\n{''.join(traceback.format_exception(exc))}")
        fuzzed.append(operation.label)
    assert {
        "POST /v1/chat/completions",
        "POST /v1/completions",
        "POST /v1/lingcode/complete",
        "POST /v1/sessions",
        "POST /v1/sessions/{session_id}/turns",
        "POST /v1/messages",
        "POST /v1/messages/count_tokens",
        "POST /v1/responses",
    } <= set(fuzzed)
    document = httpx.get(daemon.url + "/openapi.json", headers=auth).json()
    with_body = {
        f"{method.upper()} {path}"
        for path, operations in document["paths"].items()
        for method in operations
        if method in ("post", "put", "patch")
    }
    assert with_body <= set(fuzzed), with_body - set(fuzzed)
    assert not failures, "\n\n".join(failures)
    assert daemon.process.poll() is None  # and the daemon is still there


def test_the_document_needs_the_token_and_lists_every_route(daemon, openapi_doc):
    assert httpx.get(daemon.url + "/openapi.json").status_code == 401
    paths = openapi_doc["paths"]
    assert {"/health", "/v1/models", "/v1/chat/completions", "/v1/completions", "/metrics"} <= set(paths)
    assert paths["/health"]["get"]["security"] == []  # the one open route
    assert {"bearer", "apiKey"} <= set(openapi_doc["components"]["securitySchemes"])


def test_every_route_with_a_body_documents_it(openapi_doc):
    """Else the fuzzer would only send it empty bodies: name the model with openapi_extra=request_body(Model)."""
    undocumented = [
        f"{method.upper()} {path}"
        for path, operations in openapi_doc["paths"].items()
        for method, operation in operations.items()
        if method in ("post", "put", "patch") and "requestBody" not in operation
    ]
    assert not undocumented, f"routes without a documented body: {undocumented}"


def test_every_route_that_takes_a_body_is_in_the_document(engine):
    """A route left out of the document (include_in_schema=False, or a plain Starlette route) is never fuzzed."""
    from starlette.routing import Route

    from lingcode.pipeline.scheduler import Scheduler
    from lingcode.server.app import create_app

    app = create_app(Scheduler(engine), engine.info, "fuzz-token", model_id="m")
    paths = app.openapi()["paths"]
    routes = [
        (method, route.path)
        for route in app.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method in ("POST", "PUT", "PATCH")
    ]
    assert len(routes) >= 8
    missing = [f"{method} {path}" for method, path in routes if method.lower() not in paths.get(path, {})]
    assert not missing, f"routes with a body that the document (and so the fuzzer) leaves out: {missing}"


SAMPLING = {
    "temperature": st.floats(0, 2),  # 5e-324 included: it was a 500 once
    "top_p": st.floats(0, 1, exclude_min=True),
    "top_k": st.integers(-1, 2**40),
    "seed": st.integers(-(2**63), 2**64 - 1),
    "stop": st.lists(st.text(min_size=1, max_size=4), max_size=4),
    "ignore_eos": st.booleans(),
    "stream": st.booleans(),
}


def test_a_prompt_without_a_known_token_is_a_400(daemon, auth):
    """The fuzzer found it: "\x16" has no token in SmolLM2's vocabulary, so the prompt was no ids
    at all and the engine's refusal came back as a 500."""
    for stream in (False, True):
        response = httpx.post(
            daemon.url + "/v1/completions", json={"prompt": "\x16", "max_tokens": 4, "stream": stream}, headers=auth
        )
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "prompt" and "vocabulary" in error["message"], error
    assert (
        httpx.post(daemon.url + "/v1/completions", json={"prompt": "\x16a", "max_tokens": 4}, headers=auth).status_code
        == 200
    )


def test_valid_generation_requests_are_always_answered(daemon, auth, engine):
    vocab = engine.info.tokenizer.vocab_size
    prompts = st.text(min_size=1, max_size=40) | st.lists(st.integers(0, vocab - 1), min_size=1, max_size=16)
    fields = st.fixed_dictionaries({"prompt": prompts}, optional=SAMPLING)

    @given(body=fields)
    @settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def run(body):
        response = httpx.post(
            daemon.url + "/v1/completions", json={**body, "max_tokens": MAX_FUZZ_TOKENS}, headers=auth, timeout=120
        )
        if isinstance(body["prompt"], str) and not engine.info.tokenizer.encode(body["prompt"]):
            assert response.status_code == 400 and response.json()["error"]["param"] == "prompt", response.text
            return  # no token to start from (test_a_prompt_without_a_known_token_is_a_400)
        assert response.status_code == 200, response.text
        if body.get("stream"):
            events = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e.strip()]
            assert events[-1] == "[DONE]" and not any(e.startswith('{"error"') for e in events), events[-3:]

    run()


def test_special_token_text_in_messages_and_tool_results_is_counted_as_text(daemon, engine):
    """Issue 62: text from a client that spells control tokens, mixed with pieces of them, lingcode's
    own marks and any other text, adds exactly its plain-text tokens to the prompt, in a user
    message and in a tool result (count_tokens renders the chat as every route does)."""
    tok = engine.info.tokenizer
    specials = sorted(tok.hf.get_added_tokens_decoder()[i].content for i in tok.special_ids)
    pieces = st.sampled_from(
        [
            *specials,
            "<|",
            "|>",
            "im_start",
            "<tool_call>",
            "\n",
            " ",
            "x",
            "é",
            "🙂",
            "\U0010fffd",
            "\U000f0000",
            "\U000f0003",
        ]
    ) | st.text(max_size=3)
    headers = {"x-api-key": daemon.token, "anthropic-version": "2023-06-01"}

    def count(text: str) -> int:
        messages = [
            {"role": "user", "content": text},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "read_file", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": text}]},
        ]
        response = httpx.post(
            daemon.url + "/v1/messages/count_tokens",
            headers=headers,
            timeout=60,
            json={
                "model": "m",
                "messages": messages,
                "tools": [{"name": "read_file", "input_schema": {"type": "object"}}],
            },
        )
        assert response.status_code == 200, response.text
        return response.json()["input_tokens"]

    empty = count("az")

    @given(text=st.lists(pieces, max_size=12).map("".join))
    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def run(text):
        # between letters: the template's own text around it splits off the same way
        plain = len(tok.encode_text("a" + text + "z")) - len(tok.encode_text("az"))
        assert count("a" + text + "z") - empty == 2 * plain, repr(text)

    run()


# --- the connection layer: raw request heads (issue 62) --------------------------------------------

HOST_HEADERS = {
    "one": [b"Host: 127.0.0.1"],
    "two": [b"Host: 127.0.0.1", b"Host: attacker.example"],
    "bare-ipv6": [b"Host: ::1"],
}
COUNT_BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


def _answer(conn) -> tuple[int, bytes]:
    """The final answer's status and body (after any 100 Continue), read by its Content-Length."""
    reply = b""
    while True:
        while reply.startswith(b"HTTP/1.1 100 ") and b"\r\n\r\n" in reply:
            reply = reply.partition(b"\r\n\r\n")[2]
        head, found, body = reply.partition(b"\r\n\r\n")
        if found and not head.startswith(b"HTTP/1.1 100 "):
            lengths = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
            if len(body) >= int(lengths[0].split(b":")[1]):
                return int(head.split(b" ", 2)[1]), body
        chunk = conn.recv(65536)
        assert chunk, f"the connection closed before the answer ended: {reply[:300]!r}"
        reply += chunk


def test_fuzzed_request_heads_get_the_right_answer_in_the_apis_shape(daemon):
    """Heads of every size around the limit, sent in random pieces, with one Host, two or a bare IPv6
    one, with or without Expect: 100-continue, and a Content-Length under or over the body limit:
    each gets an answer, in its API's shape, with the status that the first rule it breaks says."""
    import socket

    from lingcode.server.frameworks import HEAD_BYTES
    from lingcode.server.validation import MAX_BODY_BYTES

    host, port = daemon.url.removeprefix("http://").split(":")

    @given(
        path=st.sampled_from(["/v1/completions", "/v1/messages/count_tokens", "/health"]),
        filler=st.integers(0, 3 * HEAD_BYTES) | st.integers(HEAD_BYTES - 2048, HEAD_BYTES + 2048),
        hosts=st.sampled_from(sorted(HOST_HEADERS)),
        expect=st.booleans(),
        over=st.booleans(),
        pieces=st.integers(1, 6),
        seed=st.randoms(use_true_random=False),
    )
    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def run(path, filler, hosts, expect, over, pieces, seed):
        method = b"GET" if path == "/health" else b"POST"
        unasked = over and expect  # a body over the limit that waits to be asked for: it never is
        length = MAX_BODY_BYTES + 1 if unasked else len(COUNT_BODY)
        lines = [
            b"%s %s HTTP/1.1" % (method, path.encode()),
            *HOST_HEADERS[hosts],
            b"x-api-key: " + daemon.token.encode(),
            b"Content-Type: application/json",
            b"X-Filler: " + b"f" * filler,
        ]
        if method == b"POST":
            lines.append(b"Content-Length: %d" % length)
            if expect:
                lines.append(b"Expect: 100-continue")
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        if len(head) > HEAD_BYTES + 1024:
            wanted = 431
        elif len(head) <= HEAD_BYTES - 1024 and hosts == "two":
            wanted = 400
        elif len(head) <= HEAD_BYTES - 1024 and hosts == "bare-ipv6":
            wanted = 403
        elif len(head) <= HEAD_BYTES - 1024 and method == b"POST" and unasked:
            wanted = 413
        else:
            wanted = None  # near the limit, or a body that is sent: any answer but a 5xx
        cuts = sorted(seed.randrange(len(head)) for _ in range(pieces - 1))
        with socket.create_connection((host, int(port)), timeout=60) as conn:
            try:
                for start, end in zip([0, *cuts], [*cuts, len(head)]):
                    conn.sendall(head[start:end])
                if method == b"POST" and wanted is None and not unasked:
                    conn.sendall(COUNT_BODY)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before it was all sent: the answer is read below
            status, body = _answer(conn)
        if wanted is not None:
            assert status == wanted, (status, wanted, len(head), body[:300])
        assert status < 500, (status, body[:300])
        if status != 200:
            answer = json.loads(body)
            if path.startswith("/v1/messages"):
                assert answer["type"] == "error" and "message" in answer["error"], answer
            else:
                assert "message" in answer["error"] and "code" in answer["error"], answer

    run()
    assert httpx.get(daemon.url + "/health").status_code == 200 and daemon.process.poll() is None
