"""A tiny random-weight Llama, saved as a Hugging Face directory, for fast tests.

It goes through the same loader and model code as SmolLM2: config.json, model.safetensors,
tokenizer.json (a byte-level BPE trained here on a few sentences) and tokenizer_config.json with
a ChatML template. Weights are scaled so that logits spread over several units: greedy near-ties
are then rare, and a flipped token means a real difference.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

from minivllm.model.config import ModelConfig

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                 "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "A paged KV cache stores keys and values in fixed-size blocks.",
    "Continuous batching lets new requests join a running batch at every step.",
    "héllo wörld, naïve café, 東京, 🤗 emoji and numbers 12345.",
] * 20


def tiny_tokenizer(vocab_size: int = 384) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def tiny_config(vocab_size: int, eos_token_id: int, num_kv_heads: int = 3) -> ModelConfig:
    # 6 heads, 3 KV heads and an MLP of 192: tensor parallelism can split it 3 ways (with
    # num_kv_heads=2, 2 ways)
    return ModelConfig(vocab_size=vocab_size, hidden_size=96, intermediate_size=192,
                       num_layers=2, num_heads=6, num_kv_heads=num_kv_heads, head_dim=16,
                       rms_norm_eps=1e-5, rope_theta=10000.0, max_position=1024,
                       tie_word_embeddings=True, bos_token_id=1, eos_token_id=eos_token_id)


def tiny_weights(config: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def mat(out_dim: int, in_dim: int) -> torch.Tensor:
        return torch.randn(out_dim, in_dim, generator=g) / in_dim ** 0.5

    def norm(dim: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(dim, generator=g)

    c, d = config, config.head_dim
    w = {"model.embed_tokens.weight": torch.randn(c.vocab_size, c.hidden_size, generator=g),
         "model.norm.weight": norm(c.hidden_size)}
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(c.hidden_size)
        w[p + "post_attention_layernorm.weight"] = norm(c.hidden_size)
        w[p + "self_attn.q_proj.weight"] = mat(c.num_heads * d, c.hidden_size)
        w[p + "self_attn.k_proj.weight"] = mat(c.num_kv_heads * d, c.hidden_size)
        w[p + "self_attn.v_proj.weight"] = mat(c.num_kv_heads * d, c.hidden_size)
        w[p + "self_attn.o_proj.weight"] = mat(c.hidden_size, c.num_heads * d)
        w[p + "mlp.gate_proj.weight"] = mat(c.intermediate_size, c.hidden_size)
        w[p + "mlp.up_proj.weight"] = mat(c.intermediate_size, c.hidden_size)
        w[p + "mlp.down_proj.weight"] = mat(c.hidden_size, c.intermediate_size)
    return w


def make_tiny_model_dir(path: str, seed: int = 0, num_kv_heads: int = 3) -> str:
    """Write the tiny model as a HF directory at `path` and return the path."""
    os.makedirs(path, exist_ok=True)
    tok = tiny_tokenizer()
    config = tiny_config(tok.get_vocab_size(), tok.token_to_id("<|im_end|>"), num_kv_heads)
    save_file(tiny_weights(config, seed), os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config.to_hf(), f, indent=2)
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": CHAT_TEMPLATE, "bos_token": "<|im_start|>",
                   "eos_token": "<|im_end|>"}, f)
    return path


def first_divergence(reference: list[int], candidate: list[int]) -> int | None:
    """The first position where two token lists differ, or None."""
    for i, (a, b) in enumerate(zip(reference, candidate)):
        if a != b:
            return i
    return None if len(reference) == len(candidate) else min(len(reference), len(candidate))


def assert_greedy_match(reference: list[int], candidate: list[int], ref_logits: "torch.Tensor",
                        eps: float, what: str) -> None:
    """the near-tie rule. Tokens must agree up to the first position where they differ;
    there, the reference's top-2 margin must be below `eps` and the candidate's token must be
    within `eps` of the reference's best logit: a flip between near-equal tokens, which any
    change in summation order may cause. Later tokens follow different contexts and are not
    compared. ref_logits: (len(reference), vocab), the logits that chose each reference token."""
    i = first_divergence(reference, candidate)
    if i is None:
        return
    assert i < len(candidate) and i < len(reference), f"{what}: lengths differ at {i}"
    top2 = ref_logits[i].topk(2).values
    margin = float(top2[0] - top2[1])
    gap = float(top2[0] - ref_logits[i, candidate[i]])
    assert margin < eps and gap < eps, (
        f"{what}: token {i} differs ({reference[i]} vs {candidate[i]}) but the reference's "
        f"top-2 margin there is {margin:.4g} and the candidate's token is {gap:.4g} below the "
        f"best, not a near-tie (eps {eps})")
