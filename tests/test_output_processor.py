"""OutputProcessor's finish reasons: a stop string completed by the last token the engine was
allowed to sample is still a stop ("stop", with the string), not "length"; the engine core has
finished that request already, so there is nothing to abort."""

import numpy as np
from tiny_model import make_tiny_model_dir, tiny_tokenizer

from minivllm.engine.messages import EngineCoreOutput, EngineCoreOutputs, FinishReason
from minivllm.engine.output_processor import OutputProcessor
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import Tokenizer

TEXT = "The capital of France is Paris"


def _run(stop: str, last_reason: FinishReason | None):
    tok = Tokenizer(tiny_tokenizer(), None, None, None)
    ids = tok.encode(TEXT)
    proc = OutputProcessor(tok)
    proc.add_request("r", None, [1], SamplingParams(max_tokens=len(ids), stop=[stop]))
    aborts = []
    for i, token in enumerate(ids):
        reason = last_reason if i == len(ids) - 1 else None
        outs, to_abort = proc.process_outputs(EngineCoreOutputs(outputs=[EngineCoreOutput(
            "r", np.array([token], np.int32), finish_reason=reason)]))
        aborts += to_abort
    return outs[0], aborts, proc


def test_stop_string_on_the_last_allowed_token_is_a_stop():
    out, aborts, proc = _run("Paris", FinishReason.LENGTH)
    completion = out.outputs[0]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", "Paris")
    assert completion.text == "The capital of France is " and out.finished
    assert aborts == [] and not proc.has_unfinished_requests()  # the engine finished it


def test_stop_string_before_the_limit_aborts_in_the_engine():
    out, aborts, proc = _run("Paris", None)
    assert (out.outputs[0].finish_reason, aborts) == ("stop", ["r"])


def test_length_without_the_stop_string():
    out, aborts, _ = _run("Rome", FinishReason.LENGTH)
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason, aborts) == ("length", None, [])


def test_llm_stop_string_on_the_last_token(tmp_path):
    from minivllm import LLM
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with LLM(make_tiny_model_dir(str(tmp_path))) as llm:
        out = llm.generate("The capital", greedy, use_tqdm=False)[0].outputs[0]
        before = llm.tokenizer.decode(out.token_ids[:-1])
        assert out.text.startswith(before) and len(out.text) > len(before)
        cut = len(before)  # the stop string: the last token's text, longer until it is unique
        while out.text.find(out.text[cut:]) != cut:
            cut -= 1
        stop = out.text[cut:]
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, stop=[stop])
        stopped = llm.generate("The capital", params, use_tqdm=False)[0].outputs[0]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", stop)
    assert stopped.text == out.text[:cut] and len(stopped.token_ids) == 6


# ---- stop strings while streaming: the hold-back ----

STREAM_TEXTS = ["The capital of France is Paris. The capital of Italy is Rome.",
                "Un café à Montréal, naïve crème brûlée. 東京タワー 🤗🚀 done.",
                "a 👩‍👩‍👧 family says: «bonjour» — ça va? 12345 items"]


def _stream(tok: Tokenizer, ids: list[int], stop: list[str], step_sizes: list[int]):
    """Feed `ids` in steps as the engine would; returns (what a stream sent, the final text).
    The stream sends each output's text growth, as serving_completion does."""
    proc = OutputProcessor(tok)
    proc.add_request("r", None, [1], SamplingParams(max_tokens=len(ids), stop=stop))
    sent, pos, step = "", 0, 0
    while pos < len(ids):
        chunk = ids[pos:pos + step_sizes[step % len(step_sizes)]]
        pos, step = pos + len(chunk), step + 1
        last = FinishReason.LENGTH if pos >= len(ids) else None
        (out,), _ = proc.process_outputs(EngineCoreOutputs(outputs=[EngineCoreOutput(
            "r", chunk, finish_reason=last)]))
        text = out.outputs[0].text
        sent += text[len(sent):]
        if out.finished:
            return sent, text, out.outputs[0].stop_reason
    raise AssertionError("the request never finished")


def _stop_strings(text: str) -> list[str]:
    """Stop strings of 1-8 characters starting every 3 characters."""
    return [text[i:i + n] for i in range(0, len(text), 3) for n in (1, 2, 5, 8)
            if text[i:i + n].strip()]


def _boundaries(tok: Tokenizer, ids: list[int]) -> tuple[set[int], set[int]]:
    """Character offsets where a token's text ends, and those of characters whose bytes two
    tokens share (a prefix of the tokens decodes to an incomplete character there)."""
    from minivllm.engine.detokenizer import REPLACEMENT_CHAR
    ends, split = set(), set()
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k])
        (split if text.endswith(REPLACEMENT_CHAR) else ends).add(
            len(text.rstrip(REPLACEMENT_CHAR)))
    return ends, split


def test_streamed_text_never_shows_what_a_stop_string_cuts():
    """Many stop strings, one or several tokens a step: what a stream sent is exactly the
    finished text (it failed before: the start of a stop string went out before the rest
    arrived and cut it)."""
    from minivllm.model.loader import default_model_path
    tok = Tokenizer.from_path(default_model_path())
    spanning = starts_inside = 0
    for text in STREAM_TEXTS:
        ids = tok.encode(text)
        ends, split = _boundaries(tok, ids)
        for stop in _stop_strings(text):
            start = text.find(stop)
            spanning += any(start < e < start + len(stop) for e in ends)
            starts_inside += start in split
            for steps in ([1], [2, 1, 3]):
                sent, final, reason = _stream(tok, ids, [stop, "never appears"], steps)
                assert final == text[:start] and reason == stop, (stop, final)
                assert sent == final, f"stop {stop!r}: streamed {sent!r}, whole {final!r}"
    assert spanning > 50 and starts_inside > 3  # the cases the issue names are among them
