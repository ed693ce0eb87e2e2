"""From EngineCoreOutputs (token ids) to RequestOutputs (text) in the front end.

Stop strings are found here, after detokenizing, so the processor tells its caller which
requests to abort in the engine core. In vLLM: vllm/v1/engine/output_processor.py (OutputProcessor);
CompletionOutput and RequestOutput, vllm/outputs.py (CompletionOutput) and RequestOutput.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.engine.messages import EngineCoreOutputs, FinishReason
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import Tokenizer


# One token's logprobs as the engine sent them: (token ids, logprobs, rank of the sampled),
# the sampled token first, then the top ones (vLLM keeps a dict[int, Logprob] per token).
TokenLogprobs = tuple[list[int], list[float], int]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprobs] | None = None  # one per token in token_ids, when asked for


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    # with SamplingParams.prompt_logprobs: None for the first prompt token, then per token its
    # (token ids, logprobs, rank), the prompt token first
    prompt_logprobs: list | None = None


@dataclass
class RequestState:
    output: RequestOutput
    detokenizer: IncrementalDetokenizer | None
    params: SamplingParams
    new_token_ids: list[int] = field(default_factory=list)


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams) -> None:
        detok = (IncrementalDetokenizer(self.tokenizer, params.stop, min_tokens=params.min_tokens)
                 if self.tokenizer else None)
        logprobs = None if params.logprobs is None else []
        output = RequestOutput(request_id, prompt, prompt_token_ids,
                               [CompletionOutput(0, "", [], logprobs=logprobs)],
                               prompt_logprobs=None if params.prompt_logprobs is None else [None])
        self.request_states[request_id] = RequestState(output, detok, params)

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    def process_outputs(self, outputs: EngineCoreOutputs) -> tuple[list[RequestOutput], list[str]]:
        """Returns the updated RequestOutputs and the ids to abort in the engine core."""
        updated, to_abort = [], []
        for out in outputs.outputs:
            state = self.request_states.get(out.request_id)
            if state is None:  # aborted here already
                continue
            completion, new_ids = state.output.outputs[0], out.new_token_ids
            completion.token_ids.extend(new_ids)
            if out.new_logprobs is not None and completion.logprobs is not None:
                completion.logprobs.append(out.new_logprobs)
            if out.new_prompt_logprobs is not None and state.output.prompt_logprobs is not None:
                state.output.prompt_logprobs.extend(zip(*out.new_prompt_logprobs))
            finish_reason, stop_reason = out.finish_reason, out.stop_reason
            if out.error is not None:  # FinishReason.ERROR or a shutdown's ABORT: say why
                stop_reason = out.error
            if state.detokenizer is not None:
                stop = state.detokenizer.update(new_ids, finished=finish_reason is not None)
                if stop is not None:  # wins over "length" when it ends on the last token
                    if finish_reason is None:  # vLLM: OutputProcessor.process_outputs
                        to_abort.append(out.request_id)
                    finish_reason, stop_reason = FinishReason.STOP, stop
                # a stream sends this text's growth: hold back what may begin a stop string
                completion.text = state.detokenizer.get_next_output_text(finish_reason is not None)
            state.output.num_cached_tokens = out.num_cached_tokens
            if finish_reason is not None:
                completion.finish_reason, completion.stop_reason = str(finish_reason), stop_reason
                state.output.finished = True
                del self.request_states[out.request_id]
            updated.append(state.output)
        return updated, to_abort

    def abort_requests(self, request_ids: list[str]) -> None:
        for req_id in request_ids:
            self.request_states.pop(req_id, None)
