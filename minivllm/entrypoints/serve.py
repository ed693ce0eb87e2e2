"""`minivllm serve [MODEL]`: the OpenAI-compatible server, in vLLM's process layout.

    minivllm serve                          # SmolLM2-135M-Instruct on 127.0.0.1:8000
    minivllm serve /path/to/hf_dir -tp 2 --port 8001 --api-key secret

One API server (the default): this process is the API server; AsyncLLM starts the engine core
(and, with -tp > 1, its workers). Several (--api-server-count N > 1, or -dp M > 1, whose default
is M API servers as in vLLM, ServeSubcommand.cmd in vllm/entrypoints/cli/serve.py): this process stays as the
launcher (the same ServeSubcommand.cmd). It binds the listening socket, starts the
engine cores for N clients (launch_core_engines), then spawns N API server processes that share
the one socket: the kernel hands each new connection to whichever process accepts first
(vLLM: run_multi_api_server in vllm/entrypoints/cli/serve.py, and APIServerProcessManager in
vllm/v1/utils.py; vLLM's NoSignalServer in vllm/entrypoints/launchers/launcher.py,
adds a least-loaded accept that minivllm leaves out). Each API server is one client of every
engine core, with its own client_index.

Across nodes (vLLM's flags): --nnodes K --node-rank R span the whole DP x TP deployment.
With -dp 1 the TP ranks split over the nodes: node 0 runs as above, every other node runs
`minivllm serve --headless --node-rank R ...`, which starts only its share of the TP workers
(executor/multinode.py) and exits when the leader goes away or on SIGTERM. With -dp N each
node runs whole DP replicas, its first DP rank following from R. DP launch modes, resolved
from vLLM's flags as vLLM 0.33.0 resolves them (engine/dp_nodes.py): internal (the leader's API
servers in front of all N engines, the other nodes `--headless` or `--api-server-count 0`,
their engines reaching the front end over tcp; engine/headless.py), hybrid (-dpl L -dpr S
without --headless, or -dph -dpl L: API servers on every node for its own engines) and
external (one engine per API server: -dpl 1 -dpr R; -dpe and -dpn R only for MoE models, as
in vLLM, and minivllm's models are dense).

--host defaults to 127.0.0.1 (this machine only); vLLM binds all interfaces (0.0.0.0).
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING, Any

from minivllm.engine.config import KV_CACHE_DTYPES  # torch-free, as --help wants
from minivllm.engine.dp_nodes import node_layout, serve_api_servers
from minivllm.entrypoints.node_flags import FlexibleArgumentParser, add_node_flags
from minivllm.utils import tracing
from minivllm.utils.byte_sizes import parse_bytes
from minivllm.utils.process_count import serve_process_count
from minivllm.utils.resource_names import private_dir

if TYPE_CHECKING:  # serve imports the engine lazily, so that --help answers at once
    from minivllm.engine.messages import ClientAddresses

DEFAULT_PORT = 8000
BUNDLED_MODEL_NAME = "SmolLM2-135M-Instruct"
API_SERVER_READY_TIMEOUT_S = 120.0  # an API server connects to running engines: seconds
STOP_POLL_S = 0.2  # how often an API server process checks for its launcher's stop request


def make_parser() -> argparse.ArgumentParser:
    p = FlexibleArgumentParser(prog="minivllm serve", description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default=None,
                   help="a .gguf file or a Hugging Face directory (default: the bundled "
                        "SmolLM2-135M-Instruct)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; vLLM's default binds all "
                        "interfaces, 0.0.0.0)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("-dp", "--data-parallel-size", type=int, default=1)
    p.add_argument("-asc", "--api-server-count", type=int, default=None,
                   help="API server processes sharing the port; 0: headless (default: -dp; "
                        "hybrid load balancing: -dpl as given, else 1; external: 1)")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens in one step, decodes and prefill chunks together (vLLM's "
                        "flag; default 512): smaller keeps the inter-token latency of running "
                        "streams low while prompts arrive, larger gets first tokens sooner")
    p.add_argument("--long-prefill-token-threshold", type=int, default=None,
                   help="the most prompt tokens one request gets in a step while another "
                        "request is eligible (vLLM's flag; default 0: no cap)")
    p.add_argument("--target-itl-ms", type=float, default=None,
                   help="cap each step's prompt tokens so that its time, predicted from the "
                        "measured cost of past steps, stays within this many ms while "
                        "streams decode in it (minivllm's; default: no target)")
    p.add_argument("--kv-cache-memory-bytes", "--kv-cache-memory", type=parse_bytes,
                   default=None, metavar="BYTES",
                   help="the KV cache's size, e.g. 512M or 0.5g (vLLM's flag; on CPU vLLM also "
                        "reads VLLM_CPU_KVCACHE_SPACE, in GiB). Default: what --max-num-seqs "
                        "sequences of --max-model-len can use, at most 512 MiB")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                   help="the KV cache's element type (vLLM's flag): auto is --dtype; float16 "
                        "or bfloat16 store keys and values in 2 bytes, rounded when written "
                        "and widened to --dtype when read, so a --kv-cache-memory-bytes holds "
                        "twice the tokens of float32 (llama.cpp's cache is f16 by default)")
    p.add_argument("-q", "--quantization", default=None, choices=["gguf", "none"],
                   help="default and gguf: run a GGUF's Q4_0/Q4_1/Q8_0 matrices on their "
                        "blocks (float32; a quarter of the memory); none: dequantize them to "
                        "--dtype at load")
    p.add_argument("--api-key", default=os.environ.get("MINIVLLM_API_KEY"),
                   help="require `Authorization: Bearer KEY` on /v1 (or set MINIVLLM_API_KEY)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="names clients use for the model (default: MODEL as given)")
    p.add_argument("--trace", metavar="FILE", default=None,
                   help="write a Chrome/Perfetto trace of every process to FILE at exit")
    p.add_argument("--num-threads", type=int, default=None,
                   help="torch threads per worker (default: this node's cores / its ranks)")
    p.add_argument("--distributed-executor-backend", choices=["uni", "mp", "ray"], default=None,
                   help="how the TP workers start: processes of this node (mp, the default "
                        "for -tp > 1) or Ray actors on a running Ray cluster's nodes (ray)")
    p.add_argument("--ray-address", default=None,
                   help="the Ray cluster's head, HOST:PORT (default: $RAY_ADDRESS, else "
                        "ray.init's: the cluster `ray start` began on this node, else a new "
                        "local one)")
    add_node_flags(p)
    return p


def engine_config(args: argparse.Namespace, headless: bool | None = None) -> Any:
    """EngineConfig from the flags; a flag left unset keeps the config's default. headless:
    serve starts no API server here (default: from the flags, dp_nodes.serve_api_servers)."""
    from minivllm.engine.config import EngineConfig
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    kwargs: dict[str, Any] = {"model": args.model, "dtype": args.dtype,
                              "kv_cache_dtype": args.kv_cache_dtype,
                              "quantization": args.quantization}
    for name, value in (("max_num_seqs", args.max_num_seqs),
                        ("max_model_len", args.max_model_len),
                        ("max_num_batched_tokens", args.max_num_batched_tokens),
                        ("long_prefill_token_threshold", args.long_prefill_token_threshold),
                        ("target_itl_ms", args.target_itl_ms),
                        ("kv_cache_memory_bytes", args.kv_cache_memory_bytes),
                        ("num_threads", args.num_threads),
                        ("nnodes", args.nnodes if args.nnodes != 1 else None),
                        ("node_rank", args.node_rank or None),
                        ("master_addr", args.master_addr),
                        ("master_port", args.master_port),
                        ("distributed_timeout_seconds", args.distributed_timeout_seconds),
                        ("cpu_distributed_timeout_seconds",
                         args.cpu_distributed_timeout_seconds),
                        ("tensor_parallel_size", args.tensor_parallel_size),
                        ("distributed_executor_backend", args.distributed_executor_backend),
                        ("ray_address", args.ray_address),
                        ("data_parallel_size", args.data_parallel_size),
                        ("data_parallel_size_local", args.data_parallel_size_local),
                        ("data_parallel_start_rank", args.data_parallel_start_rank),
                        ("data_parallel_address", args.data_parallel_address),
                        ("data_parallel_rpc_port", args.data_parallel_rpc_port),
                        ("data_parallel_rank", args.data_parallel_rank),
                        ("data_parallel_backend", args.data_parallel_backend),
                        ("data_parallel_hybrid_lb", args.data_parallel_hybrid_lb or None),
                        ("data_parallel_external_lb", args.data_parallel_external_lb or None),
                        ("headless", (serve_api_servers(args) < 1 if headless is None
                                      else headless) or None)):
        if value is None or (value == 1 and name.endswith("parallel_size")):
            continue
        if name not in fields:
            raise SystemExit(f"minivllm serve: this build of the engine has no {name} yet")
        kwargs[name] = value
    return EngineConfig(**kwargs)


def served_names(args: argparse.Namespace) -> list[str]:
    """As vLLM: --served-model-name, else MODEL as given, else the bundled model's name."""
    return list(args.served_model_name or [args.model or BUNDLED_MODEL_NAME])


