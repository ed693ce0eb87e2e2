"""From a prompt (text or token ids) to a validated EngineCoreRequest, in the front end.

LLM and AsyncLLM both call it, so a request is refused with the same ValueError before it is
sent, whichever front end made it. In vLLM: vllm/v1/engine/input_processor.py (InputProcessor).
"""

from __future__ import annotations

import time
from typing import Sequence, Union

import numpy as np

from minivllm.engine.config import EngineConfig
from minivllm.engine.core import validate_request
from minivllm.engine.messages import TOKEN_DTYPE, EngineCoreRequest
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import Tokenizer

PromptType = Union[str, Sequence[int], np.ndarray]


def process_inputs(config: EngineConfig, tokenizer: Tokenizer, request_id: str,
                   prompt: PromptType, params: SamplingParams
                   ) -> tuple[EngineCoreRequest, str | None]:
    """(the request, the prompt text or None); ValueError saying what to change if the engine
    could not run it."""
    text = prompt if isinstance(prompt, str) else None
    token_ids = np.asarray(tokenizer.encode(prompt) if text is not None else prompt)
    validate_request(config, request_id, token_ids)
    request = EngineCoreRequest(request_id, token_ids.astype(TOKEN_DTYPE, copy=False), params,
                                arrival_time=time.time())
    return request, text
