"""Load a Llama-family checkpoint (GGUF or a Hugging Face directory) into one config + state dict.

Both formats end up in the Hugging Face layout (rotate-half RoPE, `model.layers.N...` names are
not kept: we use short names of our own), so model.py has one code path whatever the source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lingcode.engine.local.quantized import Q4Weight, q4_from_blocks, q8_from_blocks
from lingcode.text.tokenizer import Tokenizer, load_hf_tokenizer_config


@dataclass(frozen=True)
class ModelConfig:
    n_layers: int
    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    context_length: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tied_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


@dataclass(frozen=True)
class GgufTensor:
    """Where a tensor's blocks are in a GGUF file, for code that reads them as stored (cpu_step.py)."""

    type: int  # ggml's type id (GGMLQuantizationType): 2 Q4_0, 3 Q4_1, 8 Q8_0, ...
    rows: int
    cols: int
    offset: int  # of its data, from the file's start


@dataclass
class Checkpoint:
    name: str
    config: ModelConfig
    weights: dict[str, torch.Tensor]  # float32, our names (see model.py)
    tokenizer: Tokenizer
    chat_template: str | None
    bos_token: str | None
    eos_token_ids: tuple[int, ...]
    eos_token: str | None
    # GGUF Q4_1 / Q8_0 weights as stored, each as a sum of 4-bit parts (quantized.py); "output": the head
    q4: dict[str, list[Q4Weight]] = field(default_factory=dict)
    gguf_path: Path | None = None
    gguf_tensors: dict[str, GgufTensor] = field(default_factory=dict)  # our names, as in weights


def load_checkpoint(path: Path) -> Checkpoint:
    path = Path(path)
    return _load_hf_dir(path) if path.is_dir() else _load_gguf(path)


# --- GGUF -----------------------------------------------------------------------------------

_GGUF_NAMES = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "wq",
    "attn_k.weight": "wk",
    "attn_v.weight": "wv",
    "attn_output.weight": "wo",
    "ffn_norm.weight": "ffn_norm",
    "ffn_gate.weight": "w_gate",
    "ffn_up.weight": "w_up",
    "ffn_down.weight": "w_down",
}


_END_TOKENS = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|end_of_text|>", "<|role_end|>"}


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (interleaved-pair RoPE -> rotate-half RoPE)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, -1).transpose(1, 2).reshape(rows, -1)


def _unpermute_order(rows: int, n_heads: int) -> torch.Tensor:
    """The row order _unpermute produces, to apply the same permutation to quantized rows."""
    return _unpermute(torch.arange(rows)[:, None], n_heads)[:, 0]


def _gguf_field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _load_gguf(path: Path) -> Checkpoint:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    arch = _gguf_field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path.name}: architecture {arch!r} is not supported by the local engine (llama only)")

    def meta(key, default=None):
        return _gguf_field(reader, f"{arch}.{key}", default)

    tokens = _gguf_field(reader, "tokenizer.ggml.tokens")
    n_heads = meta("attention.head_count")
    config = ModelConfig(
        n_layers=meta("block_count"),
        dim=meta("embedding_length"),
        ffn_dim=meta("feed_forward_length"),
        n_heads=n_heads,
        n_kv_heads=meta("attention.head_count_kv", n_heads),
        vocab_size=meta("vocab_size", len(tokens)),
        context_length=meta("context_length"),
        rope_theta=float(meta("rope.freq_base", 10000.0)),
        norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        tied_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
    )

    weights: dict[str, torch.Tensor] = {}
    q4: dict[str, list[Q4Weight]] = {}
    stored: dict[str, GgufTensor] = {}
    head = "output.weight" if any(t.name == "output.weight" for t in reader.tensors) else "token_embd.weight"
    for t in reader.tensors:
        # GGUF shapes are reversed (fastest dim first); dequantize returns the numpy (row-major) shape.
        array = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)  # a writable copy
        tensor = torch.from_numpy(array).reshape(*reversed([int(d) for d in t.shape]))
        name = t.name
        key = {"token_embd.weight": "tok_embeddings", "output_norm.weight": "norm", "output.weight": "output"}.get(name)
        if name.startswith("blk.") and name.split(".", 2)[2] in _GGUF_NAMES:
            key = f"layers.{name.split('.')[1]}.{_GGUF_NAMES[name.split('.', 2)[2]]}"
        if key is not None and tensor.dim() <= 2:
            rows, cols = (1, *tensor.shape) if tensor.dim() == 1 else tensor.shape
            stored[key] = GgufTensor(int(t.tensor_type), rows, cols, int(t.data_offset))
        if name == head and t.tensor_type.name in ("Q4_1", "Q8_0"):
            parse = q4_from_blocks if t.tensor_type.name == "Q4_1" else q8_from_blocks
            q4["output"] = [parse(t.data, *tensor.shape)] if parse is q4_from_blocks else parse(t.data, *tensor.shape)
        if name == "token_embd.weight":
            weights["tok_embeddings"] = tensor
        elif name == "output_norm.weight":
            weights["norm"] = tensor
        elif name == "output.weight":
            weights["output"] = tensor
        elif name.startswith("blk."):
            _, layer, rest = name.split(".", 2)
            if rest not in _GGUF_NAMES:
                continue  # e.g. rope_freqs: not used by Llama-2-style RoPE
            key = f"layers.{layer}.{_GGUF_NAMES[rest]}"
            if t.tensor_type.name == "Q4_1" and tensor.dim() == 2:
                q4[key] = [q4_from_blocks(t.data, *tensor.shape)]
            heads = {"attn_q.weight": config.n_heads, "attn_k.weight": config.n_kv_heads}.get(rest)
            if heads is not None:
                tensor = _unpermute(tensor, heads)
                if key in q4:
                    q4[key] = [q4[key][0].permute_rows(_unpermute_order(tensor.shape[0], heads))]
            weights[key] = tensor

    fields = {
        key: _gguf_field(reader, key)
        for key in reader.fields
        if key.startswith("tokenizer.ggml.")
    }
    tokenizer = Tokenizer.from_gguf_fields(fields)
    bos_id = fields.get("tokenizer.ggml.bos_token_id")
    eos_id = fields.get("tokenizer.ggml.eos_token_id")
    eos_ids = [i for i in (eos_id, fields.get("tokenizer.ggml.eot_token_id")) if i is not None]
    # As llama.cpp does: well-known end-of-generation control tokens end a generation too.
    types = fields.get("tokenizer.ggml.token_type") or []
    eos_ids += [i for i, tok in enumerate(tokens) if tok in _END_TOKENS and i < len(types) and types[i] == 3]
    name = _gguf_field(reader, "general.name") or path.stem
    return Checkpoint(
        name=str(name),
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        chat_template=_gguf_field(reader, "tokenizer.chat_template"),
        bos_token=tokens[bos_id] if bos_id is not None else None,
        eos_token_ids=tuple(dict.fromkeys(eos_ids)),
        eos_token=tokens[eos_id] if eos_id is not None else None,
        q4=q4,
        gguf_path=path,
        gguf_tensors=stored,
    )


