"""What lingcode needs from the model directory SGLang serves: tokenizer, chat template, eos ids.

SGLang takes token ids in and gives token ids out; templating, detokenization and tool parsing
stay in lingcode core, so they behave the same on every engine. They need the model's own
tokenizer.json and chat template, read here from the directory (never fetched from a hub).
"""

from __future__ import annotations

import json
from pathlib import Path

from lingcode.engine import ModelInfo
from lingcode.text.tokenizer import Tokenizer, load_hf_tokenizer_config

REQUIRED = ("config.json", "tokenizer.json")
DEFAULT_CONTEXT = 131072  # Ling-3.0-flash's native context, when nothing says otherwise


def missing_files(model_dir: Path) -> list[str]:
    return [name for name in REQUIRED if not (model_dir / name).is_file()]


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _ids(value) -> list[int]:
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value or []]


def load_model_info(
    model_dir: Path, *, name: str | None = None, context_length: int | None = None, extra: dict | None = None
) -> ModelInfo:
    """ModelInfo from a Hugging Face-format directory. `context_length` is the server's (it may
    be shorter than the checkpoint's when SGLang was started with --context-length)."""
    config = json.loads((model_dir / "config.json").read_text())
    text_config = config.get("text_config") or config
    tokenizer = Tokenizer.from_file(model_dir / "tokenizer.json")
    tok_config = load_hf_tokenizer_config(model_dir)
    generation = model_dir / "generation_config.json"
    gen_config = json.loads(generation.read_text()) if generation.is_file() else {}
    eos_token = _token_text(tok_config.get("eos_token"))
    eos_ids = _ids(config.get("eos_token_id")) + _ids(gen_config.get("eos_token_id"))
    if eos_token is not None and tokenizer.token_to_id(eos_token) is not None:
        eos_ids.append(tokenizer.token_to_id(eos_token))
    return ModelInfo(
        name=name or model_dir.name,
        context_length=int(context_length or text_config.get("max_position_embeddings") or DEFAULT_CONTEXT),
        eos_token_ids=tuple(dict.fromkeys(eos_ids)),
        tokenizer=tokenizer,
        chat_template=tok_config.get("chat_template"),
        bos_token=_token_text(tok_config.get("bos_token")),
        eos_token=eos_token,
        extra=dict(extra or {}),
    )
