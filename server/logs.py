"""The daemon's logs: one JSON object per line (or key=value text), each tagged with its request id.

    {"ts": "2026-11-29T15:54:24.123Z", "level": "info", "logger": "lingcode.access", "msg": "POST /v1/chat/completions 200",
     "request_id": "req-5f0c...", "route": "/v1/chat/completions", "status": 200, "duration_ms": 812.4}

The request id and route come from lingcode.pipeline.metrics' context variables, which the HTTP middleware
(server/observability.py) sets for each request, so a line logged anywhere while serving it (the
engine, the scheduler, uvicorn's errors) carries them. Fields passed with `extra=` are kept.
configure() returns the dictConfig that uvicorn is started with: uvicorn's loggers use it too.
"""

from __future__ import annotations

import json
import logging
import logging.config
from datetime import UTC, datetime

from lingcode.pipeline import metrics

# Attributes every LogRecord has; anything else on a record came from `extra=` and is a field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "color_message"}


def _fields(record: logging.LogRecord) -> dict:
    fields = {
        "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    if (request_id := metrics.request_id.get()) is not None:
        fields["request_id"] = request_id
        fields["route"] = metrics.route.get()
    for key, value in vars(record).items():
        if key not in _STANDARD and not key.startswith("_"):
            fields[key] = value
    return fields


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        # ASCII: a raw U+2028 or U+0085 (valid in JSON strings) would split the line for many readers.
        return json.dumps(fields, default=str)


class TextFormatter(logging.Formatter):
    """key=value pairs after the message, for people reading a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
        head = f"{fields.pop('ts')} {fields.pop('level').upper():<7} {fields.pop('logger')}: {fields.pop('msg')}"
        line = " ".join([head, *(f"{k}={json.dumps(v, default=str)}" for k, v in fields.items())])
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


FORMATS = {"json": JSONFormatter, "text": TextFormatter}


def configure(level: str, fmt: str = "json") -> dict:
    """Log config for the daemon (lingcode's and uvicorn's loggers, to stderr); applied, and returned for uvicorn."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: choose one of {', '.join(FORMATS)}")
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"lingcode": {"()": f"{__name__}.{FORMATS[fmt].__name__}"}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "lingcode", "stream": "ext://sys.stderr"}
        },
        "loggers": {
            "lingcode": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": [], "propagate": False},  # lingcode.access replaces it (request ids)
        },
    }
    logging.config.dictConfig(config)
    return config
