"""Which fused ops run in C: a table {op key: "c" or "torch"}, set once when a model loads.

An op key is the op's name and its row class: "paged_decode/few" (1-7 rows: batch 1-7 decode)
or "paged_decode/many" (8 rows and more). The table only records a choice; op_selection.py
measures one and the model sets it at load (llama.py). Until then every op runs in torch, so a
first op call never starts hidden work. Benchmarks and tests set the table directly.

q_linear has a third class, "q_linear/prefill" (PREFILL_ROWS and more: prompt chunks), with a
third way to run: "mm", the blocks dequantized into a scratch matrix and torch's sgemm
(custom_ops.q_linear_mm), and an opt-in fourth, "bf16", the same in bfloat16 (other numbers);
ops without a prefill key use their "many" choice there.
"""

from __future__ import annotations

MANY_ROWS = 8  # rows from which an op counts as "many" (decode batches of 8+, prefill)
PREFILL_ROWS = 128  # rows from which q_linear counts as "prefill"
ROW_OPS = ("q_linear", "add_rms_norm", "silu_and_mul", "rope_and_cache", "paged_decode",
           "argmax_rows", "greedy_head")
OPS = (["skinny_linear/few"] + [f"{op}/{rows}" for op in ROW_OPS for rows in ("few", "many")]
       + ["q_linear/prefill"])

_table: dict[str, str] = dict.fromkeys(OPS, "torch")


def rows_class(rows: int) -> str:
    return "many" if rows >= MANY_ROWS else "few"


def choice(name: str, rows: int) -> str:
    """How op `name` runs at this many rows: "c", "torch" (a key the table lacks) or, for
    q_linear from PREFILL_ROWS rows, "mm" or "bf16"."""
    if rows >= PREFILL_ROWS and f"{name}/prefill" in _table:
        return _table[f"{name}/prefill"]
    return _table.get(f"{name}/{rows_class(rows)}", "torch")


def runs_in_c(name: str, rows: int) -> bool:
    """Whether op `name` runs in C at this many rows (a key the table lacks runs in torch)."""
    return choice(name, rows) == "c"


def table() -> dict[str, str]:
    return dict(_table)


def set_table(new: dict[str, str] | str) -> dict[str, str]:
    """Run the ops as `new` says from now on ("c" or "torch" for every op, or a table); returns
    the table it replaces, to restore."""
    global _table
    previous = _table
    _table = dict.fromkeys(OPS, new) if isinstance(new, str) else dict(new)
    return previous
