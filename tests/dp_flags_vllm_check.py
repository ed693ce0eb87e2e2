"""Check the `vllm` column of tests/dp_flags_conformance.py against vLLM 0.33.0's own code. Not
part of the suite (it needs vLLM); run by hand in a throwaway environment:

    python -m venv /tmp/vllmenv     # + a .pth to the repo venv's site-packages (torch 2.13 CPU)
    pip download --no-deps vllm==0.33.0 -d W && unzip W/*.whl -d /tmp/vllm_src  # + a .pth
    /tmp/vllmenv/bin/pip install --no-deps cbor2 aiohttp ...   # what `import vllm` asks for
    VLLM_TARGET_DEVICE=cpu /tmp/vllmenv/bin/python tests/dp_flags_vllm_check.py

Per row: vLLM's serve parser (FlexibleArgumentParser + make_arg_parser) reads the flags;
ServeSubcommand.validate and .cmd run with their launchers replaced by recorders (the API-server
count and mode, or the error); EngineArgs.create_engine_config runs until it builds the
ParallelConfig (the real one, with its checks), and stops there. Two stand-ins: the model
registry's architecture inspection (a subprocess that imports GPU kernels) answers a plain
decoder, and the node's last steps are read from ParallelConfig's own properties as serve.py:218,
247-249 and 325 and v1/engine/utils.py:1144-1156 read them. Prints each row's outcome, then the
rows whose `vllm` column disagrees; exits 1 if any does.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
import typing
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the table, tiny_model.py and minivllm
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import vllm.model_executor.models.registry as registry  # noqa: E402
from vllm.engine import arg_utils  # noqa: E402
from vllm.entrypoints.cli import serve as vserve  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

from dp_flags_conformance import ROWS, Error, Layout, Row  # noqa: E402
from tiny_model import make_tiny_model_dir  # noqa: E402

REAL_PARALLEL_CONFIG = arg_utils.ParallelConfig


class Reached(Exception):
    """Raised where the check stops: a launcher is called, or ParallelConfig is built."""


def plain_decoder(model_arch: str, model: object) -> object:
    defaults = {"architecture": model_arch, "is_text_generation_model": True,
                "attn_type": "decoder", "default_seq_pooling_type": "LAST",
                "default_tok_pooling_type": "ALL", "score_type": "bi-encoder",
                "supported_video_pruning_methods": ()}
    names = typing.get_type_hints(registry._ModelInfo)
    return registry._ModelInfo(**{n: defaults.get(n, False) for n in names})


class StopAtParallelConfig:
    data_parallel_master_ip = REAL_PARALLEL_CONFIG.data_parallel_master_ip
    data_parallel_rpc_port = REAL_PARALLEL_CONFIG.data_parallel_rpc_port
    cp_kv_cache_interleave_size = REAL_PARALLEL_CONFIG.cp_kv_cache_interleave_size

    def __new__(cls, **kwargs: object) -> None:
        raise Reached(REAL_PARALLEL_CONFIG(**kwargs))


def serve_step(args: object) -> str:
    """Run validate and cmd; which launcher cmd chose: headless, multi-port, api."""
    chosen = []

    def record(name: str):
        def launcher(*_: object) -> None:
            chosen.append(name)
            raise Reached()
        return launcher
    vserve.run_headless = record("headless")
    vserve.run_dp_supervisor = record("multi-port")
    vserve.run_multi_api_server = record("api")
    vserve.uvloop = SimpleNamespace(run=lambda coro: (coro.close(), record("api")()))
    vserve.ServeSubcommand().validate(args)
    try:
        vserve.ServeSubcommand.cmd(args)
    except Reached:
        pass
    return chosen[0]


def vllm_outcome(row: Row, models: dict[bool, str]) -> Layout | Error:
    parser = vserve.make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args(["--model", models[row.moe], *shlex.split(row.flags)])
    try:
        launcher = serve_step(args)
        if launcher == "multi-port":
            return Layout((), 0, "multi-port", "")
        api = 0 if launcher == "headless" else args.api_server_count or 1
        arg_utils.ParallelConfig = StopAtParallelConfig
        try:
            arg_utils.EngineArgs.from_cli_args(args).create_engine_config(headless=api == 0)
        except Reached as r:
            pc = r.args[0]
        finally:
            arg_utils.ParallelConfig = REAL_PARALLEL_CONFIG
        return node_step(pc, api)
    except Exception as e:  # vLLM's error, whatever its type
        return Error(f"{type(e).__name__}: {e}")


def node_step(pc: object, api: int) -> Layout | Error:
    start, local = pc.data_parallel_rank, pc.data_parallel_size_local
    mode = ("external" if pc.data_parallel_external_lb else
            "hybrid" if pc.data_parallel_hybrid_lb else "internal")
    engines = tuple(range(start, start + local))
    if api == 0:
        if local <= 0:
            return Error("data_parallel_size_local must be > 0 in headless mode")
        if pc.node_rank_within_dp > 0:
            return Layout(engines[:1], 0, mode, "workers")
        return Layout(engines, 0, mode, "tcp")
    if not (pc.local_engines_only or start == 0):
        return Error("AssertionError")
    local_only = pc.local_engines_only or local == pc.data_parallel_size
    return Layout(engines, api, mode, "ipc" if local_only else "tcp")


def agrees(expected: Layout | Error, got: Layout | Error) -> bool:
    if isinstance(expected, Error):
        return isinstance(got, Error) and expected.vllm_says in got.vllm_says
    if expected.mode == "multi-port":
        return isinstance(got, Layout) and got.mode == "multi-port"
    return expected == got


def main() -> int:
    registry._try_inspect_model_cls = plain_decoder
    tmp = tempfile.mkdtemp(prefix="dpflags")
    dense = make_tiny_model_dir(os.path.join(tmp, "dense"))
    moe = make_tiny_model_dir(os.path.join(tmp, "moe"))
    path = os.path.join(moe, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                  num_local_experts=4, num_experts_per_tok=2)
    with open(path, "w") as f:
        json.dump(config, f)
    wrong = []
    for row in ROWS:
        got = vllm_outcome(row, {False: dense, True: moe})
        ok = agrees(row.vllm, got)
        print(f"{'ok ' if ok else 'BAD'} {'moe ' if row.moe else ''}{row.flags!r}: {got}",
              flush=True)
        if not ok:
            wrong.append((row, got))
    for row, got in wrong:
        print(f"disagrees: {row.flags!r} table {row.vllm} vLLM {got}")
    print(f"{len(ROWS) - len(wrong)} of {len(ROWS)} rows agree with vLLM 0.33.0")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
