"""The int8 screen of the output head (greedy_head.py) gives the argmax of the float32 logits:
on the model's own hidden states, on random ones with outlier channels, at exact and near ties,
and never a padded row; where it cannot narrow a row it declines, and the runner computes the
logits."""

import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from minivllm.engine.config import EngineConfig
from minivllm.model import cpu_features, csrc_build, custom_ops, greedy_head
from minivllm.model.op_selection import HIDDEN, random_q8_blocks
from minivllm.model.quant_linear import dequantize_torch
from minivllm.model.random_step import random_step
from minivllm.worker.model_runner import ModelRunner

Q8_0 = GGMLQuantizationType.Q8_0


def _screen_expected() -> bool:
    """A native build on a CPU with AVX-512 VNNI: there the screen must be built."""
    return (cpu_features.cpu_flags()["avx512_vnni"]
            and os.environ.get(csrc_build.ARCH_ENV, "native") == "native")


needs_screen = pytest.mark.skipif(not _screen_expected(), reason="no AVX-512 VNNI here")


pytestmark = pytest.mark.usefixtures("c_ops")  # every op in C (conftest.py)


def exact_argmax(x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """The argmax of float32 logits in float64, where no rounding can swap two rows."""
    return (x.double() @ dequantize_torch(blocks, Q8_0, HIDDEN).double().t()).argmax(-1)


def screened(x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor | None:
    return greedy_head.screen_tokens(x, greedy_head.build_screen(blocks, Q8_0, HIDDEN))


@pytest.fixture(scope="module")
def model():
    runner = ModelRunner(EngineConfig())
    runner.load_model()
    return runner.model


@needs_screen
@pytest.mark.parametrize("decodes,chunks", [(1, []), (5, []), (8, []), (17, []), (32, []),
                                            (0, [(70, 70)])])
def test_the_models_greedy_tokens_are_the_logits_argmax(model, decodes, chunks):
    """Decode rows over a random cache, and every position of a 70-token prompt."""
    assert model.screen is not None, "the bundled GGUF's Q8_0 head should get a screen"
    lens = [40 + 9 * i for i in range(decodes)]
    hidden = model.forward(*random_step(model, lens, chunks))
    expected = custom_ops.argmax_torch(model.compute_logits(hidden))
    assert torch.equal(model.greedy_tokens(hidden), expected)


@needs_screen
def test_random_rows_with_outlier_channels_match_the_float_argmax():
    """Per-block scales keep one outlier channel from blurring the whole row; the screen's bound
    (half a step of each block's scale, times the row's |w|) must still hold every time."""
    blocks = random_q8_blocks(4099, seed=0)  # a last tile of 3 rows
    gen = torch.Generator().manual_seed(1)
    for trial in range(60):
        x = torch.randn(9, HIDDEN, generator=gen) * (0.05 + trial / 10)
        x[:, trial % HIDDEN] *= 40  # an outlier channel, as the model's final norm has
        assert torch.equal(screened(x, blocks), exact_argmax(x, blocks)), trial


@needs_screen
def test_exact_ties_give_the_first_row_and_near_ties_the_larger():
    blocks = random_q8_blocks(64, seed=2)
    rows = blocks.view(64, HIDDEN // 32, 34)
    rows[40] = rows[7]  # an exact tie: argmax takes the first
    rows[50] = rows[20]
    rows[50, 3, 2 + 5] = (rows[20, 3, 2 + 5].view(torch.int8) + 1).view(torch.uint8)  # one quant up
    w = dequantize_torch(blocks, Q8_0, HIDDEN)
    x = torch.stack([w[7], w[20], w[20] + 1e-3 * (w[50] - w[20]).sign()])  # each row's own best
    x[:, 3 * 32 + 5] = 0.5  # the changed quant's column decides between rows 20 and 50
    expected = exact_argmax(x, blocks)
    assert expected[0] == 7 and expected[1] in (20, 50)
    assert torch.equal(screened(x, blocks), expected)


@needs_screen
def test_the_bound_holds_where_rounding_errs_against_the_winner_in_every_channel():
    """x's first channel of each block is its largest (scale 1/127); every other one sits at
    0.49 of a step, the side that row A's weight makes count: rounded to 0, A's approximate
    logit is 0 against a true 0.49 s |w_A|_1, the most the rounding can take. Row B reads
    only the exact channel and trails A by 0.2%: a bound under half a step drops A for B."""
    blocks = random_q8_blocks(16, seed=5)
    rows = blocks.view(16, HIDDEN // 32, 34)
    rows[:, :, :2] = 0  # scale 0: every other row's logit is 0
    rows[3, :, :2] = torch.tensor([1 / 256], dtype=torch.float16).view(torch.uint8)
    rows[3, :, 2] = 0  # A leaves each block's first channel out
    w = dequantize_torch(blocks, Q8_0, HIDDEN).view(16, HIDDEN // 32, 32)
    x = 0.49 / 127 * w[3].sign()
    x[:, 0] = 1.0
    x = x.reshape(1, HIDDEN)
    z_a = float(x.double() @ w[3].reshape(-1).double())
    rows[9, 0, 2:] = 0
    rows[9, 0, 2] = 127  # B: one weight, on the first block's exact channel
    rows[9, 0, :2] = torch.tensor([0.998 * z_a / 127], dtype=torch.float16).view(torch.uint8)
    z = x.double() @ dequantize_torch(blocks, Q8_0, HIDDEN).double().t()
    assert z.argmax().item() == 3 and 0.99 * z_a < z[0, 9] < z_a
    assert screened(x, blocks).item() == 3


@needs_screen
def test_padding_rows_never_win():
    """40 rows (3 tiles of 16, the last padded): every logit negative, the padding's would be 0."""
    blocks = random_q8_blocks(40, seed=3)
    w = dequantize_torch(blocks, Q8_0, HIDDEN)
    x = -w.sum(0, keepdim=True)  # against every row at once: all logits negative
    assert (x @ w.t()).max() < 0
    got = screened(x, blocks)
    assert got.item() < 40 and torch.equal(got, exact_argmax(x, blocks))


@needs_screen
def test_rows_the_screen_cannot_narrow_are_left_to_the_logits():
    blocks = random_q8_blocks(4096, seed=4)
    x = torch.randn(3, HIDDEN)
    x[1] = 0.0  # every logit 0: the screen keeps every row, and declines
    assert screened(x, blocks) is None
    x[1, 0] = float("nan")
    assert screened(x, blocks) is None


def test_the_runner_takes_greedy_tokens_only_for_plain_greedy_rows(model, monkeypatch):
    """A step with a sampled row, logprobs or a penalty needs the logits; a greedy step does not
    (where the screen is built), and both give the same greedy tokens."""
    calls = []
    real = model.greedy_tokens
    monkeypatch.setattr(model, "greedy_tokens", lambda h: calls.append(len(h)) or real(h))
    runner = ModelRunner.__new__(ModelRunner)
    runner.model = model

    class Step:  # the fields _greedy_tokens reads
        sampling_extras = None
        temperature = np.zeros(4, np.float32)
        num_logprobs = None

    hidden = torch.randn(4, HIDDEN)
    orig = np.arange(4)
    step = Step()
    tokens = runner._greedy_tokens(step, hidden, orig)
    assert calls == [4]
    if model.screen is not None:
        assert torch.equal(tokens, custom_ops.argmax_torch(model.compute_logits(hidden)))
    step.temperature = np.array([0, 0, 0.7, 0], np.float32)
    assert runner._greedy_tokens(step, hidden, orig) is None
    step.temperature, step.num_logprobs = np.zeros(4, np.float32), np.array([-1, 2, -1, -1])
    assert runner._greedy_tokens(step, hidden, orig) is None
    step.num_logprobs, step.sampling_extras = None, object()
    assert runner._greedy_tokens(step, hidden, orig) is None
    assert calls == [4]
