"""How many processes `vllm serve` starts on one node, by its code in the vLLM release minivllm follows (minivllm.VLLM_VERSION).

- API servers: `--api-server-count`, by default the DP size (ServeSubcommand.cmd in
  vllm/entrypoints/cli/serve.py).
- The launcher: with more than one API server, the CLI process does not serve HTTP itself; it
  spawns the API servers and engine cores and stays alive to watch them (ServeSubcommand.cmd
  calls run_multi_api_server). With one API server, the CLI process *is* the API server.
- One engine core per DP rank.
- DP x PP x TP workers, except when TP x PP == 1: then the executor is "uni"
  (vllm/config/parallel.py (ParallelConfig.__post_init__)) and the worker is an object inside the engine core.
- One DP coordinator when DP > 1 (vllm/config/vllm.py (VllmConfig.needs_dp_coordinator), for the
  default internal load balancing).

vLLM's docs (docs/design/arch_overview.md, "Process Count Summary") count differently: they leave
out the launcher (so `-tp=2 -dp=4` is 17 there, 18 here), and their workers term, DP x TP,
counts a worker process at TP = 1 that the uni executor does not start (one too many per DP rank).
Python's own helper processes (multiprocessing's resource tracker) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessCount:
    api_servers: int
    engine_cores: int
    workers: int  # worker processes; 0 when each engine core holds its worker in-process
    dp_coordinator: int
    launcher: int  # 1 when the CLI process stays as the parent of several API servers

    @property
    def total(self) -> int:
        return self.launcher + self.api_servers + self.engine_cores + self.workers + self.dp_coordinator

    def describe(self) -> str:
        def n(count: int, noun: str) -> str:
            return f"{count} {noun}{'s' * (count != 1)}"
        parts = ["1 launcher"] if self.launcher else []
        parts += [n(self.api_servers, "API server"), n(self.engine_cores, "engine core")]
        parts.append(n(self.workers, "worker") if self.workers else "the worker inside each engine core")
        if self.dp_coordinator:
            parts.append("1 DP coordinator")
        return " + ".join(parts) + f" = {self.total} processes"


def serve_process_count(tp: int = 1, dp: int = 1, pp: int = 1,
                        api_server_count: int | None = None) -> ProcessCount:
    """The processes `serve --tensor-parallel-size tp --data-parallel-size dp` starts on one node."""
    for label, value in (("tp", tp), ("dp", dp), ("pp", pp)):
        if value < 1:
            raise ValueError(f"{label}={value}: parallel sizes start at 1")
    api = dp if api_server_count is None else api_server_count
    if api < 1:
        raise ValueError(f"api_server_count={api}: serve needs at least one API server "
                         "(vLLM's headless mode, with none, is not modelled)")
    world = tp * pp  # the workers of one engine core
    return ProcessCount(api_servers=api, engine_cores=dp,
                        workers=dp * world if world > 1 else 0,
                        dp_coordinator=1 if dp > 1 else 0,
                        launcher=1 if api > 1 else 0)
