"""The model's fused ops: the C version (csrc/cpu_ops.c) where it is built, the tensors are
float32 and it measured faster than torch on this CPU (op_selection.py), else the torch version,
which is also the reference the tests compare against.

Each op has two explicit entry points, `<op>_c` (None where the C op cannot run the call: not
built, not float32, a shape past its limits; the KV cache may also be float16 or bfloat16,
KV_TYPES) and `<op>_torch`, and a dispatcher `<op>` that follows op_choice.py's table. Decode
attention's and skinny_linear's torch versions live with their callers (attention.decode_torch,
linear.matmul).

Most are custom ops in vLLM too (vllm/_custom_ops.py). Why they pay: decode attention in torch
must first gather every sequence's blocks into a copy, and each of the other torch versions is
several ops, where at 32 rows each op costs more in dispatch and in passes over memory than in
arithmetic (`minivllm bench throughput` measures the difference on this CPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.model import csrc_build, op_choice
from minivllm.model.kv_layout import key_blocks, value_blocks, write_kv


# The KV cache's element types, as the C ops number them (csrc/kv_dtype.h)
KV_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def kv_type(kv_cache: torch.Tensor) -> int | None:
    """The C ops' number for the cache's dtype; None for one they do not take."""
    return KV_TYPES.get(kv_cache.dtype)


def _lib(*tensors: torch.Tensor | None):
    """The C library where it is built and every tensor given is float32, else None."""
    if any(t is not None and t.dtype != torch.float32 for t in tensors):
        return None
    return csrc_build.load()


def _dispatch(name: str, rows: int, c_fn, torch_fn, *args, **kwargs):
    """c_fn where op_choice says `name` runs in C at this many rows and c_fn can run it (it
    returns None where it cannot), else torch_fn."""
    if op_choice.runs_in_c(name, rows):
        out = c_fn(*args, **kwargs)
        if out is not None:
            return out
    return torch_fn(*args, **kwargs)


def _check(rc: int, name: str) -> None:
    if rc:
        raise RuntimeError(f"C op {name} failed with code {rc}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
             delta: torch.Tensor | None = None) -> torch.Tensor:
    """x += delta in place (when given), then RMSNorm(x) (scaled by weight when given)."""
    return _dispatch("add_rms_norm", x.shape[0], rms_norm_c, rms_norm_torch, x, weight, eps, delta)


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
                   delta: torch.Tensor | None = None) -> torch.Tensor:
    if delta is not None:
        x += delta
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rms_norm_c(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
               delta: torch.Tensor | None = None) -> torch.Tensor | None:
    ops = _lib(x, weight, delta)
    if ops is None or not x.is_contiguous():
        return None
    delta = None if delta is None else delta.contiguous()
    out = torch.empty_like(x)
    _check(ops.add_rms_norm(x.data_ptr(), None if delta is None else delta.data_ptr(),
                            None if weight is None else weight.data_ptr(), out.data_ptr(),
                            x.shape[0], x.shape[1], eps), "add_rms_norm")
    return out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """(n, 2I) -> silu(gate) * up, (n, I)."""
    return _dispatch("silu_and_mul", gate_up.shape[0], silu_and_mul_c, silu_and_mul_torch, gate_up)


def silu_and_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    half = gate_up.shape[1] // 2
    return F.silu(gate_up[:, :half]).mul_(gate_up[:, half:])


def silu_and_mul_c(gate_up: torch.Tensor) -> torch.Tensor | None:
    ops = _lib(gate_up)
    if ops is None:
        return None
    n, two_i = gate_up.shape
    gate_up = gate_up.contiguous()
    out = torch.empty(n, two_i // 2)
    _check(ops.silu_and_mul(gate_up.data_ptr(), out.data_ptr(), n, two_i // 2), "silu_and_mul")
    return out


def rope_and_cache(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                   kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """RoPE on the q and k heads of qkv (n, (H + 2 KVH) D), in place, with the rotate_half
    tables (cos, sin by position; sin carries the sign), then k and v into the cache."""
    _dispatch("rope_and_cache", qkv.shape[0], rope_and_cache_c, rope_and_cache_torch, qkv,
              positions, cos, sin, num_heads, num_kv_heads, head_dim, kv_cache, slot_mapping)


def rope_and_cache_torch(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                         kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> bool:
    n = qkv.shape[0]
    qk = qkv[:, :(num_heads + num_kv_heads) * head_dim].view(n, -1, head_dim)
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]
    torch.addcmul(qk * c, qk.roll(head_dim // 2, -1), s, out=qk)
    kv = qkv[:, num_heads * head_dim:].view(n, 2, num_kv_heads, head_dim)
    write_kv(kv[:, 0], kv[:, 1], kv_cache, slot_mapping)
    return True


def rope_and_cache_c(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                     kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> bool | None:
    """True once done; None where the C op cannot run it (then nothing was written)."""
    ops, kt = _lib(qkv, cos), kv_type(kv_cache)
    if ops is None or qkv.stride(1) != 1 or kt is None:
        return None
    keys, values = key_blocks(kv_cache, head_dim), value_blocks(kv_cache, head_dim)
    positions, slots = (t.to(torch.int64).contiguous() for t in (positions, slot_mapping))
    rc = ops.rope_and_cache(qkv.data_ptr(), qkv.stride(0), qkv.shape[0], positions.data_ptr(),
                            cos.data_ptr(), sin.data_ptr(), num_heads, num_kv_heads,
                            head_dim, keys.data_ptr(), values.data_ptr(), keys.shape[1],
                            keys.shape[3], slots.data_ptr(), kt)
    return True if rc == 0 else None  # -1: a head size the C op does not take


def paged_decode_c(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                   seq_lens: torch.Tensor, scale: float) -> torch.Tensor | None:
    """Decode attention, q (n, H, D) -> (n, H * D), in C; None where the C op cannot run it
    (not built, q not float32, a shape past its limits). The cache may be 16-bit (KV_TYPES). Its
    torch version is attention.decode_torch; attention.py dispatches."""
    ops, kt = _lib(q), kv_type(kv_cache)
    if ops is None or kt is None:
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
                          scale, kt)
    check_attention(rc, "paged_decode")
    return out if rc == 0 else None


def check_attention(rc: int, name: str) -> None:
    """Raise for paged_decode's errors (also decode_layers', which runs it): -2 no memory for
    the scores, -3 a sequence longer than its block table. -1 (a shape it does not take) and 0
    are the caller's."""
    if rc == -2:
        raise MemoryError(f"{name}: no memory for the attention scores")
    if rc == -3:
        raise ValueError("a sequence is longer than its block table holds")


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """(B, V) -> (B,) int64: the greedy tokens."""
    rows = logits.shape[0] if logits.dim() else 0
    return _dispatch("argmax_rows", rows, argmax_c, argmax_torch, logits)


