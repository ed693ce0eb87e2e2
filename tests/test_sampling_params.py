"""Seeds as vLLM takes them: any 64-bit integer seeds a request (a large one must not fail the
batch, a negative one must not be dropped), -1 or None means unseeded, anything else is refused
when the SamplingParams is made, before it can reach a batch."""

import msgspec
import pytest
import torch
from tiny_model import make_tiny_model_dir

from minivllm.model.sampler import sample
from minivllm.sampling_params import SamplingParams

VOCAB = 64


def _draw(seeds: list[int], step: int = 0) -> list[int]:
    """One sampled token per row from the same flat logits, each row with its own seed."""
    n = len(seeds)
    logits = torch.zeros(n, VOCAB)  # uniform: the seed alone decides the token
    return sample(logits, torch.ones(n), torch.ones(n), torch.zeros(n, dtype=torch.int64),
                  torch.tensor(seeds, dtype=torch.int64), torch.full((n,), step)).tolist()


@pytest.mark.parametrize("seed", [2**50, 2**63 - 1, -2**63, -5])
def test_any_64_bit_seed_samples_and_repeats(seed):
    # 12 draws at different steps: an unseeded row repeats all 12 with chance 64**-11
    first = [_draw([seed, -1], step)[0] for step in range(12)]
    assert first == [_draw([-1, seed], step)[1] for step in range(12)]


def test_seed_range_and_minus_one():
    assert SamplingParams(seed=-1).seed is None  # vLLM's "no seed"
    assert SamplingParams(seed=-7).seed == -7
    for bad in (2**63, -2**63 - 1, True, 1.5):
        with pytest.raises(ValueError, match="seed must be an integer"):
            SamplingParams(seed=bad)
    with pytest.raises(ValueError, match="seed must be an integer"):  # off the wire too
        msgspec.msgpack.decode(msgspec.msgpack.encode([1.0, 1.0, 0, 2**63]), type=SamplingParams)


def test_a_huge_seed_does_not_fail_the_batch(tmp_path):
    from minivllm import LLM
    params = [SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=s)
              for s in (2**50, None, -3)]
    with LLM(make_tiny_model_dir(str(tmp_path))) as llm:
        outs = llm.generate(["The capital", "A paged", "héllo"], params, use_tqdm=False)
        again = llm.generate(["héllo", "The capital"], [params[2], params[0]], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [6, 6, 6]
    assert [o.outputs[0].token_ids for o in again] == [outs[2].outputs[0].token_ids,
                                                        outs[0].outputs[0].token_ids]
