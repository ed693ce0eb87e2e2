"""The tokenizer and the chat template, from GGUF metadata or a Hugging Face directory.

GGUF keeps a gpt2-style tokenizer as arrays (`tokenizer.ggml.tokens`, `.merges`,
`.token_type`); we rebuild the byte-level BPE with the `tokenizers` library. The `smollm`
pre-tokenizer is GPT-2's regex after splitting every digit on its own, as in SmolLM2's
tokenizer.json. The chat template is a Jinja string, rendered in a sandbox the way
transformers does.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

from minivllm.model.gguf_file import GGUFFile
from minivllm.model.paths import is_gguf

TOKEN_TYPE_CONTROL = 3  # llama.cpp's token types: 3 is a special (control) token
TOKEN_TYPE_USER_DEFINED = 4
PRE_TOKENIZERS_SPLITTING_DIGITS = {"smollm", "llama3", "llama-bpe", "qwen2", "deepseek-llm"}

Message = dict[str, str]


class Tokenizer:
    def __init__(self, backend: HFTokenizer, chat_template: str | None,
                 bos_token_id: int | None, eos_token_id: int | None) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.bos_token_id, self.eos_token_id = bos_token_id, eos_token_id
        self.vocab_size = backend.get_vocab_size()
        self._template = None
        self._max_chars_per_token: int | None = None

    @property
    def max_chars_per_token(self) -> int:
        """The longest token's text: a prompt of N characters needs at least N / this many
        tokens, known before tokenizing (vLLM: vllm/tokenizers/hf.py (get_cached_tokenizer))."""
        if self._max_chars_per_token is None:
            self._max_chars_per_token = max(map(len, self.backend.get_vocab()))
        return self._max_chars_per_token

    @classmethod
    def from_path(cls, path: str) -> "Tokenizer":
        """A .gguf file or a Hugging Face directory with tokenizer.json."""
        if is_gguf(path):
            with GGUFFile(path) as f:
                return cls.from_gguf_metadata(f.metadata)
        return cls.from_hf_dir(path)

    @classmethod
    def from_gguf_metadata(cls, md: dict[str, Any]) -> "Tokenizer":
        kind = md.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"only gpt2-style (byte-level BPE) GGUF tokenizers are supported, "
                             f"this file has {kind!r}; use a HF directory with tokenizer.json")
        tokens = md["tokenizer.ggml.tokens"]
        types = md.get("tokenizer.ggml.token_type", [1] * len(tokens))
        merges = [tuple(m.split(" ", 1)) for m in md["tokenizer.ggml.merges"]]
        backend = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges,
                                         fuse_unk=False, byte_fallback=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if md.get("tokenizer.ggml.pre") in PRE_TOKENIZERS_SPLITTING_DIGITS:
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level])
        else:
            backend.pre_tokenizer = byte_level
        backend.decoder = decoders.ByteLevel()
        backend.add_tokens([AddedToken(t, special=ty == TOKEN_TYPE_CONTROL, normalized=False)
                            for t, ty in zip(tokens, types)
                            if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)])
        return cls(backend, md.get("tokenizer.chat_template"),
                   md.get("tokenizer.ggml.bos_token_id"), md.get("tokenizer.ggml.eos_token_id"))

    @classmethod
    def from_hf_dir(cls, path: str) -> "Tokenizer":
        file = os.path.join(path, "tokenizer.json")
        if not os.path.exists(file):
            raise FileNotFoundError(f"{file} not found: a HF model directory needs tokenizer.json")
        backend = HFTokenizer.from_file(file)
        cfg: dict[str, Any] = {}
        if os.path.exists(cfg_file := os.path.join(path, "tokenizer_config.json")):
            with open(cfg_file) as f:
                cfg = json.load(f)

        def token_id(key: str) -> int | None:
            tok = cfg.get(key)
            tok = tok.get("content") if isinstance(tok, dict) else tok
            return backend.token_to_id(tok) if tok else None
        return cls(backend, _hf_chat_template(path, cfg), token_id("bos_token"),
                   token_id("eos_token"))

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.backend.id_to_token(i) for i in ids]

    def apply_chat_template(self, messages: list[Message], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template; use generate() with a plain prompt")
        if self._template is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(self.chat_template)
        tok = self.backend.id_to_token
        return self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=tok(self.bos_token_id) if self.bos_token_id is not None else "",
            eos_token=tok(self.eos_token_id) if self.eos_token_id is not None else "")


CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where transformers 5 saves the template


def _hf_chat_template(path: str, cfg: dict[str, Any]) -> str | None:
    """The template as transformers loads it: chat_template.jinja when the folder has one (what
    transformers 5 writes, leaving tokenizer_config.json without a template), else the config's
    `chat_template`: a string, or a list of named templates (then the one named "default")."""
    file = os.path.join(path, CHAT_TEMPLATE_FILE)
    if os.path.exists(file):
        with open(file, encoding="utf-8") as f:
            return f.read()
    template = cfg.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        return named.get("default")
    return template


def _raise(message: str) -> None:
    raise ValueError(f"chat template error: {message}")