def argmax_torch(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


def argmax_c(logits: torch.Tensor) -> torch.Tensor | None:
    ops = _lib(logits)
    if ops is None or not logits.is_contiguous() or logits.dim() != 2 or logits.shape[1] == 0:
        return None
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    _check(ops.argmax_rows(logits.data_ptr(), out.data_ptr(), *logits.shape), "argmax_rows")
    return out


def skinny_linear_c(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """x (M, K) @ w^T for w (N, K) and 1 <= M <= 7 rows -> (M, N), or None where the C op does
    not run it (not built, not float32, more rows, odd N). Its torch version is linear.matmul;
    linear.Linear dispatches."""
    ops = _lib(x, w)
    if ops is None or not w.is_contiguous() or not 1 <= x.shape[0] < op_choice.MANY_ROWS:
        return None
    x = x.contiguous()
    out = torch.empty(x.shape[0], w.shape[0])
    rc = ops.skinny_linear(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.shape[0], *w.shape)
    return out if rc == 0 else None


def gemm_row_multiple() -> int:
    """Rows the C GEMM computes as one (a vector of rows: 16 with AVX-512, 8 with AVX2): a
    matmul costs about the same for any row count up to the next multiple. 1 without the C ops."""
    lib = csrc_build.load()
    return 1 if lib is None else lib.q_gemm_rows()


def q_linear(x: torch.Tensor, w) -> torch.Tensor:
    """x (M, in) float32 @ W^T for W a quant_linear.QuantWeight (the GGUF's blocks) -> (M, out)."""
    way = op_choice.choice("q_linear", x.shape[0])
    if way in ("mm", "bf16"):
        out = q_linear_mm(x, w, bf16=way == "bf16")
        if out is not None:
            return out
        return _dispatch("q_linear", op_choice.MANY_ROWS, q_linear_c, q_linear_torch, x, w)
    return _dispatch("q_linear", x.shape[0], q_linear_c, q_linear_torch, x, w)


def q_linear_torch(x: torch.Tensor, w) -> torch.Tensor:
    """The blocks dequantized on every call, then one matmul: the reference, and slow."""
    return x @ w.float().t()


def q_linear_c(x: torch.Tensor, w) -> torch.Tensor | None:
    ops = _lib(x)
    if ops is None or x.dim() != 2:
        return None
    x = x.contiguous()
    out = torch.empty(x.shape[0], w.shape[0])
    rc = ops.q_linear(x.data_ptr(), w.data.data_ptr(), out.data_ptr(), x.shape[0], *w.shape,
                      w.kernel_qtype)
    if rc == -2:
        raise MemoryError("q_linear: no memory for the unpacked tile")
    return out if rc == 0 else None


MM_MAX_WEIGHTS = 1 << 22  # q_linear_mm's largest matrix (16 MB of floats): a layer's, not the head
_mm_scratch = torch.empty(0)
_bf16_scratch = torch.empty(0, dtype=torch.bfloat16)


def q_linear_mm(x: torch.Tensor, w, bf16: bool = False) -> torch.Tensor | None:
    """q_linear as the blocks dequantized (in C, into a scratch matrix kept for the next call)
    then torch's sgemm: the same values as q_linear_c, summed in another order. A packed W
    dequantizes with its columns in lane order, so x is put in that order too. None where it
    cannot run: not built, not float32, W past MM_MAX_WEIGHTS.

    bf16 (opt-in, op_selection.PREFILL_ENV): W, x and the product rounded to bfloat16 around
    oneDNN's bf16 GEMM, twice float32's rate where the CPU has avx512_bf16 (or AMX). Not the
    float32 numbers: each value keeps 8 bits of mantissa, so greedy tokens may change."""
    global _mm_scratch, _bf16_scratch
    ops = _lib(x)
    n, k = w.shape
    if ops is None or x.dim() != 2 or n * k > MM_MAX_WEIGHTS:
        return None
    if _mm_scratch.numel() < n * k:
        _mm_scratch = torch.empty(n * k)
    wf = _mm_scratch[:n * k].view(n, k)
    _check(ops.q_dequant(w.data.data_ptr(), wf.data_ptr(), n, k, w.kernel_qtype), "q_dequant")
    x = x.contiguous()
    if w.packed:
        lanes = torch.empty_like(x)
        _check(ops.q_lane_order(x.data_ptr(), lanes.data_ptr(), x.shape[0], k, w.kernel_qtype),
               "q_lane_order")
        x = lanes
    if not bf16:
        return torch.mm(x, wf.t())
    if _bf16_scratch.numel() < n * k:
        _bf16_scratch = torch.empty(n * k, dtype=torch.bfloat16)
    wb = _bf16_scratch[:n * k].view(n, k).copy_(wf)
    return torch.mm(x.bfloat16(), wb.t()).float()
