"""Chat templates: the model's own Jinja template, rendered the way Hugging Face renders it."""

from __future__ import annotations

from functools import lru_cache

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(ValueError):
    """The messages cannot be rendered by this model's template (bad roles, missing template, ...)."""


def _raise_exception(message: str):
    raise TemplateError(message)


def _tojson(value, indent=None, ensure_ascii=False, separators=None, sort_keys=False):
    import json

    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)


class _Sandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, its verdict on an attribute remembered per type and name.

    The verdict depends on nothing else (jinja2.sandbox: the name, and isinstance checks of the
    object), and making it for every `loop.first` of every message took two thirds of a long chat's
    render. A name is asked about only once the attribute exists, so the table stays small.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._verdicts: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(self, obj, attr: str, value) -> bool:
        key = (type(obj), attr)
        safe = self._verdicts.get(key)
        if safe is None:
            safe = super().is_safe_attribute(obj, attr, value)
            if len(self._verdicts) < 4096:
                self._verdicts[key] = safe
        return safe


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    # A sandbox: templates come with model files, which are data, not code we trust.
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template)


def compile_template(template: str | None) -> None:
    """Compile a template before its first render, which would otherwise pay for it (the daemon's
    first request). One that does not compile is left for each render to report."""
    if template:
        try:
            _compile(template)
        except jinja2.TemplateError:
            pass


def render_chat(
    template: str | None,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    bos_token: str | None = None,
    eos_token: str | None = None,
    tools: list[dict] | None = None,
    **kwargs,
) -> str:
    """Render messages ([{role, content, ...}]) to the prompt text the model was trained on."""
    if not template:
        raise TemplateError("this model has no chat template; use /v1/completions with a plain prompt")
    try:
        return _compile(template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
            tools=tools,
            **kwargs,
        )
    except TemplateError:
        raise
    except jinja2.TemplateError as exc:
        raise TemplateError(f"chat template failed: {exc}") from exc
    except (TypeError, KeyError, AttributeError) as exc:
        raise TemplateError(f"messages do not fit the chat template: {exc}") from exc
