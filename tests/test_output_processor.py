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
