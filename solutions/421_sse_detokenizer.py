"""Exercise 421, reference answer: stream generated tokens as Server-Sent Events without ever
sending half a character.

A byte-level BPE token is a run of bytes, not of characters: "🤗" is four bytes that the
tokenizer may split over two or three tokens. Decoding each token alone turns the pieces into
U+FFFD. So the detokenizer keeps the bytes, and emits a character once its last byte has
arrived: an incremental UTF-8 decoder keeps an incomplete tail back and turns bytes that can no
longer be completed into U+FFFD at once. (vLLM decodes a window of tokens twice and waits while
the new text ends in U+FFFD: vllm/v1/engine/detokenizer.py:262,
vllm/tokenizers/detokenizer_utils.py:269; that also holds back a U+FFFD the text really has.)
Each event is one `data: <json>` line and a blank line; the JSON escapes newlines, so a text
with "\n" cannot break the framing (vllm/entrypoints/openai/completion/serving.py:487, :558).
"""

from __future__ import annotations

import codecs
import json
from functools import cache
from typing import Iterable, Iterator

from minivllm.tokenizer import Tokenizer

DONE = b"data: [DONE]\n\n"


@cache
def _byte_decoder() -> dict[str, int]:  # pragma: no mutate block
    """GPT-2's byte-level alphabet, reversed: the character a byte is shown as -> the byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def token_bytes(tokenizer: Tokenizer, token_id: int) -> bytes:  # pragma: no mutate block
    """The bytes token_id stands for (an added token: its text, UTF-8)."""
    text = tokenizer.backend.id_to_token(token_id)
    if text is None:
        raise ValueError(f"token id {token_id} is not in the vocabulary "
                         f"(0..{tokenizer.vocab_size - 1})")
    if token_id in tokenizer.backend.get_added_tokens_decoder():
        return text.encode()
    table = _byte_decoder()
    return bytes(table[c] for c in text)


def is_special(tokenizer: Tokenizer, token_id: int) -> bool:  # pragma: no mutate block
    added = tokenizer.backend.get_added_tokens_decoder().get(token_id)
    return added is not None and added.special


class IncrementalDetokenizer:
    """push(token ids) -> the new text whose characters are complete; flush() -> the rest."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: Iterable[int]) -> str:
        data = b"".join(token_bytes(self.tokenizer, t) for t in token_ids
                        if not (self.skip_special_tokens and is_special(self.tokenizer, t)))
        return self._utf8.decode(data)

    def flush(self) -> str:
        """The end of the stream: an incomplete tail becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)


def sse_event(data: dict | str) -> bytes:
    """One event: `data: ` + JSON (or a bare string such as [DONE]) + a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    if "\n" in text or "\r" in text:
        raise ValueError("an SSE data line cannot hold a line break")
    return f"data: {text}\n\n".encode()


def _chunk(request_id: str, text: str, finish_reason: str | None) -> bytes:
    return sse_event({"id": request_id, "object": "text_completion",
                      "choices": [{"index": 0, "text": text, "finish_reason": finish_reason}]})


def stream_completion(tokenizer: Tokenizer, request_id: str,
                      token_batches: Iterable[list[int]],
                      finish_reason: str = "length") -> Iterator[bytes]:
    """One event per batch that completes some text, a last one with the rest and the finish
    reason, then data: [DONE]."""
    detok = IncrementalDetokenizer(tokenizer)
    for batch in token_batches:
        if text := detok.push(batch):
            yield _chunk(request_id, text, None)
    yield _chunk(request_id, detok.flush(), finish_reason)
    yield DONE
