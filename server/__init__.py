"""lingcode.server: the daemon's HTTP app (OpenAI-compatible routes on uvicorn) and `lingcode serve`.

Layout, one job per module:
  app.py          create_app(): wires the routes, auth and error handling together
  auth.py         the token check (Authorization: Bearer / x-api-key) for every route but /health
  access.py       the Host allow-list (DNS rebinding) and browser-Origin refusal, before the token
  observability.py  request ids, HTTP metrics, the access log; GET /metrics
  logs.py         JSON / key=value log lines tagged with the request id and route
  openapi.py      GET /openapi.json: request bodies documented from the routes' models
  errors.py       every failure in OpenAI's error shape, with the right HTTP status
  body.py         reading a JSON body under a size limit
  openai_api.py   request models: what a client may send, validated
  inputs.py       request -> prompt token ids + sampling params (context length checked, never truncated)
  responses.py    OpenAI response and stream-chunk shapes for chat and text completions
  streaming.py    client disconnects: cancel work nobody will read; SSE that always closes its source
  openai_routes.py  POST /v1/chat/completions and /v1/completions
  daemon.py       serve(): token file, engine, socket, uvicorn, daemon.json
"""
