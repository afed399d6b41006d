"""Load a Llama-family checkpoint (GGUF or a Hugging Face directory) into one config + state dict.

Both formats end up in the Hugging Face layout (rotate-half RoPE, `model.layers.N...` names are
not kept: we use short names of our own), so model.py has one code path whatever the source.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lingcode.engine.local.quantized import Q4Weight, q4_from_blocks, q8_from_blocks
from lingcode.text.tokenizer import Tokenizer, load_hf_tokenizer_config


# --- architectures ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Architecture:
    """What a model family's layers have beyond Llama's: the one place the engine's backends
    (model.py, cpu_step, triton_step) learn how an architecture differs."""

    qkv_bias: bool = False  # Q, K and V projections add a bias
    qk_norm: bool = False  # an RMSNorm (per head, head_dim weights) on Q and K before RoPE
    # GGUF stores Q/K rows for interleaved-pair RoPE (llama.cpp's converter permutes Llama's);
    # others are stored as trained, for rotate-half (NeoX) RoPE, which is what every backend runs
    gguf_rope_interleaved: bool = False


ARCHITECTURES = {
    "llama": Architecture(gguf_rope_interleaved=True),
    "qwen2": Architecture(qkv_bias=True),
    "qwen3": Architecture(qk_norm=True),
}
# Hugging Face config.json model_type -> our architecture
_HF_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


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
    arch: str = "llama"
    head_dim: int = 0  # 0: dim / n_heads (Qwen3 sets its own)

    def __post_init__(self):
        if self.arch not in ARCHITECTURES:
            raise ValueError(
                f"architecture {self.arch!r} is not one the local engine loads ({', '.join(ARCHITECTURES)})"
            )
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)

    @property
    def architecture(self) -> Architecture:
        return ARCHITECTURES[self.arch]


@dataclass(frozen=True)
class GgufTensor:
    """Where a tensor's blocks are in a GGUF file, for code that reads them as stored (cpu_step.py)."""

    type: int  # ggml's type id (GGMLQuantizationType): 2 Q4_0, 3 Q4_1, 8 Q8_0, 12 Q4_K, ...
    rows: int
    cols: int
    offset: int  # of its data, from the file's start


@dataclass
class Checkpoint:
    name: str
    config: ModelConfig
    weights: Mapping[str, torch.Tensor]  # float32, our names (see model.py); a GGUF's are read when asked for
    tokenizer: Tokenizer
    chat_template: str | None
    bos_token: str | None
    eos_token_ids: tuple[int, ...]
    eos_token: str | None
    # GGUF Q4_1 / Q8_0 weights as stored, each as a sum of 4-bit parts (quantized.py); "output": the head
    q4: Mapping[str, list[Q4Weight]] = field(default_factory=dict)
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
    "attn_q.bias": "bq",
    "attn_k.bias": "bk",
    "attn_v.bias": "bv",
    "attn_q_norm.weight": "q_norm",
    "attn_k_norm.weight": "k_norm",
    "attn_output.weight": "wo",
    "ffn_norm.weight": "ffn_norm",
    "ffn_gate.weight": "w_gate",
    "ffn_up.weight": "w_up",
    "ffn_down.weight": "w_down",
}
_GGUF_TOP = {"token_embd.weight": "tok_embeddings", "output_norm.weight": "norm", "output.weight": "output"}


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


def _our_name(gguf_name: str) -> str | None:
    if gguf_name in _GGUF_TOP:
        return _GGUF_TOP[gguf_name]
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        if rest in _GGUF_NAMES:
            return f"layers.{layer}.{_GGUF_NAMES[rest]}"
    return None  # e.g. rope_freqs: not used by Llama-2-style RoPE


class _GgufWeights(Mapping):
    """A GGUF's tensors by our names, each dequantized to f32 (and its rows put in rotate-half order)
    when asked for. The native CPU step reads the file's blocks itself and never asks for a matrix,
    so loading a model for it makes no dense copy (6 GB of f32 for a 1.5B model)."""

    def __init__(self, tensors: dict, config: ModelConfig):
        self._tensors, self._config = tensors, config

    def __getitem__(self, key: str) -> torch.Tensor:
        from gguf.quants import dequantize

        t = self._tensors[key]
        # GGUF shapes are reversed (fastest dim first); dequantize returns the numpy (row-major) shape.
        array = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)  # a writable copy
        tensor = torch.from_numpy(array).reshape(*reversed([int(d) for d in t.shape]))
        heads = _rope_rows(key, self._config)
        return tensor if heads is None else _unpermute(tensor, heads)

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def _rope_rows(key: str, config: ModelConfig) -> int | None:
    """The head count whose rows llama.cpp permuted in this tensor, or None."""
    if not config.architecture.gguf_rope_interleaved:
        return None
    return {"wq": config.n_heads, "bq": config.n_heads, "wk": config.n_kv_heads, "bk": config.n_kv_heads}.get(
        key.rsplit(".", 1)[-1]
    )


