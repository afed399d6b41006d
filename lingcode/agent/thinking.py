"""Per-request thinking switches, as SGLang 0.5.23's server takes them, turned into chat-template variables.

Every API has its own switch; each becomes variables of the model's chat template, and the
template decides what the prompt says. Ling-3.0's reads `enable_thinking` (or its own
`thinking_option`, "on" / "off"; thinking is on by default): on, the generation prompt opens
`<think>`; off, it writes `<think></think>`. Whether the output starts inside the reasoning is
then read from the rendered prompt (lingcode.pipeline.turns.starts_in_reasoning), so a switch
the template ignores is never believed over the prompt. With thinking off the output starts as
the answer, so it yields reasoning only if the model writes a `<think>` block of its own anyway
(given apart, as SGLang does).

    OpenAI chat   chat_template_kwargs (template variables, passed as they are), reasoning_effort
    Anthropic     thinking {"type": "enabled" | "adaptive" | "disabled", ...}: enable_thinking
                  (budget_tokens is accepted and not enforced, as in SGLang)
    Responses     reasoning {"effort"}, chat_template_kwargs

An effort is passed on as `reasoning_effort`, for templates that read it; "none" also turns
thinking off (Ling-3.0's template has no effort levels: SGLang would render it thinking anyway).
chat_template_kwargs, the most explicit, win over what the other switches set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Variables lingcode's renderer sets itself (lingcode.text.chat_template.render_chat).
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception"})


def check_template_kwargs(kwargs: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A request's chat_template_kwargs, or ValueError saying what is wrong with them."""
    for name in kwargs or {}:
        if name in RESERVED:
            raise ValueError(f"{name!r} is set by the server and cannot be a chat template variable")
    if kwargs and "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
        raise ValueError("enable_thinking must be true or false")
    return kwargs


@dataclass(frozen=True)
class Thinking:
    enabled: bool | None = None  # None: the template's default
    effort: str | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def anthropic(cls, kind: str | None) -> Thinking:
        """From Anthropic's thinking.type: "adaptive" is thinking on, as in SGLang."""
        return cls(None if kind is None else kind != "disabled")

    def template_variables(self) -> dict[str, Any]:
        variables: dict[str, Any] = {}
        if self.effort is not None:
            variables["reasoning_effort"] = self.effort
        enabled = False if self.enabled is None and self.effort == "none" else self.enabled
        if enabled is not None:
            variables["enable_thinking"] = enabled
        return variables | dict(self.template_kwargs)