async def run_api_server(args: argparse.Namespace, sock: socket.socket,
                         client_addresses: ClientAddresses | None = None, client_index: int = 0,
                         on_ready: Any = None) -> int:
    """One API server: AsyncLLM (own engines, or the launcher's), the app, uvicorn on `sock`."""
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.entrypoints.openai.api_server import build_app
    from minivllm.entrypoints.openai.http_server import serve_http

    tracing.set_process_name(f"MINIVLLM::APIServer_{client_index}")
    config = engine_config(args)
    if client_addresses is None:
        engine = AsyncLLM(config)
    else:
        engine = AsyncLLM(config, client_addresses=client_addresses, client_index=client_index)
    try:
        app = build_app(engine, served_names(args), args.api_key)
        return await serve_http(app, sock, engine,
                                on_started=on_ready and (lambda: on_ready(config)))
    finally:
        engine.shutdown()


def announce(args: argparse.Namespace, config: Any, api_servers: int) -> None:
    """Where the server listens, and its processes next to chapter 01's formula."""
    import psutil
    names = served_names(args)
    print(f"minivllm serve: listening on http://{args.host}:{args.port}/v1 "
          f"(model {config.model}, served as {names[0]!r})", flush=True)
    me = psutil.Process()
    procs = [me] + [p for p in me.children(recursive=True)
                    if "resource_tracker" not in " ".join(p.cmdline())]
    expected = serve_process_count(tp=args.tensor_parallel_size,
                                   dp=config.data_parallel_size_local,
                                   api_server_count=api_servers)
    note = ""
    if expected.dp_coordinator and len(procs) == expected.total - 1:
        note = " (minivllm runs no DP coordinator process)"
    print(config.kv_cache_summary(), flush=True)
    print(f"processes: {len(procs)} running; chapter 01's formula: {expected.describe()}{note}",
          flush=True)
    for p in procs:
        title = " ".join(p.cmdline())[:70]
        print(f"  pid {p.pid:>7}  {title}", flush=True)


