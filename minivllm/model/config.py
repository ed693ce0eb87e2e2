"""The shape of a Llama-architecture model, read from GGUF metadata or a HF config.json, and
the checks an engine config makes against it. Torch-free: the API server process imports it."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from minivllm.model.paths import is_gguf

QUANTIZATION = (None, "gguf", "none")  # None and "gguf": a GGUF's own blocks; "none": float32


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position: int = 2048
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads}) for grouped-query attention")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def num_params(self) -> int:
        """Weights read by one decode step (norms included, the tied head counted once)."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * h
        layer = attn + 3 * h * i + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.num_layers * layer + self.vocab_size * h + head + h

    @classmethod
    def from_gguf(cls, md: dict[str, Any]) -> "ModelConfig":
        arch = md["general.architecture"]
        if arch != "llama":
            raise ValueError(f"only the llama architecture is supported, the GGUF says {arch!r}")
        a = f"{arch}."
        hidden, heads = md[a + "embedding_length"], md[a + "attention.head_count"]
        vocab = md.get(a + "vocab_size") or len(md["tokenizer.ggml.tokens"])
        return cls(
            vocab_size=vocab, hidden_size=hidden,
            intermediate_size=md[a + "feed_forward_length"], num_layers=md[a + "block_count"],
            num_heads=heads, num_kv_heads=md.get(a + "attention.head_count_kv", heads),
            head_dim=md.get(a + "rope.dimension_count", hidden // heads),
            rms_norm_eps=md.get(a + "attention.layer_norm_rms_epsilon", 1e-5),
            rope_theta=md.get(a + "rope.freq_base", 10000.0),
            max_position=md.get(a + "context_length", 2048),
            tie_word_embeddings=True,  # corrected by the loader when output.weight exists
            bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=md.get("tokenizer.ggml.eos_token_id"))

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ModelConfig":
        if cfg.get("model_type", "llama") != "llama":
            raise ValueError(f"only model_type 'llama' is supported, got {cfg.get('model_type')!r}")
        if cfg.get("rope_scaling"):
            raise ValueError("rope_scaling is not supported; use a checkpoint without it")
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        rope = cfg.get("rope_parameters") or {}
        return cls(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
            num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=cfg.get("rope_theta", rope.get("rope_theta", 10000.0)),
            max_position=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos[0] if isinstance(eos, list) else eos)

    def to_hf(self) -> dict[str, Any]:
        """A config.json that transformers' LlamaConfig reads back."""
        d = asdict(self)
        return {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                "vocab_size": d["vocab_size"], "hidden_size": d["hidden_size"],
                "intermediate_size": d["intermediate_size"],
                "num_hidden_layers": d["num_layers"], "num_attention_heads": d["num_heads"],
                "num_key_value_heads": d["num_kv_heads"], "head_dim": d["head_dim"],
                "rms_norm_eps": d["rms_norm_eps"], "rope_theta": d["rope_theta"],
                "max_position_embeddings": d["max_position"], "hidden_act": "silu",
                "tie_word_embeddings": d["tie_word_embeddings"],
                "bos_token_id": d["bos_token_id"], "eos_token_id": d["eos_token_id"]}


def load_config(path: str) -> ModelConfig:
    if is_gguf(path):
        from minivllm.model.gguf_file import GGUFFile
        with GGUFFile(path) as f:
            config = ModelConfig.from_gguf(f.metadata)
            return dataclasses.replace(config, tie_word_embeddings="output.weight" not in f.tensors)
    with open(hf_file(path, "config.json")) as f:
        return ModelConfig.from_hf(json.load(f))


def hf_file(path: str, name: str) -> str:
    file = os.path.join(path, name)
    if not os.path.exists(file):
        raise FileNotFoundError(f"{file} not found: --model must be a .gguf file or a Hugging Face "
                                f"directory with config.json, *.safetensors and tokenizer.json")
    return file


def check_quantization(quantization: str | None) -> None:
    if quantization not in QUANTIZATION:
        raise ValueError(f"quantization={quantization!r}: use gguf (a GGUF's own blocks, the "
                         f"default) or none (dequantized to float32 at load)")


def kv_bytes_per_token(config: ModelConfig, itemsize: int) -> int:
    """A token's keys and values in every layer, all ranks together (each holds 1 / N of it)."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize


def check_tensor_parallel_size(config: ModelConfig, size: int) -> None:
    """Each rank must hold whole query heads, whole KV heads and an equal slice of the MLP
    (vLLM would replicate KV heads past their count; minivllm does not)."""
    dims = {"num_heads": config.num_heads, "num_kv_heads": config.num_kv_heads,
            "intermediate_size": config.intermediate_size}
    if size >= 1 and all(d % size == 0 for d in dims.values()):
        return
    works = [k for k in range(1, config.num_kv_heads + 1) if all(d % k == 0 for d in dims.values())]
    shape = ", ".join(f"{k} {v}" for k, v in dims.items())
    raise ValueError(f"tensor_parallel_size={size} does not split this model ({shape}): each rank "
                     f"needs whole heads, whole KV heads and an equal MLP slice, so the size must "
                     f"divide all three. Sizes that work: {', '.join(map(str, works))}")