class _GgufQ4(Mapping):
    """The Q4_1 layer matrices and the Q4_1 / Q8_0 head as 4-bit parts (quantized.py), for the
    torch CPU step's int4 kernel; parsed when asked for."""

    def __init__(self, tensors: dict, config: ModelConfig, head: str):
        self._config, self._head = config, head
        self._tensors = {
            k: t
            for k, t in tensors.items()
            if t.tensor_type.name == "Q4_1" and len(t.shape) == 2 and k.startswith("layers.")
        }
        if head in tensors and tensors[head].tensor_type.name in ("Q4_1", "Q8_0"):
            self._tensors["output"] = tensors[head]

    def __getitem__(self, key: str) -> list[Q4Weight]:
        t = self._tensors[key]
        cols, rows = (int(d) for d in t.shape)
        if t.tensor_type.name == "Q8_0":
            return q8_from_blocks(t.data, rows, cols)
        part = q4_from_blocks(t.data, rows, cols)
        heads = _rope_rows(key, self._config)
        return [part if heads is None else part.permute_rows(_unpermute_order(rows, heads))]

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def _load_gguf(path: Path) -> Checkpoint:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    arch = _gguf_field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"{path.name}: architecture {arch!r} is not supported by the local engine ({', '.join(ARCHITECTURES)})"
        )

    def meta(key, default=None):
        return _gguf_field(reader, f"{arch}.{key}", default)

    tokens = _gguf_field(reader, "tokenizer.ggml.tokens")
    n_heads = meta("attention.head_count")
    names = {t.name for t in reader.tensors}
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
        tied_embeddings="output.weight" not in names,
        arch=arch,
        head_dim=meta("attention.key_length", 0),
    )
    if (
        meta("rope.scaling.type", "none") not in ("none", None)
        or meta("rope.dimension_count", config.head_dim) != config.head_dim
    ):
        raise ValueError(f"{path.name}: RoPE scaling or partial RoPE is not supported by the local engine")

    tensors = {key: t for t in reader.tensors if (key := _our_name(t.name)) is not None}
    stored = {}
    for key, t in tensors.items():
        shape = [int(d) for d in t.shape]
        if len(shape) <= 2:
            cols, rows = (shape + [1])[:2]
            stored[key] = GgufTensor(int(t.tensor_type), rows, cols, int(t.data_offset))
    _check_tensors(path, config, tensors)
    head = "output" if "output" in tensors else "tok_embeddings"

    fields = {key: _gguf_field(reader, key) for key in reader.fields if key.startswith("tokenizer.ggml.")}
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
        weights=_GgufWeights(tensors, config),
        tokenizer=tokenizer,
        chat_template=_gguf_field(reader, "tokenizer.chat_template"),
        bos_token=tokens[bos_id] if bos_id is not None else None,
        eos_token_ids=tuple(dict.fromkeys(eos_ids)),
        eos_token=tokens[eos_id] if eos_id is not None else None,
        q4=_GgufQ4(tensors, config, head),
        gguf_path=path,
        gguf_tensors=stored,
    )


def _check_tensors(path: Path, config: ModelConfig, tensors: dict) -> None:
    """Every tensor the architecture needs is in the file, with the shape the config implies."""
    cfg, arch = config, config.architecture
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes = {
        "attn_norm": [cfg.dim],
        "ffn_norm": [cfg.dim],
        "wq": [q, cfg.dim],
        "wk": [kv, cfg.dim],
        "wv": [kv, cfg.dim],
        "wo": [cfg.dim, q],
        "w_gate": [cfg.ffn_dim, cfg.dim],
        "w_up": [cfg.ffn_dim, cfg.dim],
        "w_down": [cfg.dim, cfg.ffn_dim],
    }
    if arch.qkv_bias:
        shapes.update(bq=[q], bk=[kv], bv=[kv])
    if arch.qk_norm:
        shapes.update(q_norm=[cfg.head_dim], k_norm=[cfg.head_dim])
    expected = {"tok_embeddings": [cfg.vocab_size, cfg.dim], "norm": [cfg.dim]}
    if not cfg.tied_embeddings:
        expected["output"] = [cfg.vocab_size, cfg.dim]
    expected.update({f"layers.{i}.{n}": s for i in range(cfg.n_layers) for n, s in shapes.items()})
    for key, shape in expected.items():
        if key not in tensors:
            raise ValueError(f"{path.name}: no tensor for {key} ({cfg.arch} needs it)")
        got = list(reversed([int(d) for d in tensors[key].shape]))
        if got != shape:
            raise ValueError(f"{path.name}: {key} has shape {got}, expected {shape}")


# --- Hugging Face directory ---------------------------------------------------------------------

_HF_NAMES = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv",
    "self_attn.q_proj.bias": "bq",
    "self_attn.k_proj.bias": "bk",
    "self_attn.v_proj.bias": "bv",
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
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
    arch = _HF_ARCHITECTURES.get(hf.get("model_type"), "llama" if "LlamaForCausalLM" in archs else None)
    if arch is None:
        raise ValueError(
            f"{path}: model_type {hf.get('model_type')!r} is not supported ({', '.join(_HF_ARCHITECTURES)})"
        )
    if bool(hf.get("attention_bias", arch == "qwen2")) != ARCHITECTURES[arch].qkv_bias:
        raise ValueError(f"{path}: attention biases are not supported for {arch} by the local engine")
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
        arch=arch,
        head_dim=hf.get("head_dim") or 0,
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
