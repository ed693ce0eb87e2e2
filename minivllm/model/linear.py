"""Linear layers: one weight matrix and how it is applied fast on a CPU, then how tensor
parallelism splits it across ranks.

A weight is kept as Hugging Face stores it, (out, in). `Linear` applies it three ways:

- many rows (prefill, decode batches of 8 and more), and every bfloat16 call: oneDNN's blocked
  layout, reordered once at load: MKL repacks the weights on every call, oneDNN reads them
  packed (figures/reference_numbers.md has what that measured).
- 1-7 rows in float32: the C op `skinny_linear` (custom_ops.py), which streams the row-major
  weights with prefetching, each thread a contiguous range of output rows.
- where that op is not built: the matrix split by output rows into one slab per thread,
  (parts, out / parts, in) (a view, no copy), applied with one `bmm` as W @ x^T, which runs the
  slabs in parallel and streams the weights faster than x @ W^T in MKL.

Tensor parallelism splits the same matrices across processes, as vLLM does
(vllm/model_executor/layers/linear.py): ColumnParallelLinear keeps a slice of the output rows
and needs no communication; MergedColumnParallelLinear and QKVParallelLinear slice each fused
part (gate and up; q, k and v) on its own; RowParallelLinear keeps a slice of the input columns, so each rank holds a partial sum, and one all-reduce
completes it. In a Llama layer, qkv and gate_up are column-parallel, o and down row-parallel:
two all-reduces a layer. The vocabulary is split by rows for the embedding and the LM head
(VocabParallelEmbedding and ParallelLMHead in vllm/model_executor/layers/vocab_parallel_embedding.py).
"""

from __future__ import annotations

import torch

from minivllm.distributed.parallel_state import TPGroup
from minivllm.model import custom_ops, op_choice

SKINNY_BELOW = 8  # rows: below, W @ x^T is faster (batch 1: 1.2x); from 8 up, x @ W^T (batch 32: 1.1x)
ONEDNN_BATCH_HINT = 32  # rows the blocked layout is tuned for; any row count works with it


def split_rows(w: torch.Tensor, parts: int) -> torch.Tensor:
    """(out, in) -> (parts, out / parts, in), contiguous; one part if out does not divide."""
    w = w.contiguous()
    return w[None] if parts < 2 or w.shape[0] % parts else w.view(parts, -1, w.shape[1])


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (M, in), any strides, @ a row-split weight (parts, out / parts, in) -> (M, out)."""
    parts, rows, n_in = w.shape
    m = x.shape[0]
    if m < SKINNY_BELOW:  # (parts, out / parts, M), returned as the transpose of (out, M)
        return torch.bmm(w, x.t().expand(parts, n_in, m)).view(parts * rows, m).t()
    out = torch.bmm(x.contiguous().expand(parts, m, n_in), w.transpose(1, 2))
    return out.transpose(0, 1).reshape(m, parts * rows)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x (M, in) @ a weight packed by onednn_pack -> (M, out)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [], "")


def onednn_pack(w: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's layout of an (out, in) weight, or None where this torch build has no oneDNN.
    (torch.ops.mkldnn._reorder_linear_weight / _linear_pointwise are what inductor's weight
    prepacking uses for CPU linears.)"""
    if not torch.backends.mkldnn.is_available() or w.dtype not in (torch.float32, torch.bfloat16):
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), ONEDNN_BATCH_HINT)
        onednn_linear(torch.zeros(1, w.shape[1], dtype=w.dtype), packed)
        return packed
    except (RuntimeError, AttributeError):  # an old build, or bf16 without the CPU instructions
        return None


class Linear:
    """One (out, in) weight in two layouts: the row split for a few rows, and oneDNN's blocked
    layout (the weights' memory again) for many."""

    def __init__(self, w: torch.Tensor, parts: int):
        self.split = split_rows(w, parts)
        self.weight = self.split.view(-1, self.split.shape[-1])  # (out, in), the same storage
        self.packed = onednn_pack(w)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # bfloat16 always takes oneDNN: MKL's bf16 bmm streamed the weights about 3x slower
        # (with avx512_bf16; figures/reference_numbers.md)
        if self.packed is not None and (x.shape[0] >= SKINNY_BELOW or x.dtype != torch.float32):
            return onednn_linear(x, self.packed)
        y = None
        if op_choice.runs_in_c("skinny_linear", x.shape[0]):
            y = custom_ops.skinny_linear_c(x, self.weight)
        return matmul(x, self.split) if y is None else y


# --- tensor parallelism ---------------------------------------------------------------------
def column_shard(w: torch.Tensor, sizes: list[int], rank: int, world_size: int) -> torch.Tensor:
    """This rank's output rows of a fused (out, in) weight whose rows are parts of `sizes`
    (q, k, v or gate, up): each part is cut into world_size equal slices, and the rank's
    slices are stacked again in the same order."""
    if world_size == 1:
        return w
    return torch.cat([part.chunk(world_size, dim=0)[rank] for part in w.split(sizes, dim=0)])


class ColumnParallelLinear(Linear):
    """y_local = x @ W_local^T: this rank's slice of the output, no communication."""

    def __init__(self, w: torch.Tensor, parts: int, tp: TPGroup, sizes: list[int] | None = None):
        super().__init__(column_shard(w, sizes or [w.shape[0]], tp.rank, tp.world_size), parts)


class RowParallelLinear(Linear):
    """y = sum over ranks of x_local @ W_local^T: the input columns are split (x_local is what
    the column-parallel layer before left on this rank), so the output is a partial sum, and
    the all-reduce adds the ranks' parts."""

    def __init__(self, w: torch.Tensor, parts: int, tp: TPGroup):
        super().__init__(w.chunk(tp.world_size, dim=1)[tp.rank], parts)
        self.tp = tp

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = super().__call__(x)
        return y if self.tp.world_size == 1 else self.tp.all_reduce(y.contiguous())


class VocabParallelEmbedding:
    """Each rank holds ceil(vocab / N) rows of the (vocab, hidden) table (the last slice padded
    with zeros). A lookup takes the ids in this rank's range, zeroes the others, and the
    all-reduce fills them in from the rank that holds them."""

    def __init__(self, w: torch.Tensor, tp: TPGroup):
        self.tp, self.vocab_size = tp, w.shape[0]
        self.rows = -(-self.vocab_size // tp.world_size)
        self.start = tp.rank * self.rows
        local = w[self.start:self.start + self.rows]
        if local.shape[0] < self.rows:
            local = torch.cat([local, local.new_zeros(self.rows - local.shape[0], w.shape[1])])
        self.weight = local.contiguous()

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return self.lookup(input_ids)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.rows)
        x = self.lookup(local.masked_fill(outside, 0))
        x[outside] = 0
        return self.tp.all_reduce(x)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """This rank's rows `ids` of the table (quant_linear.QuantLMHead dequantizes them)."""
        return self.weight[ids]


class ParallelLMHead(VocabParallelEmbedding):
    """The output head over this rank's vocabulary rows; logits() gathers the slices on the
    output rank, the only one that samples."""

    def __init__(self, w: torch.Tensor, parts: int, tp: TPGroup):
        super().__init__(w, tp)
        self.linear = Linear(self.weight, parts)
        self.weight = self.linear.weight  # one copy serves both the head and the lookups

    def logits(self, hidden: torch.Tensor, dst: int = 0) -> torch.Tensor | None:
        """(M, vocab) float32 on rank dst; None on the other ranks."""
        local = self.linear(hidden).float()
        full = self.tp.gather(local, dst)
        return None if full is None else full[:, :self.vocab_size]
