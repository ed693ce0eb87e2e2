"""q_linear's prefill way "mm" (custom_ops.q_linear_mm): the blocks dequantized in C into a scratch
matrix, then torch's sgemm, for prompt chunks of op_choice.PREFILL_ROWS rows and more where it
measured faster than the C GEMM (op_selection.py).

It gives the dequantized float32 matmul for Q4_0, Q4_1 and Q8_0, on the file's rows and on packed
rows (whose columns it permutes into lane order, x's with them), at odd M and N and K with and
without a tail of blocks past the packed groups; tensor-parallel slices add up to the whole; the
dispatcher takes it only where the table says so, falls back to the C GEMM where the matrix is
past its scratch limit, and the other ops at prefill rows keep their "many" choice.
"""

import pytest
import torch
from gguf import GGMLQuantizationType
from test_quant_linear import QTYPES, assert_matmul_close, quantized

from minivllm.distributed.parallel_state import TPGroup
from minivllm.model import csrc_build, custom_ops, op_choice, op_selection
from minivllm.model.quant_linear import (QuantColumnParallelLinear, QuantLinear,
                                         QuantRowParallelLinear, repack)


@pytest.fixture
def built():
    if csrc_build.load() is None:
        pytest.skip("the C ops are not built here")


@pytest.fixture
def table():
    previous = op_choice.set_table("c")
    yield
    op_choice.set_table(previous)


@pytest.mark.parametrize("packed", [False, True], ids=["file_rows", "packed"])
@pytest.mark.parametrize("k", [576, 1536, 64])  # groups and a tail, groups only, a tail only
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_mm_gives_the_dequantized_matmul(built, qtype, k, packed):
    w, reference = quantized(qtype, 37, k)
    w = repack(w) if packed else w
    for rows in (1, 129, 131):
        x = torch.randn(rows, k)
        mm, c = custom_ops.q_linear_mm(x, w), custom_ops.q_linear_c(x, w)
        assert_matmul_close(mm, x, reference)
        # float32 sums of k products in two orders: the bound scales with the outputs (~40 at
        # k 1536), as assert_matmul_close's does; a column out of place would miss by units
        torch.testing.assert_close(mm, c, rtol=1e-4, atol=1e-5 * float(c.abs().max()))


def test_mm_reuses_its_scratch_and_leaves_no_alias(built):
    """A smaller matrix after a larger one: the scratch is not reallocated, and an earlier
    result is not overwritten by a later call."""
    big, big_ref = quantized(GGMLQuantizationType.Q4_1, 70, 1536)
    small, small_ref = quantized(GGMLQuantizationType.Q8_0, 33, 576, seed=1)
    xb, xs = torch.randn(130, 1536), torch.randn(130, 576)
    first = custom_ops.q_linear_mm(xb, big)
    kept = first.clone()
    assert_matmul_close(custom_ops.q_linear_mm(xs, small), xs, small_ref)
    assert torch.equal(first, kept)
    assert_matmul_close(first, xb, big_ref)


def test_tensor_parallel_slices_through_mm_add_up(built, table):
    """Column slices stacked and row slices (whole blocks) summed give the whole product, with
    the prefill rows running through mm."""
    op_choice.set_table({**op_choice.table(), "q_linear/prefill": "mm"})
    w, reference = quantized(GGMLQuantizationType.Q4_1, 96, 1536)
    x = torch.randn(op_choice.PREFILL_ROWS + 3, 1536)
    ranks = [TPGroup(rank=r, world_size=3) for r in range(3)]
    columns = torch.cat([QuantColumnParallelLinear(w, tp)(x) for tp in ranks], dim=1)
    assert_matmul_close(columns, x, reference)
    partial = [QuantLinear.__call__(QuantRowParallelLinear(w, tp), x.chunk(3, dim=1)[tp.rank])
               for tp in ranks]
    assert_matmul_close(sum(partial), x, reference)


def test_the_dispatcher_takes_mm_only_at_prefill_rows_where_chosen(built, table, monkeypatch):
    calls = []
    real = custom_ops.q_linear_mm
    monkeypatch.setattr(custom_ops, "q_linear_mm",
                        lambda x, w, **kw: calls.append(x.shape[0]) or real(x, w, **kw))
    w, reference = quantized(GGMLQuantizationType.Q4_0, 40, 576)
    rows = op_choice.PREFILL_ROWS
    for m in (rows - 1, rows):  # "c" everywhere: no mm
        custom_ops.q_linear(torch.randn(m, 576), w)
    assert calls == []
    op_choice.set_table({**op_choice.table(), "q_linear/prefill": "mm"})
    for m in (8, rows - 1, rows, 3 * rows + 1):
        x = torch.randn(m, 576)
        assert_matmul_close(custom_ops.q_linear(x, w), x, reference)
    assert calls == [rows, 3 * rows + 1]