def api_server_proc(link: Any, args: argparse.Namespace, sock: socket.socket,
                    client_addresses: ClientAddresses, client_index: int) -> None:
    """The target of one API server process (launched with minivllm.utils.mp.launch)."""
    import asyncio

    import uvloop
    from setproctitle import setproctitle

    setproctitle(f"MINIVLLM::APIServer_{client_index}")

    async def main() -> int:
        async def watch_stop() -> None:
            while not link.should_stop():
                await asyncio.sleep(STOP_POLL_S)
            os.kill(os.getpid(), signal.SIGTERM)  # serve_http's handler: a graceful exit
        watcher = asyncio.create_task(watch_stop())
        try:
            return await run_api_server(args, sock, client_addresses, client_index,
                                        on_ready=lambda config: link.ready())
        finally:
            watcher.cancel()
    code = uvloop.run(main())
    tracing.flush()
    if code:
        sys.exit(code)


def run_multi_api_server(args: argparse.Namespace, sock: socket.socket, count: int) -> int:
    """The launcher: engine cores for `count` clients, then `count` API server processes."""
    from minivllm.engine.launcher import launch_core_engines
    from minivllm.entrypoints.openai.metrics import shared_metrics_dir
    from minivllm.utils.mp import launch

    config = engine_config(args)
    spawn = multiprocessing.get_context("spawn")  # vLLM's API servers always spawn
    engine_manager, addresses = launch_core_engines(config, num_api_servers=count)
    servers = []
    # shared_metrics_dir: where the API servers' metric values meet, summed on a scrape
    with shared_metrics_dir():
        try:
            for i in range(count):  # tcp: each gets a duplicate of its listening sockets
                client = addresses.for_client(i, engine_manager.pids,  # watched by pidfd
                                              engine_manager.client_listeners(i))
                servers.append(launch(api_server_proc, f"APIServer_{i}",
                                      args=(args, sock, client, i), context=spawn,
                                      ready_timeout=API_SERVER_READY_TIMEOUT_S))
            engine_manager.close_listeners()  # the API servers listen on their copies
            announce(args, config, count)
            return wait_for_first_exit(servers)
        finally:
            for handle in servers:
                handle.shutdown()
            engine_manager.close()


