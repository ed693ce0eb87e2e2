"""The engine's configuration: one dataclass, validated once, shared by every layer.

In vLLM the same role is played by VllmConfig (vllm/config/vllm.py (VllmConfig)), which bundles the
model, cache, scheduler and parallel configs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minivllm.engine.dp_nodes import DP_FLAGS, resolve_dp_layout
from minivllm.model.config import (ModelConfig, check_quantization, check_tensor_parallel_size,
                                   kv_bytes_per_token, load_config)
from minivllm.model.paths import default_model_path

if TYPE_CHECKING:
    import torch

DTYPES = {"float32": 4, "bfloat16": 2}  # bytes an element; torch is imported only to run
# vLLM's --kv-cache-dtype (CacheDType, vllm/config/cache.py:44), its 16-bit floats: "auto" is
# the model's dtype; the others store keys and values in 2 bytes, widened back when read
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16")
ITEMSIZE = {**DTYPES, "float16": 2}  # bytes an element of the model or the KV cache
DEFAULT_DISTRIBUTED_TIMEOUT_S = 60.0  # the group's rendezvous and collectives, when not set
DEFAULT_KV_CACHE_BYTES = 512 * 2**20  # SmolLM2-135M in float32: 46 KiB a token, so ~11k tokens


@dataclass(frozen=True)
class SchedulerConfig:
    """What the scheduler needs, and nothing that loads a model (vLLM: config/scheduler.py)."""

    num_kv_blocks: int
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 2048
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # vLLM's: one request's chunk; 0: no cap
    target_itl_ms: float | None = None  # prompt tokens a step capped to stay within it


@dataclass
class EngineConfig:
    model: str | None = None  # a .gguf file or a HF directory; None: SmolLM2-135M-Instruct
    dtype: str = "float32"  # float32 is the CPU default; bfloat16 halves memory traffic
    # vLLM's --quantization: None (the default) or "gguf" runs a GGUF's Q4_0/Q4_1/Q8_0 matrices
    # in their blocks (float32 activations); "none" dequantizes them to dtype at load
    quantization: str | None = None
    block_size: int = 16  # tokens per KV cache block
    kv_cache_dtype: str = "auto"  # KV_CACHE_DTYPES: "auto" keeps the model's dtype
    # vLLM's --kv-cache-memory-bytes (on CPU, VLLM_CPU_KVCACHE_SPACE in GiB): the KV cache's
    # size, all TP ranks together. None: what max_num_seqs sequences of max_model_len can use,
    # at most DEFAULT_KV_CACHE_BYTES (a budget larger than that only holds prefix-cache blocks)
    kv_cache_memory_bytes: int | None = None
    num_kv_blocks: int | None = None  # overrides the bytes (tests force preemption with it)
    max_num_seqs: int = 64  # requests in one step
    max_num_batched_tokens: int = 512  # tokens in one step: the chunked-prefill budget
    max_model_len: int | None = None  # default: the model's context, capped by the cache
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    # vLLM's --long-prefill-token-threshold (vllm/config/scheduler.py:79): the most prompt
    # tokens one request gets in a step while another request is eligible; 0: no cap
    long_prefill_token_threshold: int = 0
    # minivllm's --target-itl-ms: a step's prompt tokens are capped so that its time, predicted
    # from the measured cost of past steps (engine/step_cost.py), stays within this many ms
    # while streams decode in it; None: only max_num_batched_tokens caps them (vLLM's way)
    target_itl_ms: float | None = None
    num_threads: int | None = None  # torch threads in the worker; None: torch's default
    data_parallel_size: int = 1  # engine core processes, each with the whole model
    tensor_parallel_size: int = 1  # worker processes sharing one model, each 1 / N of it
    # "uni" | "mp" | "ray" (TP ranks as Ray actors: executor/ray_executor.py); None: "mp" if TP > 1
    distributed_executor_backend: str | None = None
    # the ray backend's cluster head, HOST:PORT; None: $RAY_ADDRESS, else ray.init's default
    ray_address: str | None = None
    # the ray backend's ranks go in its bundles (vLLM's ParallelConfig.placement_group); None:
    # the Ray actor's own group if LLM runs in one, else a new group (executor/ray_utils.py)
    placement_group: object = None
    # Multi-node tensor parallelism (vLLM's ParallelConfig, vllm/config/parallel.py (ParallelConfig)):
    # the TP ranks are split evenly over nnodes nodes; node 0 (the leader) runs the engine
    # core, the others run `minivllm serve --headless`. master_addr:master_port is where the
    # process group meets (on the leader); master_addr must be the leader's address as every
    # node sees it, and the leader's broadcast ring serves remote readers there.
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501  # vLLM's default
    # minivllm's one process group (gloo) meets and runs its collectives within this many
    # seconds; also the window in which every node must join a multi-node group. vLLM has two
    # flags: --distributed-timeout-seconds for the world group and the device groups
    # (config/parallel.py:364-368, v1/worker/gpu_worker.py:1709-1711, on CPU gloo groups too:
    # distributed/parallel_state.py:500-507) and --cpu-distributed-timeout-seconds for its gloo
    # cpu_groups (config/parallel.py:370-372, parallel_state.py:362, 485, 511-513). minivllm's
    # group plays both parts: distributed_timeout_seconds if set, else the cpu one, else 60 s
    # (vLLM's default is torch's: 10 min for NCCL, 30 min for gloo)
    distributed_timeout_seconds: int | None = None
    cpu_distributed_timeout_seconds: int | None = None
    # Data-parallel engine cores on several nodes, vLLM's flags resolved as vLLM resolves them
    # (dp_nodes.py). This node runs DP ranks start_rank .. start_rank + size_local - 1; with
    # internal load balancing the front end on DP rank 0's node listens at address:rpc_port
    # for the HELLO of the other nodes' engines (`minivllm serve --headless`), over tcp.
    data_parallel_size_local: int | None = None  # None: -dp, or from nnodes and node_rank
    data_parallel_start_rank: int | None = None  # vLLM's -dpr; resolved: this node's first rank
    data_parallel_address: str | None = None  # None: master_addr (vLLM's default too)
    data_parallel_rpc_port: int = 29550  # vLLM's default
    data_parallel_backend: str = "mp"  # vLLM's -dpb; "ray" (engines as Ray actors) is refused
    # How requests reach the engines (dp_nodes.py): internal (one front end on DP rank 0's
    # node for every engine), hybrid (a front end on every node, for its own engines) or
    # external (one engine per front end, balanced by something outside)
    data_parallel_hybrid_lb: bool = False
    data_parallel_external_lb: bool = False
    # serve starts no API server here (--headless or --api-server-count 0): -dpr then does
    # not mean hybrid load balancing (vLLM's create_engine_config(headless=True))
    headless: bool = False
    data_parallel_rank: int | None = None  # vLLM's -dpn: this front end's one engine (external)
    model_config: ModelConfig = field(init=False)

    def __post_init__(self) -> None:
        if self.data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be greater than or equal to 1, got "
                             f"{self.data_parallel_size}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)} "
                             f"(auto: the model's dtype), got {self.kv_cache_dtype!r}")
        check_quantization(self.quantization)
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be >= 0 (0: no cap), got "
                             f"{self.long_prefill_token_threshold}")
        if self.target_itl_ms is not None and not self.target_itl_ms > 0:
            raise ValueError(f"target_itl_ms must be positive, got {self.target_itl_ms}")
        if self.model is None:
            self.model = default_model_path()
        self.model_config = load_config(self.model)
        self._check_parallel()
        self._size_kv_cache()
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            self.max_num_batched_tokens = self.max_model_len  # a whole prompt must fit one step

    @property
    def cache_dtype(self) -> str:
        """The KV cache's element type: kv_cache_dtype, with "auto" resolved to dtype."""
        return self.dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.model_config, ITEMSIZE[self.cache_dtype])

    def _size_kv_cache(self) -> None:
        """num_kv_blocks from the budget, then max_model_len checked against what it holds."""
        per_block = self.block_size * self.kv_bytes_per_token
        model_len = min(self.max_model_len or self.model_config.max_position,
                        self.model_config.max_position)
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes must be positive, got "
                             f"{self.kv_cache_memory_bytes}")
        if self.num_kv_blocks is None and self.kv_cache_memory_bytes is not None:
            self.num_kv_blocks = self.kv_cache_memory_bytes // per_block
        elif self.num_kv_blocks is None:
            needed = self.max_num_seqs * -(-model_len // self.block_size)
            self.num_kv_blocks = min(DEFAULT_KV_CACHE_BYTES // per_block, needed)
        capacity = self.num_kv_blocks * self.block_size
        wanted = model_len if self.max_model_len else 2  # the least a request needs
        if capacity < wanted:
            raise ValueError(
                f"the KV cache holds {capacity} tokens ({self.num_kv_blocks} blocks of "
                f"{self.block_size}, {self.num_kv_blocks * per_block} bytes), less than one "
                f"sequence of max_model_len {wanted}: raise kv_cache_memory_bytes "
                f"(--kv-cache-memory-bytes) to at least {-(-wanted // self.block_size) * per_block}"
                f" or lower max_model_len (--max-model-len) to {capacity} or less")
        self.max_model_len = min(model_len, capacity)

    def kv_cache_summary(self) -> str:
        """The start-up line: what the cache holds, and how many max-length sequences fit."""
        tokens = self.num_kv_blocks * self.block_size
        mib = tokens * self.kv_bytes_per_token / 2**20
        return (f"KV cache: {self.num_kv_blocks:,} blocks of {self.block_size} tokens = "
                f"{tokens:,} tokens, {mib:,.1f} MiB in {self.cache_dtype} (all ranks); "
                f"{tokens / self.max_model_len:.2f} sequences of max_model_len "
                f"{self.max_model_len:,} fit (max_num_seqs {self.max_num_seqs})")

    def _check_parallel(self) -> None:
        check_tensor_parallel_size(self.model_config, self.tensor_parallel_size)
        self._check_nodes()
        self._check_dp_nodes()
        if self.distributed_executor_backend is None:
            self.distributed_executor_backend = "mp" if self.tensor_parallel_size > 1 else "uni"
        if self.distributed_executor_backend not in ("uni", "mp", "ray"):
            raise ValueError(f"distributed_executor_backend must be 'uni', 'mp' or 'ray', got "
                             f"{self.distributed_executor_backend!r}")
        if self.distributed_executor_backend == "ray":  # Ray places the nodes: nnodes stays 1
            from minivllm.executor.ray_utils import check_ray_cluster, current_placement_group
            self.ray_address = check_ray_cluster(self.ray_address)
            self.placement_group = self.placement_group or current_placement_group()
        if self.distributed_executor_backend == "uni" and self.tensor_parallel_size > 1:
            raise ValueError("the 'uni' executor runs one worker in the engine core's process: "
                             "use distributed_executor_backend='mp' (or 'ray') for "
                             "tensor_parallel_size > 1")

    def _check_nodes(self) -> None:
        tp, n = self.tensor_parallel_size, self.nnodes
        if n < 1:
            raise ValueError(f"nnodes must be >= 1, got {n}")
        if not 0 <= self.node_rank < n:  # vLLM's words (engine/arg_utils.py:2414-2420)
            raise ValueError(f"--node-rank must be between 0 and {n - 1}; got {self.node_rank} "
                             "(0 <= node_rank < nnodes)")
        if tp % n and self.data_parallel_size == 1:  # DP x TP: dp_nodes.resolve_dp_layout
            works = [d for d in range(1, tp + 1) if tp % d == 0]
            raise ValueError(f"tensor_parallel_size {tp} cannot be split evenly over nnodes={n}: "
                             f"use nnodes in {works}, or a tensor_parallel_size divisible by {n}")
        if n > 1 and self.distributed_executor_backend not in (None, "mp"):
            raise ValueError("nnodes > 1 needs distributed_executor_backend='mp' (got "
                             f"{self.distributed_executor_backend!r}; the ray backend finds "
                             "its nodes in the Ray cluster: leave nnodes at 1)")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port must be a TCP port (1-65535), got {self.master_port}")

    def _check_dp_nodes(self) -> None:
        # the flags that resolve to other values, as given: replace() resolves them again
        self._as_given = {name: getattr(self, name)
                          for name in (*DP_FLAGS, "distributed_executor_backend")}
        resolve_dp_layout(self, is_moe=getattr(self.model_config, "is_moe", False))
        if not 0 < self.data_parallel_rpc_port < 65536:
            raise ValueError("data_parallel_rpc_port must be a TCP port (1-65535), got "
                             f"{self.data_parallel_rpc_port}")
        for name in ("distributed_timeout_seconds", "cpu_distributed_timeout_seconds"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def data_parallel_multinode(self) -> bool:
        """Some engine cores run on other nodes and talk to this front end over tcp."""
        return (self.data_parallel_size_local < self.data_parallel_size
                and not self.local_engines_only)

    @property
    def local_engines_only(self) -> bool:
        """The front end serves this node's engines alone (hybrid or external load balancing;
        vLLM: ParallelConfig.local_engines_only)."""
        return self.data_parallel_hybrid_lb or self.data_parallel_external_lb

    @property
    def client_engine_ranks(self) -> range:
        """The DP ranks a front end on this node sends requests to."""
        if self.local_engines_only:
            return range(self.data_parallel_start_rank,
                         self.data_parallel_start_rank + self.data_parallel_size_local)
        return range(self.data_parallel_size)

    @property
    def nnodes_within_dp(self) -> int:
        """The nodes one DP replica's TP ranks span (vLLM: ParallelConfig.nnodes_within_dp)."""
        return max(self.nnodes * self.data_parallel_size_local // self.data_parallel_size, 1)

    @property
    def node_rank_within_dp(self) -> int:
        return self.node_rank % self.nnodes_within_dp

    @property
    def local_world_size(self) -> int:
        """The TP ranks on each node (vLLM: ParallelConfig.local_world_size)."""
        return self.tensor_parallel_size // self.nnodes_within_dp

    @property
    def collective_timeout_s(self) -> float:
        return float(self.distributed_timeout_seconds or self.cpu_distributed_timeout_seconds
                     or DEFAULT_DISTRIBUTED_TIMEOUT_S)

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(self.num_kv_blocks, self.block_size, self.max_num_seqs,
                               self.max_num_batched_tokens, self.max_model_len,
                               self.enable_prefix_caching, self.enable_chunked_prefill,
                               self.long_prefill_token_threshold, self.target_itl_ms)

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch  # here: the API server process builds configs without torch
        return getattr(torch, self.dtype)

    @property
    def cache_torch_dtype(self) -> torch.dtype:
        import torch
        return getattr(torch, self.cache_dtype)

    def replace(self, **changes: object) -> "EngineConfig":
        kwargs = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        kwargs.update(self._as_given)
        kwargs.update(changes)
        return EngineConfig(**kwargs)
