"""Find a model and read its config and weights: a GGUF file or a Hugging Face directory.

Both paths end in the same thing: a `ModelConfig` and a dict of float32 tensors named and
shaped as in Hugging Face's LlamaForCausalLM ((out, in) matrices, q/k rows in the
`rotate_half` RoPE layout). `LlamaModel` takes it from there, so both go through one model.
A GGUF's matrices in Q4_0, Q4_1 or Q8_0 stay in their blocks (quant_linear.QuantWeight, whose
.float() dequantizes): by default (None) and with quantization="gguf". quantization="none" (the
`-q none` flag) dequantizes them to float32 at load instead, the path before the block kernels.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import torch

from minivllm.model.config import ModelConfig, check_quantization
from minivllm.model.config import load_config  # noqa: F401 (re-exported)
from minivllm.model.gguf_file import GGUFFile
from minivllm.model.paths import default_model_path, is_gguf  # noqa: F401 (re-exported)
from minivllm.model.quant_linear import QUANT_TYPES, QuantWeight, from_gguf_bytes

_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                   "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def load_weights(path: str, config: ModelConfig, quantization: str | None = None
                 ) -> dict[str, torch.Tensor | QuantWeight]:
    """Tensors with Hugging Face names, from a GGUF file or a safetensors directory: float32,
    except a GGUF's quantized matrices, kept in their blocks unless quantization="none"."""
    check_quantization(quantization)
    if is_gguf(path):
        return _gguf_weights(path, config, keep_blocks=quantization != "none")
    from safetensors.torch import load_file
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}: pass a HF model directory or a .gguf")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update({k: v.float() for k, v in load_file(file).items()})
    return weights


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's converter, which reorders each head's q/k rows from the halves layout
    (rotate_half pairs i and i + d/2) into interleaved pairs (2i, 2i + 1)."""
    out_dim = w.shape[0]
    return (w.reshape(n_heads, out_dim // n_heads // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _gguf_weights(path: str, config: ModelConfig,
                  keep_blocks: bool) -> dict[str, torch.Tensor | QuantWeight]:
    weights: dict[str, torch.Tensor | QuantWeight] = {}
    with GGUFFile(path) as f:
        for name, info in f.tensors.items():
            blocks = keep_blocks and len(info.shape) == 2 and info.qtype in QUANT_TYPES
            array = f.raw(name).reshape(info.shape[0], -1) if blocks else f.tensor(name)
            hf_name = _hf_name(name)
            if hf_name.endswith("q_proj.weight"):  # whole rows: the same on blocks
                array = unpermute_rope_rows(array, config.num_heads)
            elif hf_name.endswith("k_proj.weight"):
                array = unpermute_rope_rows(array, config.num_kv_heads)
            weights[hf_name] = (from_gguf_bytes(array, info.qtype, info.shape) if blocks else
                                torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)))
    return weights


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GGUF_TOP_NAMES:
        return _GGUF_TOP_NAMES[gguf_name]
    _, layer, kind, suffix = gguf_name.split(".")
    if kind not in _GGUF_LAYER_NAMES:
        raise ValueError(f"unexpected tensor {gguf_name!r} in a llama GGUF")
    return f"model.layers.{layer}.{_GGUF_LAYER_NAMES[kind]}.{suffix}"


