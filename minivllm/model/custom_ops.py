"""The model's fused ops: the C version (csrc/cpu_ops.c) where it is built, the tensors are
float32 and it measured faster than torch on this CPU (op_selection.py), else the torch version,
which is also the reference the tests compare against.

Most are custom ops in vLLM too (vllm/_custom_ops.py). On the 2-core machine this was written
on, they took a batch-32 decode step of SmolLM2 from about 40 to 33 ms: decode attention in
torch must first gather every sequence's blocks into a copy (about 4 ms a step), and each of
the other torch versions is several ops, where at 32 rows each op costs more in dispatch and in
passes over memory than in arithmetic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.model import cpu_features, csrc_build, op_selection
from minivllm.model.kv_layout import key_blocks, value_blocks, write_kv

_choices: dict[str, str] | None = None  # op key ("paged_decode/many") -> "c" or "torch"


def choices() -> dict[str, str]:
    """Which ops run in C, resolved on first use (op_selection.resolve: measured or cached)."""
    global _choices
    if _choices is None:
        _choices = op_selection.resolve()
    return _choices


def set_choices(new: dict[str, str] | str | None) -> dict[str, str] | None:
    """Run the ops as `new` says from now on ("c" or "torch" for all of them, None: resolve
    again on next use); returns what it replaces, to restore. The bench interleaves all-C,
    all-torch and the measured choice in one run this way."""
    global _choices
    previous = _choices
    _choices = dict.fromkeys(op_selection.OPS, new) if isinstance(new, str) else new
    return previous


def prepare(dtype: torch.dtype) -> None:
    """At model load, not in the first step: in float32, build the C ops and choose which run
    here (timed once per CPU, then cached); in bfloat16 on a CPU without it, warn (once)."""
    if dtype == torch.float32:
        choices()
    else:
        cpu_features.warn_if_bf16_emulated(dtype)


def _ops(name: str, rows: int, *tensors: torch.Tensor | None):
    """The C library when op `name` runs in C at this many rows and every tensor given is
    float32, else None."""
    for t in tensors:
        if t is not None and t.dtype != torch.float32:
            return None
    if choices().get(f"{name}/{op_selection.rows_class(rows)}") != "c":
        return None
    return csrc_build.load()


def _check(rc: int, name: str) -> None:
    if rc:
        raise RuntimeError(f"C op {name} failed with code {rc}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
             delta: torch.Tensor | None = None) -> torch.Tensor:
    """x += delta in place (when given), then RMSNorm(x) (scaled by weight when given)."""
    ops = _ops("add_rms_norm", x.shape[0], x, weight, delta)
    if ops is None or not x.is_contiguous():
        if delta is not None:
            x += delta
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    delta = None if delta is None else delta.contiguous()
    out = torch.empty_like(x)
    _check(ops.add_rms_norm(x.data_ptr(), None if delta is None else delta.data_ptr(),
                            None if weight is None else weight.data_ptr(), out.data_ptr(),
                            x.shape[0], x.shape[1], eps), "add_rms_norm")
    return out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """(n, 2I) -> silu(gate) * up, (n, I)."""
    n, two_i = gate_up.shape
    ops = _ops("silu_and_mul", n, gate_up)
    if ops is None:
        return F.silu(gate_up[:, :two_i // 2]).mul_(gate_up[:, two_i // 2:])
    gate_up = gate_up.contiguous()
    out = torch.empty(n, two_i // 2)
    _check(ops.silu_and_mul(gate_up.data_ptr(), out.data_ptr(), n, two_i // 2), "silu_and_mul")
    return out


def rope_and_cache(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                   kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """RoPE on the q and k heads of qkv (n, (H + 2 KVH) D), in place, with the rotate_half
    tables (cos, sin by position; sin carries the sign), then k and v into the cache."""
    ops = _ops("rope_and_cache", qkv.shape[0], qkv, cos, kv_cache)
    if ops is not None and qkv.stride(1) == 1:
        keys, values = key_blocks(kv_cache, head_dim), value_blocks(kv_cache, head_dim)
        positions, slots = (t.to(torch.int64).contiguous() for t in (positions, slot_mapping))
        rc = ops.rope_and_cache(qkv.data_ptr(), qkv.stride(0), qkv.shape[0], positions.data_ptr(),
                                cos.data_ptr(), sin.data_ptr(), num_heads, num_kv_heads,
                                head_dim, keys.data_ptr(), values.data_ptr(), keys.shape[1],
                                keys.shape[3], slots.data_ptr())
        if rc == 0:
            return  # -1: a head size the C op does not take; torch does it
    n = qkv.shape[0]
    qk = qkv[:, :(num_heads + num_kv_heads) * head_dim].view(n, -1, head_dim)
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]
    torch.addcmul(qk * c, qk.roll(head_dim // 2, -1), s, out=qk)
    kv = qkv[:, num_heads * head_dim:].view(n, 2, num_kv_heads, head_dim)
    write_kv(kv[:, 0], kv[:, 1], kv_cache, slot_mapping)


def paged_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float) -> torch.Tensor | None:
    """Decode attention, q (n, H, D) -> (n, H * D), in C; None where the C op cannot run it
    (not built, not float32, a shape past its limits): attention.py then runs torch."""
    ops = _ops("paged_decode", q.shape[0], q, kv_cache)
    if ops is None:
        return None
    n, heads, head_dim = q.shape
    keys, values = key_blocks(kv_cache, head_dim), value_blocks(kv_cache, head_dim)
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        q = q.contiguous()
    tables, lens = (t.to(torch.int64).contiguous() for t in (block_tables, seq_lens))
    out = torch.empty(n, heads * head_dim)
    rc = ops.paged_decode(q.data_ptr(), q.stride(0), keys.data_ptr(), values.data_ptr(),
                          tables.data_ptr(), lens.data_ptr(), out.data_ptr(), n, heads,
                          keys.shape[0], head_dim, keys.shape[1], keys.shape[3], tables.shape[1],
                          scale)
    if rc == -2:
        raise MemoryError("paged_decode: no memory for the scores")
    if rc == -3:
        raise ValueError("a sequence is longer than its block table holds")
    return out if rc == 0 else None


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """(B, V) -> (B,) int64: the greedy tokens."""
    ops = _ops("argmax_rows", logits.shape[0] if logits.dim() else 0, logits)
    if ops is None or not logits.is_contiguous() or logits.dim() != 2 or logits.shape[1] == 0:
        return logits.argmax(dim=-1)
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    _check(ops.argmax_rows(logits.data_ptr(), out.data_ptr(), *logits.shape), "argmax_rows")
    return out


def skinny_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """x (M, K) @ w^T for w (N, K) and 1 <= M <= 7 rows -> (M, N), or None where the C op does
    not run it (not built, not float32, more rows, odd N): llama.Linear then uses its bmm."""
    ops = _ops("skinny_linear", x.shape[0], x, w)
    if ops is None or not w.is_contiguous():
        return None
    x = x.contiguous()
    out = torch.empty(x.shape[0], w.shape[0])
    rc = ops.skinny_linear(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.shape[0], *w.shape)
    return out if rc == 0 else None