# --- Hugging Face directory ---------------------------------------------------------------------

_HF_NAMES = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo",
    "post_attention_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "w_gate",
    "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
}


def _load_hf_dir(path: Path) -> Checkpoint:
    from safetensors.torch import load_file

    hf = json.loads((path / "config.json").read_text())
    archs = hf.get("architectures") or []
    if hf.get("model_type") not in ("llama", "mistral", "qwen2") and "LlamaForCausalLM" not in archs:
        raise ValueError(f"{path}: model_type {hf.get('model_type')!r} is not supported (Llama family only)")
    if hf.get("attention_bias") or hf.get("model_type") == "qwen2":
        raise ValueError(f"{path}: attention biases are not supported by the local engine")
    n_heads = hf["num_attention_heads"]
    config = ModelConfig(
        n_layers=hf["num_hidden_layers"],
        dim=hf["hidden_size"],
        ffn_dim=hf["intermediate_size"],
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads", n_heads),
        vocab_size=hf["vocab_size"],
        context_length=hf.get("max_position_embeddings", 4096),
        rope_theta=float(hf.get("rope_theta", 10000.0)),
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )
    if hf.get("rope_scaling"):
        raise ValueError(f"{path}: rope_scaling is not supported by the local engine")

    weights: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        for name, tensor in load_file(str(file)).items():
            tensor = tensor.to(torch.float32)
            if name == "model.embed_tokens.weight":
                weights["tok_embeddings"] = tensor
            elif name == "model.norm.weight":
                weights["norm"] = tensor
            elif name == "lm_head.weight":
                weights["output"] = tensor
            elif name.startswith("model.layers."):
                _, _, layer, rest = name.split(".", 3)
                if rest in _HF_NAMES:
                    weights[f"layers.{layer}.{_HF_NAMES[rest]}"] = tensor
    if not weights:
        raise ValueError(f"{path}: no *.safetensors weights found")
    if "output" not in weights:
        config = ModelConfig(**{**config.__dict__, "tied_embeddings": True})

    tokenizer = Tokenizer.from_file(path / "tokenizer.json")
    tok_config = load_hf_tokenizer_config(path)

    def token_text(value):
        return value.get("content") if isinstance(value, dict) else value

    eos_token = token_text(tok_config.get("eos_token"))
    eos_ids = hf.get("eos_token_id")
    eos_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids or [])
    if eos_token is not None and tokenizer.token_to_id(eos_token) is not None:
        eos_ids.append(tokenizer.token_to_id(eos_token))
    return Checkpoint(
        name=path.name,
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        chat_template=tok_config.get("chat_template"),
        bos_token=token_text(tok_config.get("bos_token")),
        eos_token_ids=tuple(dict.fromkeys(eos_ids)),
        eos_token=eos_token,
    )
