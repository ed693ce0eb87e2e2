"""How many processes `serve` starts, by vLLM's rules (and minivllm's, which are the same).

vLLM 0.33.0 docs/design/arch_overview.md, "Process Count Summary": A API servers (default DP,
vllm/entrypoints/cli/serve.py:124-125), DP engine cores, DP x PP x TP workers, and one DP
coordinator when DP > 1 (vllm/config/vllm.py:873). One refinement the table leaves out: when
TP x PP == 1 the executor is "uni" (vllm/config/parallel.py:1098-1099), and the single worker
is an object inside the engine core process, not a process of its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessCount:
    api_servers: int
    engine_cores: int
    workers: int  # worker processes; 0 when each engine core holds its worker in-process
    dp_coordinator: int

    @property
    def total(self) -> int:
        return self.api_servers + self.engine_cores + self.workers + self.dp_coordinator

    def describe(self) -> str:
        parts = [f"{self.api_servers} API server{'s' * (self.api_servers != 1)}",
                 f"{self.engine_cores} engine core{'s' * (self.engine_cores != 1)}"]
        if self.workers:
            parts.append(f"{self.workers} worker{'s' * (self.workers != 1)}")
        else:
            parts.append("the worker inside each engine core")
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
                        dp_coordinator=1 if dp > 1 else 0)
