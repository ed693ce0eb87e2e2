"""Benchmarks: `minivllm bench NAME` runs main(argv) of the module minivllm.bench.NAME.

BENCHMARKS is the list: add a benchmark by adding its module here and one line below. The
modules that a benchmark's child processes run are private (_name.py), and so is anything
else that is not a benchmark.
"""

BENCHMARKS: dict[str, str] = {
    "processes": "the GIL, and the start-up cost of fork, spawn and forkserver (chapter 01)",
    "ipc": "pipe, Unix socket, TCP and shared memory: bandwidth and latency (chapter 02)",
    "serial": "a step's batch and a 64 MiB tensor on the wire (chapter 04)",
    "ring": "MessageQueue vs a bare ring vs ZMQ PUB/SUB, one writer, N readers (chapter 05)",
    "weights": "weights to an engine process by handles vs by pickle (chapter 06)",
    "throughput": "offline decode tokens per second of the engine",
    "overhead": "decode steps in process vs through the engine core process (chapter 07)",
    "serve": "a load test of `minivllm serve` next to the in-process engine (chapter 09)",
    "echo": "what a long prompt's logprobs (echo) cost another stream's inter-token latency",
    "nodes": "remote vs local ring readers, TP=3 over 3 namespace hosts vs one (chapter 10)",
}
