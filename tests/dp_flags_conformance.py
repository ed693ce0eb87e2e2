"""What vLLM 0.33.0 does with `vllm serve` DP and API-server flags, one row per combination: the
node's layout (the DP ranks whose engines start here, the API servers, the LB mode, the
transport between them) or its error, and the `path:line` in the vllm wheel that decides it.

The `vllm` column was checked by running vLLM's own code: tests/dp_flags_vllm_check.py parses
each row's flags with vLLM's serve parser, runs ServeSubcommand.validate and .cmd (the
API-server count and LB-mode step) and EngineArgs.create_engine_config up to the
ParallelConfig it builds (with its checks), on a tiny dense Llama and a tiny MoE config.
test_dp_flags_conformance.py checks that minivllm resolves every row the same way; where
minivllm refuses what vLLM runs, the row says so (`minivllm=`) and why.

Paths are relative to the wheel's vllm/ package:
    serve.py    entrypoints/cli/serve.py        arg_utils   engine/arg_utils.py
    parallel    config/parallel.py              utils       v1/engine/utils.py
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    engines: tuple[int, ...]
    api_servers: int  # 0: headless
    mode: str  # internal | hybrid | external | multi-port
    transport: str  # ipc | tcp | workers (a headless node of TP workers only)


@dataclass(frozen=True)
class Error:
    vllm_says: str  # in vLLM's message (AssertionError: a bare assert)
    minivllm_says: str = ""  # a regex minivllm's message matches (default: vllm_says)


@dataclass(frozen=True)
class Row:
    flags: str
    vllm: Layout | Error
    cite: str
    moe: bool = False
    minivllm: Error | None = None  # where minivllm refuses what vLLM runs


def L(engines, api, mode, transport):
    return Layout(tuple(engines), api, mode, transport)


E = Error
HEADLESS_ASC = "cannot be used with --headless"
MANY = "Cannot use more than one data parallel load balancing mode"
NON_MOE = "Non-MoE models do not support external data parallel mode"
NEEDS_RANK = "requires a data-parallel rank"
DP1_EXTERNAL = "data_parallel_external_lb can only be set when data_parallel_size > 1"
NOT_LEADER = E("AssertionError", "is not the leader")
SERVE_DEFAULT = "serve.py:124-125 (API servers = -dp), arg_utils:2535 (-dpl = -dp)"

ROWS = [
    # internal load balancing: the front end on DP rank 0's node, the others --headless
    Row("", L([0], 1, "internal", "ipc"), SERVE_DEFAULT),
    Row("-dp 4", L(range(4), 4, "internal", "ipc"), SERVE_DEFAULT + ", utils:1144-1146"),
    Row("-dp 4 -asc 1", L(range(4), 1, "internal", "ipc"), "serve.py:113 (a count given)"),
    Row("-dp 2 -asc 3", L([0, 1], 3, "internal", "ipc"), "serve.py:113"),
    Row("-dp 2 -dpl 2", L([0, 1], 2, "internal", "ipc"), "arg_utils:2486-2487, utils:1144-1146"),
    Row("-dp 4 -dpl 2", L([0, 1], 4, "internal", "tcp"), "arg_utils:2507-2511, utils:1153-1156"),
    Row("-dp 4 --nnodes 2 --node-rank 0", L([0, 1], 4, "internal", "tcp"),
        "arg_utils:2442-2446 (-dpl from --nnodes), utils:1153-1156"),
    Row("-dp 4 --nnodes 2 --node-rank 1 --headless", L([2, 3], 0, "internal", "tcp"),
        "serve.py:69-77, arg_utils:2421-2424 (rank from --node-rank), serve.py:247-249"),
    Row("-dp 4 -n 2 -r 1 -asc 0", L([2, 3], 0, "internal", "tcp"), "serve.py:149-150"),
    Row("-dp 4 --nnodes 2 --node-rank 1", NOT_LEADER, "serve.py:325"),
    Row("-dp 4 --nnodes 2 --node-rank 1 -asc 1", NOT_LEADER, "utils:1328-1331"),
    Row("-dp 2 -tp 2 --nnodes 2 --node-rank 0", L([0], 2, "internal", "tcp"),
        "arg_utils:2398-2446 (nnodes over DP x TP)"),
    Row("-dp 2 -tp 2 --nnodes 2 --node-rank 1 --headless", L([1], 0, "internal", "tcp"),
        "arg_utils:2421-2424, 2442-2446"),
    Row("-tp 2 --nnodes 2 --node-rank 1 --headless", L([0], 0, "internal", "workers"),
        "serve.py:218 (node_rank_within_dp > 0: TP workers), parallel:807-836"),
    Row("-dp 2 -dpl 1 -dpr 1 --headless", L([1], 0, "internal", "tcp"),
        "arg_utils:2489-2491 (no hybrid when headless), 2507-2511"),
    Row("-dp 4 -dpl 2 -dpr 2 --headless", L([2, 3], 0, "internal", "tcp"), "arg_utils:2489-2511"),
    Row("-dp 2 -dpr 1 --headless", L([0, 1], 0, "internal", "tcp"),
        "arg_utils:2533-2535 (-dpr read only with -dpl), 2574 (rank 0)"),
    Row("-dp 2 -dpr 1", L([0, 1], 1, "internal", "ipc"),
        "serve.py:94, 116-117 (hybrid count: -dpl or 1), arg_utils:2533-2535, 2574"),
    Row("--headless", L([0], 0, "internal", "tcp"), "serve.py:69-77, 247-249"),
    Row("-dp 2 -asc 0", L([0, 1], 0, "internal", "tcp"), "serve.py:149-150"),
    Row("-dp 2 -dpl 1 -dpr 1 -asc 0", L([1], 0, "internal", "tcp"),
        "serve.py:149-150, 192-194 (headless=True: no hybrid)"),
    Row("--headless -asc 1 -dp 2", E(HEADLESS_ASC), "serve.py:69-75"),
    Row("--headless -asc 2 -dp 2 -dpl 1 -dpr 1", E(HEADLESS_ASC), "serve.py:69-75"),
    Row("--headless --api-server-count 0 -dp 2 -dpl 1 -dpr 1", L([1], 0, "internal", "tcp"),
        "serve.py:69-77"),
    # hybrid: API servers on every node for its own engines
    Row("-dp 4 -dpl 2 -dpr 0", L([0, 1], 2, "hybrid", "ipc"),
        "serve.py:116-117, arg_utils:2489-2491, utils:1144-1146"),
    Row("-dp 4 -dpl 2 -dpr 2", L([2, 3], 2, "hybrid", "ipc"), "arg_utils:2489-2491, 2507-2511"),
    Row("-dp 4 -dpl 2 -dpr 2 -asc 1", L([2, 3], 1, "hybrid", "ipc"), "serve.py:113"),
    Row("-dp 4 --nnodes 2 --node-rank 1 -dpr 2", L([2, 3], 1, "hybrid", "ipc"),
        "serve.py:116-117 (-dpl as typed, else 1), arg_utils:2442-2446"),
    Row("-dp 4 -dph -dpl 2", L([0, 1], 2, "hybrid", "ipc"), "arg_utils:2507-2511 (rank 0)"),
    Row("-dp 4 -dph -dpl 2 --nnodes 2 --node-rank 1", L([2, 3], 2, "hybrid", "ipc"),
        "arg_utils:2421-2424, 2507-2511"),
    Row("-dp 4 -dph --nnodes 2 --node-rank 1", L([2, 3], 1, "hybrid", "ipc"),
        "serve.py:116-117, arg_utils:2442-2446"),
    # --no- forms (BooleanOptionalAction, arg_utils:384-386): from reading, not the generator
    Row("-dp 4 -dpl 2 -dpr 2 --no-data-parallel-hybrid-lb", L([2, 3], 2, "hybrid", "ipc"),
        "serve.py:89-94 (-dpr still infers hybrid), arg_utils:2489-2491"),
    Row("-dp 2 --no-data-parallel-external-lb", L([0, 1], 2, "internal", "ipc"),
        "serve.py:83-85, 125, arg_utils:2447-2449"),
    Row("-dp 4 -dph", E("requires `--data-parallel-size-local`", "requires --data-parallel-size-local"),
        "arg_utils:2519-2525"),
    Row("-dp 2 -dpl 2 -dpr 0", L([0, 1], 2, "internal", "ipc"),
        "arg_utils:2503-2505 (all engines here: no hybrid)"),
    Row("-dp 4 -dph -dpl 2 --headless", E("not applicable in headless mode"),
        "arg_utils:2380-2381"),
    Row("-dp 4 -dph -dpe", E(MANY), "serve.py:99-105"),
    # external: one engine per front end
    Row("-dp 2 -dpl 1 -dpr 1", L([1], 1, "external", "ipc"),
        "arg_utils:2493-2501 (after the MoE check at 2456), serve.py:116-117"),
    Row("-dp 2 -dpl 1 -dpr 0", L([0], 1, "external", "ipc"), "arg_utils:2493-2501"),
    Row("-dp 2 -dpl 1 -dpr 1 --nnodes 2 --node-rank 1", L([1], 1, "external", "ipc"),
        "arg_utils:2493-2501"),
    Row("-dp 1 -dpl 1 -dpr 0", E(DP1_EXTERNAL), "arg_utils:2493-2501, parallel:551-554"),
    Row("-dp 2 -dpe -dpn 1", E(NON_MOE), "arg_utils:2456-2465"),
    Row("-dp 2 -dpn 1", E(NON_MOE), "arg_utils:2447-2449, 2456-2465"),
    Row("-dp 2 -dpe --nnodes 2 --node-rank 1", E(NON_MOE), "arg_utils:2456-2465"),
    Row("-dp 2 -dpe -dpn 1", L([1], 1, "external", "ipc"), "serve.py:113-115, arg_utils:2466-2485",
        moe=True),
    Row("-dp 2 -dpn 0", L([0], 1, "external", "ipc"), "arg_utils:2447-2449", moe=True),
    Row("-dp 2 -dpe -dpn 1 -asc 2", L([1], 2, "external", "ipc"), "serve.py:113", moe=True),
    Row("-dp 2 -dpe --nnodes 2 --node-rank 1", L([1], 1, "external", "ipc"),
        "arg_utils:2425-2441 (rank from --node-rank)", moe=True),
    Row("-dp 4 -dpe --nnodes 2 --node-rank 1", E("cannot unambiguously identify"),
        "arg_utils:2427-2434", moe=True),
    Row("-dp 4 -dpn 2 --nnodes 2 --node-rank 1",
        E("requires `--data-parallel-size-local 1`", "requires --data-parallel-size-local 1"),
        "arg_utils:2442-2446 (-dpl 2 inferred), 2476-2482", moe=True),
    Row("-dp 2 -dpe", E(NEEDS_RANK), "arg_utils:2467-2474", moe=True),
    Row("-dp 1 -dpe", E(NEEDS_RANK), "arg_utils:2456 (dp 1 skips it), 2467-2474"),
    Row("-dp 1 -dpn 0", E(DP1_EXTERNAL), "parallel:551-554"),
    Row("-dp 2 -dpn 2", E("must be in the range [0, 2)", r"must be in the range \[0, 2\)"),
        "parallel:1017-1021", moe=True),
    Row("-dp 4 -dpn 1 -dpr 1", E(MANY), "serve.py:82-105"),
    Row("-dp 4 -dpe -dpr 1 -dpn 1", E(MANY), "serve.py:82-105"),
    Row("--headless -dp 2 -dpn 1 -dpr 1", E(MANY), "serve.py:99-105 (headless or not)"),
    # edge values, other backends, spellings
    Row("-dp 0", E("greater than or equal to 1"), "parallel:147 (Field ge=1)"),
    Row("-dp 2 -dpl 3", E("must be <= data_parallel_size"), "parallel:545-549"),
    Row("-dp 3 --nnodes 2", E("must evenly divide"), "arg_utils:2406-2413"),
    Row("-dp 2 --nnodes 2 --node-rank 2", E("must be between 0 and 1"), "arg_utils:2414-2420"),
    Row("--headless -dp 2 -dpl 0", E("data_parallel_size_local must be > 0 in headless mode"),
        "serve.py:202-203"),
    Row("-dp 2 -dpl 0", L([], 2, "internal", "tcp"), "utils:1319-1326, 1366 (no local engines)",
        minivllm=E("", "--data-parallel-size-local 0: minivllm runs a front end only")),
    Row("-dp 2 -tp 2 --nnodes 4 --node-rank 1 --headless", L([0], 0, "internal", "workers"),
        "arg_utils:2398-2446, parallel:807-836 (a replica over 2 nodes)",
        minivllm=E("", "spreads whole DP replicas")),
    Row("-dp 2 -dpb ray", L([0, 1], 2, "internal", "ipc"), "utils:1301-1313 (Ray actors)",
        minivllm=E("", r"--data-parallel-backend ray \(-dpb\)")),
    Row("-dp 2 -dpb ray --nnodes 2", E("requires `--data-parallel-backend mp`",
                                       "requires --data-parallel-backend mp"),
        "arg_utils:2390-2397"),
    Row("-dp 4 -dpl 2 -dpm", L([], 0, "multi-port", ""), "serve.py:147-148 (run_dp_supervisor)",
        minivllm=E("", r"-dpm\): minivllm has no multi-port supervisor")),
    Row("--data_parallel_size 2 --data_parallel_size_local=1 --data_parallel_start_rank 1",
        L([1], 1, "external", "ipc"), "utils/argparse_utils.py:157, 375-394"),
    Row("--data-parallel-size=4 --api_server_count=1 --data-parallel-size-local 2",
        L([0, 1], 1, "internal", "tcp"), "utils/argparse_utils.py:387-394"),
]
