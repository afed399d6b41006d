"""lingcode.server: the daemon's HTTP app (on uvicorn) and `lingcode serve`.

One way through for every API (serving.py): validate -> convert to a Turn -> run -> stream or
collect. Each API is a folder with its request models (protocol.py) and its translation to and
from the pipeline:
  openai/         POST /v1/chat/completions (chat.py), POST /v1/completions (completions.py)
  anthropic/      POST /v1/messages[/count_tokens]
  responses/      POST /v1/responses
  sessions/       /v1/sessions...: token-exact agent sessions
  editor/         POST /v1/lingcode/complete: code completions at a cursor
Around them, one job per module:
  app.py          create_app(): wires the routes, auth and error handling together
  serving.py      the pipeline every API goes through (Serving, Shape, Prepared) and the SSE helpers
                  the APIs share
  streaming.py    stream or collect (respond), a stream's head before its first events
                  (StreamHead), and clients that leave: work nobody will read is cancelled, SSE
                  always closes its source
  errors.py       every failure in the API's error shape, with the right HTTP status (as_api_error)
  validation.py   reading a JSON body under a size limit, the strict base model, parse(), the
                  rules every API shares
  access.py       who may talk to the daemon: the Host allow-list (DNS rebinding), browser-Origin
                  refusal, then the token (Authorization: Bearer / x-api-key) on every route but /health
  frameworks.py   every override of uvicorn's, Starlette's and FastAPI's internals, and what it buys
  observability.py  request ids, HTTP metrics, the access log; GET /metrics
  logs.py         JSON / key=value log lines tagged with the request id and route
  openapi.py      GET /openapi.json: request bodies documented from the routes' models
  daemon.py       serve(): token file, engine, socket, uvicorn, daemon.json
"""
