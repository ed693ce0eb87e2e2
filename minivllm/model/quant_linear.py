"""Linear layers on a GGUF's own quantized blocks (Q4_0, Q4_1, Q8_0), kept as the file stores
them and dequantized inside the matmul (csrc/quant_ops.c, or in torch where that is not built).

A quantized matrix reads 4.5-8.5 bits a weight instead of 32: at batch 1, where a step is a
pass over every weight, that is the step's time. The numbers are the same as the float32 path
on the dequantized weights, since the kernel computes with exactly those values (only the
order of the additions differs). Blocks run along a row (the input dimension), 32 weights
each, so a row is whole blocks: slicing output rows (column parallelism) cuts nothing, and
slicing input columns (row parallelism) cuts whole blocks where in / N is a multiple of 32.

The matrices, the output head included, are repacked at load (repack: the same bytes, each
row's blocks in groups of 16 with the blocks across the vector lanes, csrc/quant_blocks.h) where
the C kernels take that layout, since their batch-1 GEMV then does a group's per-block work in
one vector operation (csrc/quant_gemv.c). llama.cpp repacks Q4_0 for its CPU kernels at load
in the same spirit (its interleaved Q4_0 8x8 layout), as vLLM's CPU backend prepacks its weights.

RMSNorm's weight cannot be folded into a quantized matrix (llama.py fold_norm) without
re-quantizing it; the norm applies it instead (llama.py LayerWeights.input_norm, post_norm).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from minivllm.distributed.parallel_state import TPGroup
from minivllm.model import csrc_build, custom_ops
from minivllm.model.linear import ParallelLMHead, VocabParallelEmbedding, column_shard

QUANT_TYPES = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0)
QK = 32  # weights per block, in all three
GROUP = 16  # blocks per packed group (csrc/quant_blocks.h)
PACKED_FLAG = 0x100  # on the qtype the C kernels take: packed rows (Q_PACKED)


@dataclass
class QuantWeight:
    """An (out, in) matrix as its blocks: data (out, in / 32 * block bytes) uint8, each row
    in the file's layout or, with packed, in the kernels' packed layout (see repack)."""
    data: torch.Tensor
    qtype: GGMLQuantizationType
    in_features: int
    packed: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return self.data.shape[0], self.in_features

    def float(self) -> torch.Tensor:
        """The dequantized (out, in) float32 matrix: the values the kernel computes with."""
        return dequantize_torch(self.blocks(), self.qtype, self.in_features)

    def blocks(self) -> torch.Tensor:
        """data in the file's layout (packed rows un-interleaved into a copy)."""
        return file_layout(self.data, self.qtype, self.in_features) if self.packed else self.data

    def rows(self, data: torch.Tensor) -> "QuantWeight":
        """Rows of data (whole rows of this weight's bytes) as a weight of this type."""
        return QuantWeight(data.contiguous(), self.qtype, self.in_features, self.packed)

    @property
    def kernel_qtype(self) -> int:
        """The type argument of the C kernels: the ggml type, flagged where packed."""
        return int(self.qtype) | (PACKED_FLAG if self.packed else 0)


def from_gguf_bytes(raw: np.ndarray, qtype: GGMLQuantizationType,
                    shape: tuple[int, int]) -> QuantWeight:
    return QuantWeight(torch.from_numpy(raw.reshape(shape[0], -1).copy()), qtype, shape[1])


def cat(pieces: list[QuantWeight]) -> QuantWeight | None:
    """The pieces stacked by rows, or None where they are not all of one type and width."""
    if len({(p.qtype, p.in_features, p.packed) for p in pieces}) != 1:
        return None
    return pieces[0].rows(torch.cat([p.data for p in pieces]))


def repack(w: QuantWeight) -> QuantWeight:
    """w with its rows packed (csrc/quant_blocks.h) where the C kernels take packed rows (a
    vector build), else w as it is."""
    lib = csrc_build.load()
    if w.packed or lib is None or not lib.q_takes_packed(int(w.qtype)):
        return w
    src = w.data.contiguous()
    out = torch.empty_like(src)
    rc = lib.q_repack(src.data_ptr(), out.data_ptr(), src.shape[0], w.in_features, int(w.qtype))
    if rc:
        raise RuntimeError(f"q_repack failed with code {rc} on a {w.qtype.name} {w.shape}")
    return QuantWeight(out, w.qtype, w.in_features, packed=True)