def wait_for_first_exit(servers: list[Any]) -> int:
    """Block until an API server exits or SIGINT/SIGTERM arrives; the rest are then stopped."""
    stop_r, stop_w = os.pipe()
    old = {sig: signal.signal(sig, lambda *_: os.write(stop_w, b"x"))
           for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        ready = multiprocessing.connection.wait([h.sentinel for h in servers] + [stop_r])
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        os.close(stop_r)
        os.close(stop_w)
    if stop_r in ready:
        return 0
    dead = [h for h in servers if not h.is_alive()]
    for h in dead:
        print(f"minivllm serve: {h.name} exited with code {h.process.exitcode}; stopping the "
              f"rest", file=sys.stderr, flush=True)
    return 1


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    import uvloop

    from minivllm.entrypoints.openai.http_server import create_server_socket

    args = make_parser().parse_args(argv)
    try:  # a bad path or flag: one line, before anything starts
        count = serve_api_servers(args)  # 0: headless (--headless or --api-server-count 0)
        config = engine_config(args, headless=count < 1)
        layout = node_layout(config, count)
        if count < 1:
            if layout.tp_workers_only:
                from minivllm.executor.multinode import run_headless
                return run_headless(config)
            if config.local_engines_only:  # only MoE models get here; minivllm has none
                raise ValueError("a headless external-LB engine needs vLLM's DP coordinator, "
                                 "which minivllm does not have")
            from minivllm.engine.headless import run_headless_engines
            return run_headless_engines(config)
        if config.node_rank_within_dp != 0:
            raise ValueError(f"--node-rank {config.node_rank} runs TP workers of a replica "
                             "led elsewhere: add --headless")
    except (OSError, ValueError) as e:
        raise SystemExit(f"minivllm serve: {e}") from None
    # Until uvicorn (or the launcher's wait) takes over the signals, SIGTERM unwinds like
    # Ctrl-C, so a server stopped while it starts still shuts its engine down.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    trace_dir = None
    if args.trace:
        trace_dir = private_dir("trace")
        os.environ[tracing.TRACE_DIR_ENV] = trace_dir  # before any process starts
    sock = create_server_socket(args.host, args.port)
    try:
        if count > 1:
            return run_multi_api_server(args, sock, count)
        return uvloop.run(run_api_server(
            args, sock, on_ready=lambda config: announce(args, config, 1)))
    except KeyboardInterrupt:
        return 0
    finally:
        sock.close()
        if trace_dir is not None:
            tracing.flush()
            n = tracing.merge(trace_dir, args.trace)
            print(f"minivllm serve: wrote {n} trace events to {args.trace} "
                  f"(open it in ui.perfetto.dev)", flush=True)
