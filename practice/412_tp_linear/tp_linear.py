"""Exercise 412 (see README.md): a linear layer split across tensor-parallel ranks.

Column parallel: each rank holds a slice of the output features (rows of the (out, in) weight)
and its slice of the bias; its output is that slice; an all-gather joins the slices when the
full output is needed. Row parallel: each rank holds a slice of the input features (columns of
the weight) and sees the matching slice of the input; the partial products are summed with
one all-reduce, and the bias is added once, after it. An MLP puts the two back to back, so the
column layer's output slice is exactly the row layer's input slice: one all-reduce per MLP
(vllm/model_executor/layers/linear.py:436 ColumnParallelLinear, :627 its all-gather; :1653
RowParallelLinear, which adds the bias on rank 0 only, before the all-reduce, :1814).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def init_tp(rank: int, world_size: int, init_file: str) -> None:
    """Join a gloo process group of world_size processes that meet at a shared file."""
    raise NotImplementedError("TODO: dist.init_process_group('gloo', init_method='file://...')")


def column_shard(weight: torch.Tensor, bias: torch.Tensor | None, rank: int,
                 world_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This rank's rows of the (out, in) weight and its slice of the bias."""
    raise NotImplementedError("TODO: check divisibility; slice the output features")


def row_shard(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's columns of the (out, in) weight."""
    raise NotImplementedError("TODO: check divisibility; slice the input features")


def column_parallel_linear(x: torch.Tensor, weight_shard: torch.Tensor,
                           bias_shard: torch.Tensor | None, gather_output: bool) -> torch.Tensor:
    """x @ W_r^T + b_r: this rank's output features, or all of them if gather_output."""
    raise NotImplementedError("TODO: F.linear; dist.all_gather and torch.cat if gather_output")


def row_parallel_linear(x: torch.Tensor, weight_shard: torch.Tensor, bias: torch.Tensor | None,
                        input_is_parallel: bool) -> torch.Tensor:
    """The full x @ W^T + b from this rank's input columns: partial sums, all-reduced."""
    raise NotImplementedError("TODO: split x unless input_is_parallel; F.linear without the "
                              "bias; dist.all_reduce; the bias once")


def parallel_mlp(x: torch.Tensor, w_up: torch.Tensor, b_up: torch.Tensor,
                 w_down: torch.Tensor, b_down: torch.Tensor, rank: int,
                 world_size: int) -> torch.Tensor:
    """relu(x @ w_up^T + b_up) @ w_down^T + b_down, column- then row-parallel: one all-reduce."""
    raise NotImplementedError("TODO: shard both, column (no gather), relu, row (parallel input)")
