"""The Llama model code, the loaders and the sampler, on the tiny random model."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from minivllm.model.attention import AttentionMetadata, PrefillChunk
from minivllm.model.linear import SKINNY_BELOW, matmul, split_rows
from minivllm.model.llama import LlamaModel, fold_norm
from minivllm.model.loader import load_config, load_weights, unpermute_rope_rows
from minivllm.model.sampler import sample


@pytest.fixture(scope="module")
def model(tiny_dir):
    config = load_config(tiny_dir)
    return LlamaModel(config, load_weights(tiny_dir, config))


def test_hf_directory_matches_transformers(tiny_dir, model):
    """Our loader and model read the same HF directory as transformers' LlamaForCausalLM and
    give the same logits at every position: RMSNorm, RoPE, GQA, SwiGLU and the tied head."""
    from transformers import LlamaForCausalLM
    hf = LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    ids = list(range(3, 120))
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    ours = model.score(ids, block_size=8)
    assert ref.std() > 1.0  # logits spread: the comparison is not between near-constant vectors
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_interleaved_rope_on_gguf_rows_equals_rotate_half_on_unpermuted_rows():
    """llama.cpp stores q/k rows permuted for interleaved (GPT-J) RoPE. Undoing the permutation
    and applying rotate_half RoPE gives the same attention scores as interleaved RoPE on the
    rows as stored, so both layouts are right; mixing them is what breaks."""
    g = torch.Generator().manual_seed(0)
    heads, d, hidden, pos = 2, 8, 16, 5
    stored = torch.randn(heads * d, hidden, generator=g)  # rows as in the GGUF
    x = torch.randn(hidden, generator=g)
    theta = pos / 10000 ** (torch.arange(0, d, 2) / d)
    cos, sin = theta.cos(), theta.sin()

    def interleaved(v):  # pairs (2i, 2i+1)
        a, b = v[..., 0::2], v[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)

    def rotate_half(v):  # pairs (i, i + d/2)
        a, b = v[..., :d // 2], v[..., d // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    hf_rows = torch.from_numpy(unpermute_rope_rows(stored.numpy(), heads))
    q_gguf = interleaved((stored @ x).view(heads, d))
    q_hf = rotate_half((hf_rows @ x).view(heads, d))
    # the same vector up to a fixed reordering of dimensions: dot products agree
    torch.testing.assert_close(q_gguf @ q_gguf.T, q_hf @ q_hf.T)
    wrong = rotate_half((stored @ x).view(heads, d))
    assert not torch.allclose(wrong @ q_gguf.T, q_gguf @ q_gguf.T, atol=1e-3)


def test_mixed_decode_and_prefill_batch_matches_separate_runs(model):
    """One forward with two decodes, a first prompt chunk and a later chunk (context already
    cached) gives the logits of running each sequence alone."""
    bs, seqs = 4, [list(range(5, 5 + n)) for n in (9, 14, 11, 6)]
    alone = [model.score(s, bs) for s in seqs]
    kv = model.allocate_kv_cache(64, bs)
    tables = [torch.arange(i * 16, i * 16 + 16) for i in range(4)]
    # step 1: prefill everything but the last token of seqs 0 and 1, the first 5 of seq 2
    done = [len(seqs[0]) - 1, len(seqs[1]) - 1, 5, 0]
    for i in range(3):
        _run(model, kv, [(seqs[i], 0, done[i], tables[i])], bs)
    # step 2, one batch: decode seq 0 and 1, rest of seq 2 (with context), all of seq 3
    rows = [(seqs[0], done[0], 1, tables[0]), (seqs[1], done[1], 1, tables[1]),
            (seqs[2], done[2], len(seqs[2]) - done[2], tables[2]), (seqs[3], 0, len(seqs[3]), tables[3])]
    logits = _run(model, kv, rows, bs)
    ends = np.cumsum([n for _, _, n, _ in rows]) - 1
    for i, end in enumerate(ends):
        torch.testing.assert_close(logits[end], alone[i][-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[2:2 + len(seqs[2]) - 5], alone[2][5:], atol=1e-4, rtol=1e-4)


def _run(model, kv, rows, bs):
    """rows: (tokens, num_computed, num_new, block_table); decodes (num_new == 1) first."""
    ids, pos, slots, prefills, dec = [], [], [], [], []
    for tokens, start, n, table in rows:
        p = torch.arange(start, start + n)
        if n == 1:
            dec.append((table, start + 1))
        else:
            prefills.append(PrefillChunk(len(ids), len(ids) + n, start + n, table[:-(-(start + n) // bs)]))
        ids += tokens[start:start + n]
        pos.append(p)
        slots.append(table[p // bs] * bs + p % bs)
    meta = AttentionMetadata(slot_mapping=torch.cat(slots), num_decodes=len(dec), prefills=prefills)
    if dec:
        nb = max(-(-n // bs) for _, n in dec)
        meta.decode_block_tables = torch.stack([t[:nb] for t, _ in dec])
        meta.decode_seq_lens = torch.tensor([n for _, n in dec])
    with torch.inference_mode():
        return model.compute_logits(model.forward(torch.tensor(ids), torch.cat(pos), kv, meta))


def _params(b, temperature=1.0, top_p=1.0, top_k=0, seed=-1, step=0):
    f = lambda v, dt: torch.full((b,), v, dtype=dt)  # noqa: E731
    return (f(temperature, torch.float32), f(top_p, torch.float32), f(top_k, torch.int32),
            f(seed, torch.int64), f(step, torch.int32))


@pytest.mark.parametrize("rows", [1, 3, SKINNY_BELOW, 33])
@pytest.mark.parametrize("parts", [1, 2, 4])
def test_row_split_matmul_equals_x_times_w_transposed(rows, parts):
    """Both kernels (W @ x^T for few rows, x @ W^T for many), for contiguous inputs and for the
    column-major activations the few-rows kernel hands on."""
    g = torch.Generator().manual_seed(rows * 10 + parts)
    w, x = torch.randn(96, 40, generator=g), torch.randn(rows, 40, generator=g)
    for inp in (x, x.t().contiguous().t()):
        torch.testing.assert_close(matmul(inp, split_rows(w, parts)), x @ w.T)


def test_folded_norm_weight_gives_the_norm_then_matmul():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 64, generator=g), torch.randn(32, 64, generator=g)
    gain = 1 + 0.5 * torch.randn(64, generator=g)
    unfolded = F.rms_norm(x, (64,), gain, 1e-5) @ w.T
    folded = F.rms_norm(x, (64,), None, 1e-5) @ fold_norm(w, gain).T
    torch.testing.assert_close(folded, unfolded, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(F.rms_norm(x, (64,), None, 1e-5) @ w.T, unfolded, atol=1e-2)


def test_sampler_greedy_topk1_and_tiny_topp_pick_the_argmax():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    best = logits.argmax(-1)
    assert torch.equal(sample(logits, *_params(6, temperature=0.0)), best)
    assert torch.equal(sample(logits, *_params(6, top_k=1)), best)
    assert torch.equal(sample(logits, *_params(6, top_p=1e-6)), best)


def test_sampler_seed_is_reproducible_and_independent_of_the_batch():
    logits = torch.zeros(4, 1000)  # uniform: every draw is the noise alone
    a = sample(logits, *_params(4, seed=7, step=3))
    assert len(set(a.tolist())) == 1  # same seed and step: same token in every row
    b = sample(logits[:1], *_params(1, seed=7, step=3))
    assert a[0] == b[0]
    c = sample(logits[:1], *_params(1, seed=7, step=4))
    d = sample(logits[:1], *_params(1, seed=8, step=3))
    assert (c[0], d[0]) != (a[0], a[0])


def test_sampler_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).repeat(400, 1)
    picked = sample(logits, *_params(400, top_k=2))
    assert set(picked.tolist()) == {0, 1}
    probs = torch.softmax(logits[0], -1)  # top_p = p0 + p1/2 keeps exactly tokens 0 and 1
    picked = sample(logits, *_params(400, top_p=float(probs[0] + probs[1] / 2)))
    assert set(picked.tolist()) == {0, 1}
    picked = sample(logits, *_params(400, temperature=1.0))
    assert len(set(picked.tolist())) >= 4
