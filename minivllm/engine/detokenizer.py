"""Incremental detokenization: turn one new token at a time into new text.

Byte-level BPE splits a multi-byte character (an accented letter, an emoji) across tokens, and
decoding a token on its own gives U+FFFD for the missing bytes. So we decode a short window of
recent tokens twice, before and after the new ones, emit only the difference, and wait while the
window ends in U+FFFD. In vLLM: SlowIncrementalDetokenizer and check_stop_strings,
vllm/v1/engine/detokenizer.py (SlowIncrementalDetokenizer) and check_stop_strings; detokenize_incrementally,
vllm/tokenizers/detokenizer_utils.py (detokenize_incrementally).

Stop strings are held back. Text is cut before a stop string only once the whole string has
arrived, so the last `len(longest stop) - 1` characters of an unfinished request may still be
the start of one: a stream that sent them would send what the finished text leaves out.
`get_next_output_text` withholds them until the request finishes or more text shows they are
not a stop string (vLLM: stop_buffer_length and get_next_output_text,
vllm/v1/engine/detokenizer.py (BaseIncrementalDetokenizer.__init__) and BaseIncrementalDetokenizer.get_next_output_text).
"""

from __future__ import annotations

from minivllm.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"  # what decoding an incomplete UTF-8 sequence gives


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, stop: list[str] | None = None,
                 skip_special_tokens: bool = True, min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        # a stop string counts only if it ends after the text of the first min_tokens tokens
        # (vllm/v1/engine/detokenizer.py:134-136)
        self.min_tokens = min_tokens
        self.min_text_end = 0 if min_tokens == 0 else None
        self.skip_special_tokens = skip_special_tokens
        self.stop = list(stop or [])
        # characters that may be the start of a stop string: withheld until decided
        self.stop_buffer_length = max(map(len, self.stop)) - 1 if self.stop else 0
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
            if self.min_text_end is None and len(self.token_ids) >= self.min_tokens:
                self.min_text_end = len(self.output_text)
        if finished and self.read_offset < len(self.token_ids):
            self.output_text += self._next_text(flush=True)
        return self._check_stop_strings(len(self.output_text) - start)

    def get_next_output_text(self, finished: bool) -> str:
        """The text a client may see now: all of it once finished, else all but the
        characters that could still turn out to begin a stop string."""
        held = 0 if finished else self.stop_buffer_length
        return self.output_text[:max(0, len(self.output_text) - held)]

    def _check_stop_strings(self, new_chars: int) -> str | None:
        """Cut the text before the stop string that ends earliest in the new text (vLLM's
        rule, so several tokens in one step stop where one token at a time would)."""
        if self.min_text_end is None:
            return None  # fewer than min_tokens tokens so far
        best, best_start, best_end = None, 0, len(self.output_text) + 1
        for stop in self.stop if new_chars else ():
            # only where the new text could complete it: at most len(stop) - 1 chars earlier
            idx = self.output_text.find(stop, max(0, len(self.output_text) - new_chars
                                                  - len(stop) + 1))
            while 0 <= idx and idx + len(stop) <= self.min_text_end:  # ends too early
                idx = self.output_text.find(stop, idx + 1)
            if idx >= 0 and idx + len(stop) < best_end:
                best, best_start, best_end = stop, idx, idx + len(stop)
        if best is not None:
            self.output_text = self.output_text[:best_start]
        return best

    def _next_text(self, flush: bool = False) -> str:
        decode = self.tokenizer.decode
        ids, skip = self.token_ids, self.skip_special_tokens
        prefix = decode(ids[self.prefix_offset:self.read_offset], skip)
        text = decode(ids[self.prefix_offset:], skip)
        if len(text) <= len(prefix) or (text.endswith(REPLACEMENT_CHAR) and not flush):
            return ""  # an incomplete character: wait for the next token
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        return text[len(prefix):]
