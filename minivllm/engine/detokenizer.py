"""Incremental detokenization: turn one new token at a time into new text.

Byte-level BPE splits a multi-byte character (an accented letter, an emoji) across tokens, and
decoding a token on its own gives U+FFFD for the missing bytes. So we decode a short window of
recent tokens twice, before and after the new ones, emit only the difference, and wait while the
window ends in U+FFFD. In vLLM: SlowIncrementalDetokenizer and check_stop_strings,
vllm/v1/engine/detokenizer.py:262 and :321; detokenize_incrementally,
vllm/tokenizers/detokenizer_utils.py:176.
"""

from __future__ import annotations

from minivllm.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"  # what decoding an incomplete UTF-8 sequence gives


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, stop: list[str] | None = None,
                 skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = list(stop or [])
        self.token_ids: list[int] = []
        self.output_text = ""
        self.prefix_offset = 0  # the window [prefix_offset, read_offset) is already emitted
        self.read_offset = 0

    def update(self, new_token_ids: list[int], finished: bool = False) -> str | None:
        """Add tokens; return the stop string if the text now contains one (the text is cut
        before it), else None. When `finished`, bytes still waiting are emitted as they are."""
        start = len(self.output_text)
        for token_id in new_token_ids:
            self.token_ids.append(token_id)
            self.output_text += self._next_text()
        if finished and self.read_offset < len(self.token_ids):
            self.output_text += self._next_text(flush=True)
        if not self.stop:
            return None
        longest = max(map(len, self.stop))
        search_from = max(0, start - longest + 1)  # a stop string may straddle old and new text
        for stop in self.stop:
            idx = self.output_text.find(stop, search_from)
            if idx >= 0:
                self.output_text = self.output_text[:idx]
                return stop
        return None

    def _next_text(self, flush: bool = False) -> str:
        decode = self.tokenizer.decode
        ids, skip = self.token_ids, self.skip_special_tokens
        prefix = decode(ids[self.prefix_offset:self.read_offset], skip)
        text = decode(ids[self.prefix_offset:], skip)
        if len(text) <= len(prefix) or (text.endswith(REPLACEMENT_CHAR) and not flush):
            return ""  # an incomplete character: wait for the next token
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        return text[len(prefix):]
