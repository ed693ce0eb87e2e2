"""Greedy tokens from a Q8_0 output head, screened in int8 and confirmed in float32
(csrc/greedy_head.c): the argmax of the float32 logits, without computing all 49,152 of them.

A step whose every sampled row is greedy, with no penalties, logit bias or logprobs, needs only
each row's best token. The screen rounds the hidden state to int8 and bounds how far that moves
each logit, so every token it drops is provably below the best one; the tokens it keeps (a
median of 14 per decode row of the bundled model) are computed in float32. At 32 rows the head
was the step's largest matrix (11 ms of 60, figures/reference_numbers.md). vLLM's sampler
takes a shortcut for an all-greedy batch (vllm/v1/sample/sampler.py:325), but only after
compute_logits (vllm/model_executor/models/llama.py:546) has made every logit: on a GPU the head
is one fast GEMM; here, on two CPU cores, it is a sixth of a step.

The screen's copy of the weights (build_screen) is made at load from the head's blocks: 16
vocabulary rows to a tile, each row's quants + 128 (unsigned, as VNNI's u8 x s8 product wants
them) in quads of 4 columns, its block scales and each block's |w|_1 (for the bound) as floats.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf import GGMLQuantizationType

from minivllm.model import csrc_build, op_choice

TILE, QK = 16, 32  # vocabulary rows a tile (one zmm of int32 sums); weights a block


@dataclass
class Screen:
    quants: torch.Tensor  # (tiles, blocks, 8, 16, 4) uint8: quant + 128
    scales: torch.Tensor  # (tiles, blocks, 16) float32
    l1: torch.Tensor  # (tiles, blocks, 16) float32: each block's sum of |d q|
    vocab: int
    hidden: int


def build_screen(blocks: torch.Tensor, qtype: GGMLQuantizationType, hidden: int) -> Screen | None:
    """The screen for a head of Q8_0 blocks in the file's layout (vocab, hidden / 32 * 34), or
    None where the C screen is not built (no AVX-512 VNNI) or the head is not Q8_0."""
    lib = csrc_build.load()
    if qtype != GGMLQuantizationType.Q8_0 or lib is None or not lib.greedy_head_built():
        return None
    vocab, nb = blocks.shape[0], hidden // QK
    b = blocks.view(vocab, nb, 34)
    d = b[..., :2].contiguous().view(torch.float16).float().squeeze(-1)  # (vocab, nb)
    q = b[..., 2:].contiguous().view(torch.int8)  # (vocab, nb, 32)
    tiles = -(-vocab // TILE)
    pad = tiles * TILE - vocab
    qp = torch.nn.functional.pad(q.to(torch.int16) + 128, (0, 0, 0, 0, 0, pad), value=128)
    quants = qp.to(torch.uint8).view(tiles, TILE, nb, QK // 4, 4).permute(0, 2, 3, 1, 4)
    scales = torch.nn.functional.pad(d, (0, 0, 0, pad)).view(tiles, TILE, nb).permute(0, 2, 1)
    l1 = torch.nn.functional.pad(d.double().abs() * q.double().abs().sum(-1), (0, 0, 0, pad))
    l1 = l1.float().view(tiles, TILE, nb).permute(0, 2, 1)
    return Screen(quants.contiguous(), scales.contiguous(), l1.contiguous(), vocab, hidden)


def greedy_tokens(hidden: torch.Tensor, screen: Screen) -> torch.Tensor | None:
    """(M, hidden) float32 -> (M,) int64 greedy tokens, or None where the screen does not run
    (op_choice says logits-then-argmax is faster at this many rows, or a row is not finite)."""
    if not op_choice.runs_in_c("greedy_head", hidden.shape[0]):
        return None
    return screen_tokens(hidden, screen)


def screen_tokens(hidden: torch.Tensor, screen: Screen) -> torch.Tensor | None:
    """greedy_tokens whatever op_choice says (op_selection times it against the logits)."""
    x = hidden.float().contiguous()
    out = torch.empty(x.shape[0], dtype=torch.int64)
    rc = csrc_build.load().greedy_head(x.data_ptr(), x.shape[0], screen.hidden,
                                       screen.quants.data_ptr(), screen.scales.data_ptr(),
                                       screen.l1.data_ptr(), screen.vocab, out.data_ptr())
    if rc in (-3, -4):  # a row not finite, or one the screen cannot narrow
        return None
    if rc:
        raise RuntimeError(f"C op greedy_head failed with code {rc}")
    return out
