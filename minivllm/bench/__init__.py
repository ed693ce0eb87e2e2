"""Benchmarks: each module NAME defines main(argv) and runs as `minivllm bench NAME`."""
