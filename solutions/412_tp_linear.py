"""Exercise 412, reference answer: a linear layer split across tensor-parallel ranks.

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
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)


def _part(size: int, rank: int, world_size: int, what: str) -> slice:
    if size % world_size:
        raise ValueError(f"{what} ({size}) is not divisible by the world size ({world_size})")
    per = size // world_size
    return slice(rank * per, (rank + 1) * per)


def column_shard(weight: torch.Tensor, bias: torch.Tensor | None, rank: int,
                 world_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This rank's rows of the (out, in) weight and its slice of the bias."""
    part = _part(weight.shape[0], rank, world_size, "output features")
    return weight[part].contiguous(), None if bias is None else bias[part].contiguous()


def row_shard(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's columns of the (out, in) weight."""
    part = _part(weight.shape[1], rank, world_size, "input features")
    return weight[:, part].contiguous()


def column_parallel_linear(x: torch.Tensor, weight_shard: torch.Tensor,
                           bias_shard: torch.Tensor | None, gather_output: bool) -> torch.Tensor:
    """x @ W_r^T + b_r: this rank's output features, or all of them if gather_output."""
    y = F.linear(x, weight_shard, bias_shard)
    if not gather_output:
        return y
    parts = [torch.empty_like(y) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, y.contiguous())
    return torch.cat(parts, dim=-1)


def row_parallel_linear(x: torch.Tensor, weight_shard: torch.Tensor, bias: torch.Tensor | None,
                        input_is_parallel: bool) -> torch.Tensor:
    """The full x @ W^T + b from this rank's input columns: partial sums, all-reduced."""
    if not input_is_parallel:
        part = _part(x.shape[-1], dist.get_rank(), dist.get_world_size(), "input features")
        x = x[..., part]
    y = F.linear(x, weight_shard)  # this rank's share of every output
    dist.all_reduce(y)  # sum over ranks
    if bias is not None:
        y = y + bias  # once, after the sum
    return y


def parallel_mlp(x: torch.Tensor, w_up: torch.Tensor, b_up: torch.Tensor,
                 w_down: torch.Tensor, b_down: torch.Tensor, rank: int,
                 world_size: int) -> torch.Tensor:
    """relu(x @ w_up^T + b_up) @ w_down^T + b_down, column- then row-parallel: one all-reduce."""
    w1, b1 = column_shard(w_up, b_up, rank, world_size)
    w2 = row_shard(w_down, rank, world_size)
    h = F.relu(column_parallel_linear(x, w1, b1, gather_output=False))
    return row_parallel_linear(h, w2, b_down, input_is_parallel=True)
