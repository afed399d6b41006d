"""From a validated request to what the engine runs: prompt token ids and sampling params.

The context length is checked here, before anything is queued: a prompt that does not fit, or
a prompt plus max_tokens that does not fit, is a 400 `context_length_exceeded`, worded as the
API's own clients expect (errors.ContextLengthExceeded). Nothing is ever truncated silently.
"""

from __future__ import annotations

from lingcode.text.chat_template import TemplateError
from lingcode.engine import ModelInfo, SamplingParams
from lingcode.text.families import Family, family_for
from lingcode.server.errors import APIError, ContextLengthExceeded, invalid
from lingcode.server.openai_api import CompletionRequest, Message, GenerationRequest
from lingcode.agent.tool_parsers import Tool
from lingcode.agent.tool_prompt import render_prompt


def chat_prompt(info: ModelInfo, messages: list[dict], tools: list[Tool] = (), family: Family | None = None,
                param: str = "messages", template_kwargs: dict | None = None) -> str:  # fmt: skip
    """The model's chat template over the messages (and tools), ending with the assistant's turn."""
    try:
        return render_prompt(info, family or family_for(info), messages, list(tools), template_kwargs=template_kwargs)
    except TemplateError as exc:
        raise invalid(str(exc), param=param) from None


def chat_prompt_ids(info: ModelInfo, messages: list[Message]) -> list[int]:
    """The model's chat template over the messages, ending with the assistant's turn, as token ids."""
    return info.tokenizer.encode(chat_prompt(info, [m.for_template() for m in messages]))


def completion_prompt_ids(info: ModelInfo, body: CompletionRequest) -> list[int]:
    """The prompt as token ids; with `suffix`, wrapped in the model's fill-in-the-middle tokens."""
    if isinstance(body.prompt, list):
        ids = list(body.prompt)
        vocab = info.tokenizer.vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise invalid(f"prompt token ids must be in [0, {vocab})", param="prompt")
    else:
        ids = info.tokenizer.encode(body.prompt)
    if body.suffix is None or (body.suffix == "" and not info.fim_tokens):
        return ids
    if not info.fim_tokens:
        raise APIError(
            400,
            f"suffix: model {info.name!r} has no fill-in-the-middle tokens, so `suffix` is not "
            "supported; send the prompt alone",
            param="suffix",
            code="suffix_not_supported",
        )
    # PSM order: <prefix> prompt <suffix> suffix <middle>, and the model writes the middle.
    encode, fim = info.tokenizer.encode, info.fim_tokens
    return encode(fim["prefix"]) + ids + encode(fim["suffix"]) + encode(body.suffix) + encode(fim["middle"])


def sampling_params(info: ModelInfo, body: GenerationRequest, prompt_tokens: int, what: str) -> SamplingParams:
    """The request's sampling params; max_tokens defaults to what the context has left.

    `what` names the prompt in errors: "messages" (chat) or "prompt" (completions).
    """
    context = info.context_length
    if prompt_tokens >= context:  # the model needs room for at least one new token
        raise ContextLengthExceeded(context, prompt_tokens, what=what)
    max_tokens = body.max_tokens
    if max_tokens is None:
        max_tokens = context - prompt_tokens
    elif prompt_tokens + max_tokens > context:
        raise ContextLengthExceeded(context, prompt_tokens, max_tokens, what=what)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(body.top_k or 0, 0),
        seed=body.seed,
        ignore_eos=body.ignore_eos,
    )