def test_a_matrix_past_the_scratch_limit_runs_the_c_gemm(built, table, monkeypatch):
    op_choice.set_table({**op_choice.table(), "q_linear/prefill": "mm"})
    monkeypatch.setattr(custom_ops, "MM_MAX_WEIGHTS", 100)
    w, reference = quantized(GGMLQuantizationType.Q8_0, 40, 576)
    x = torch.randn(op_choice.PREFILL_ROWS, 576)
    assert custom_ops.q_linear_mm(x, w) is None
    assert_matmul_close(custom_ops.q_linear(x, w), x, reference)


def test_other_ops_at_prefill_rows_keep_their_many_choice(table):
    op_choice.set_table({**op_choice.table(), "q_linear/prefill": "mm",
                         "add_rms_norm/many": "torch"})
    rows = op_choice.PREFILL_ROWS
    assert op_choice.choice("q_linear", rows) == "mm"
    assert op_choice.choice("q_linear", rows - 1) == "c"
    assert op_choice.choice("add_rms_norm", rows) == "torch"
    assert op_choice.runs_in_c("silu_and_mul", 4 * rows)
    assert not op_choice.runs_in_c("q_linear", rows)  # mm is not the C GEMM
    assert op_choice.choice("no_such_op", rows) == "torch"


def test_selection_names_mm_where_the_c_gemm_is_slower():
    def fast():
        return sum(range(50))

    def slow():
        return sum(range(50_000))

    assert op_selection.faster(slow, fast, other="mm")["choice"] == "mm"
    assert op_selection.faster(fast, slow, other="mm")["choice"] == "c"


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_bf16_is_the_matmul_to_bfloat16_precision(built, qtype):
    """The opt-in way rounds W, x and the product to bfloat16 (8 bits of mantissa): close to the
    float32 product, not equal to it."""
    w, reference = quantized(qtype, 37, 576)
    x = torch.randn(131, 576)
    ref = x.double() @ reference.double().t()
    out = custom_ops.q_linear_mm(x, repack(w), bf16=True)
    assert out.dtype == torch.float32
    err = (out.double() - ref).abs().max() / ref.abs().max()
    assert 0 < err < 2e-2


def test_the_prefill_way_follows_the_environment(built, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CUSTOM_OPS", "c")  # no measuring: every other op in C
    for way in ("c", "mm", "bf16"):
        monkeypatch.setenv(op_selection.PREFILL_ENV, way)
        table = op_selection.resolve()
        assert table["q_linear/prefill"] == way and table["q_linear/many"] == "c"
    monkeypatch.setenv(op_selection.PREFILL_ENV, "int3")
    with pytest.raises(ValueError, match="use one of"):
        op_selection.resolve()


def test_the_engines_greedy_tokens_are_the_same_with_mm_at_prefill(built, monkeypatch):
    """The bundled model in process, the chat prompts in one prefill step (well past
    PREFILL_ROWS rows), run with the prefill through the C GEMM and then through mm (the prefix
    cache emptied between): the same greedy tokens (under the near-tie rule, scored on the C
    run's tokens), and mm did run."""
    from test_reference import QUESTIONS
    from tiny_model import assert_greedy_match

    from minivllm import LLM, SamplingParams
    monkeypatch.setenv("MINIVLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("MINIVLLM_CUSTOM_OPS", "c")  # every op in C: nothing to measure
    calls = []
    real = custom_ops.q_linear_mm
    monkeypatch.setattr(custom_ops, "q_linear_mm",
                        lambda x, w, **kw: calls.append(x.shape[0]) or real(x, w, **kw))
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    tokens = {}
    previous = op_choice.table()
    try:
        with LLM() as llm:
            core = llm.engine_core.engine_core
            prompts = [llm.tokenizer.encode(llm.tokenizer.apply_chat_template(
                [{"role": "user", "content": q}])) for q in QUESTIONS]
            for way in ("c", "mm"):
                op_choice.set_table({**op_choice.table(), "q_linear/prefill": way})
                core.reset_prefix_cache()
                outs = llm.generate(prompts, params, use_tqdm=False)
                tokens[way] = [o.outputs[0].token_ids for o in outs]
                assert bool(calls) == (way == "mm")
            model = core.model_executor.driver_worker.model_runner.model
            assert sum(map(len, prompts)) >= op_choice.PREFILL_ROWS
            assert min(calls) >= op_choice.PREFILL_ROWS
            for q, prompt, ref, ours in zip(QUESTIONS, prompts, tokens["c"], tokens["mm"]):
                if ref != ours:
                    logits = model.score([*prompt, *ref])[len(prompt) - 1:-1]
                    assert_greedy_match(ref, ours, logits, 1e-3, repr(q))
    finally:
        op_choice.set_table(previous)