def file_layout(data: torch.Tensor, qtype: GGMLQuantizationType, k: int) -> torch.Tensor:
    """Packed rows (out, bytes) -> the same blocks in the file's layout: each whole group's
    GROUP scales (d, then m for Q4_1) and its rows of GROUP quant bytes back into blocks."""
    n, block_bytes = data.shape[0], GGML_QUANT_SIZES[qtype][1]
    groups, scale_bytes = k // (QK * GROUP), 4 if qtype == GGMLQuantizationType.Q4_1 else 2
    head = groups * GROUP * block_bytes
    g = data[:, :head].reshape(n, groups, GROUP * block_bytes)
    scales = g[..., :GROUP * scale_bytes].reshape(n, groups, scale_bytes // 2, GROUP, 2)
    quants = g[..., GROUP * scale_bytes:].reshape(n, groups, block_bytes - scale_bytes, GROUP)
    blocks = torch.cat([scales.transpose(2, 3).reshape(n, groups, GROUP, scale_bytes),
                        quants.transpose(2, 3)], dim=-1)
    return torch.cat([blocks.reshape(n, head), data[:, head:]], dim=1)


def dequantize_torch(data: torch.Tensor, qtype: GGMLQuantizationType, k: int) -> torch.Tensor:
    """Blocks (out, in / 32 * bytes) -> (out, in) float32, as gguf-py's quants.py does."""
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    b = data.view(data.shape[0], -1, block_bytes)
    d = b[..., :2].contiguous().view(torch.float16).float()
    if qtype == GGMLQuantizationType.Q8_0:
        w = b[..., 2:].contiguous().view(torch.int8).float() * d
    else:
        qs = b[..., 4:] if qtype == GGMLQuantizationType.Q4_1 else b[..., 2:]
        q = torch.cat([qs & 0xF, qs >> 4], dim=-1).float()
        if qtype == GGMLQuantizationType.Q4_1:
            w = d * q + b[..., 2:4].contiguous().view(torch.float16).float()
        else:
            w = d * (q - 8)
    return w.reshape(data.shape[0], k)


class QuantLinear:
    """y = x @ W^T with W in blocks, packed at load where the kernels take it (repack)."""

    def __init__(self, w: QuantWeight, pack: bool = True):
        self.weight = repack(w) if pack else w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return custom_ops.q_linear(x, self.weight)


class QuantColumnParallelLinear(QuantLinear):
    """linear.ColumnParallelLinear on blocks: this rank's output rows."""

    def __init__(self, w: QuantWeight, tp: TPGroup, sizes: list[int] | None = None):
        rows = column_shard(w.data, sizes or [w.shape[0]], tp.rank, tp.world_size)
        super().__init__(w.rows(rows))


def row_shardable(w: QuantWeight, world_size: int) -> bool:
    """Whether in / world_size is whole blocks (else the layer keeps float weights)."""
    return w.in_features % (QK * world_size) == 0


class QuantRowParallelLinear(QuantLinear):
    """linear.RowParallelLinear on blocks: this rank's input columns, whole blocks of them,
    then the all-reduce of the partial sums."""

    def __init__(self, w: QuantWeight, tp: TPGroup):
        if not row_shardable(w, tp.world_size):
            raise ValueError(f"{w.in_features} input columns do not split into whole blocks "
                             f"of {QK} over {tp.world_size} ranks")
        blocks = w.blocks().view(w.shape[0], -1, GGML_QUANT_SIZES[w.qtype][1])
        local = blocks.chunk(tp.world_size, dim=1)[tp.rank].reshape(w.shape[0], -1)
        super().__init__(QuantWeight(local.contiguous(), w.qtype,
                                     w.in_features // tp.world_size))
        self.tp = tp

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = super().__call__(x)
        return y if self.tp.world_size == 1 else self.tp.all_reduce(y.contiguous())


class QuantLMHead(ParallelLMHead):
    """linear.ParallelLMHead on blocks (a GGUF's Q8_0 token_embd, tied): this rank's vocabulary
    rows of blocks (the last slice padded with zero blocks, which dequantize to 0); the logits
    through q_linear, the embedding lookups dequantizing only the rows they take."""

    def __init__(self, w: QuantWeight, tp: TPGroup):
        VocabParallelEmbedding.__init__(self, w.data, tp)  # slices the rows of bytes
        self.blocks = repack(w.rows(self.weight))
        self.weight = self.blocks.data  # lookup reads the same bytes as the head
        self.linear = QuantLinear(self.blocks, pack=False)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return self.blocks.rows(self.weight[ids]).float()
