"""`python judge.py 213 --in-engine`: the learner's ring buffer under the real engine.

The unit tests of exercise 213 drive the ring from one process. Here it carries the engine's
traffic instead: every MessageQueue of a tensor-parallel engine (TP=3, the tiny model) runs on
the learner's ShmRing, through `LearnerRing`, an adapter with ShmRingBuffer's interface. That
is the executor's broadcast (one writer, three readers in three worker processes) and each
worker's reply queue. A short greedy generation then runs twice, each in a child process with
a time limit: once on minivllm's own ring (the reference), once on the learner's. The verdict
says whether the engine's output differed and how, whether it hung, crashed, or left a
/dev/shm segment behind.

How the learner's ring reaches the workers: the run is `python -m minivllm.judge.in_engine`,
and spawn re-imports the main module in every child (as __mp_main__) before the worker starts,
so the module-level install below swaps the ring in the workers too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RING_ENV = "MINIVLLM_JUDGE_RING"  # the learner's ring_buffer.py, for this process and its children
SEGMENTS_ENV = "MINIVLLM_JUDGE_SEGMENTS"  # a file where every creator writes its segment's name
# The learner's run may take this many times the reference run (at least MIN_TIMEOUT_S)
# before it counts as stuck: a ring deadlock never finishes, a slow machine is slow for both.
TIMEOUT_FACTOR, MIN_TIMEOUT_S, REFERENCE_TIMEOUT_S = 4.0, 60.0, 600.0
NUM_PROMPTS, NUM_TOKENS = 4, 24  # ~30 broadcasts: the 10-chunk ring wraps around 3 times
HEADER = 4  # the learner's chunk starts with a 4-byte length (exercise 213's layout)


class LearnerRing:
    """ShmRingBuffer's interface (shm_ring.py) on the learner's ShmRing. A chunk of the
    learner's ring holds HEADER + max_chunk_bytes: MessageQueue's chunk format (message_chunk.py)
    is the learner's payload."""

    module = None  # the learner's ring_buffer module, set by install()
    # After each publish MessageQueue reads buf[waiting_offset], the ring's waiting flag
    # (shm_ring.py), to decide whether to notify. The learner's ring has no such byte: this one
    # always says "a reader may be waiting", so the writer notifies after every enqueue, as
    # vLLM's does, and no reader can sleep through a message.
    buf, waiting_offset = b"\x01", 0

    def __init__(self, n_reader: int, max_chunk_bytes: int, max_chunks: int,
                 name: str | None = None):
        self.n_reader, self.max_chunk_bytes, self.max_chunks = n_reader, max_chunk_bytes, max_chunks
        self.chunk_bytes = max_chunk_bytes + HEADER
        self.ring = self.module.ShmRing(n_reader, max_chunks, self.chunk_bytes, name=name)
        self.name, self._mem = self.ring.name, self.ring.shm.buf
        if name is None and os.environ.get(SEGMENTS_ENV):  # the judge checks these at the end
            with open(os.environ[SEGMENTS_ENV], "a") as f:
                f.write(self.name + "\n")
        self._writer, self._readers = None, {}
        self._scratch = bytearray(max_chunk_bytes)

    def handle(self) -> tuple[int, int, int, str]:
        return (self.n_reader, self.max_chunk_bytes, self.max_chunks, self.name)

    def _flags(self, idx: int) -> tuple[int, bytes]:
        m = self.module
        w = m.written_flag_offset(idx, self.n_reader, self.max_chunks, self.chunk_bytes)
        first = m.read_flag_offset(idx, 0, self.n_reader, self.max_chunks, self.chunk_bytes)
        return self._mem[w], bytes(self._mem[first:first + self.n_reader])

    def writable(self, idx: int) -> bool:
        written, reads = self._flags(idx)
        return not written or all(reads)

    def readable(self, idx: int, reader: int) -> bool:
        written, reads = self._flags(idx)
        return bool(written) and not reads[reader]

    def unread_by(self, idx: int) -> list[int]:
        return [k for k, r in enumerate(self._flags(idx)[1]) if not r]

    def mark_waiting(self) -> None:
        pass  # see buf above

    def take_waiting(self) -> bool:
        return True

    def write(self, idx: int, fill, frames):
        from minivllm.distributed import message_chunk
        from minivllm.distributed.shm_ring import NOT_READY
        packed = fill(memoryview(self._scratch), 0, self.max_chunk_bytes, frames)
        size = (message_chunk.packed_size([memoryview(f).nbytes for f in frames]) if packed
                else 1)  # an overflowed message leaves only its OVERFLOW byte
        self._writer = self._writer or self.ring.writer()
        if not self._writer.try_write(bytes(self._scratch[:size])):
            return NOT_READY
        return packed

    def read(self, idx: int, reader: int, copy_out):
        from minivllm.distributed.shm_ring import NOT_READY
        if reader not in self._readers:
            self._readers[reader] = self.ring.reader(reader)
        payload = self._readers[reader].try_read()
        return NOT_READY if payload is None else copy_out(memoryview(payload), 0)

    def close(self) -> None:
        self._mem = None
        self._writer, self._readers = None, {}
        self.ring.close()
        self.ring.unlink()  # the learner's unlink() acts only in the creator


def install(path: str) -> None:
    """Load the learner's file and make every MessageQueue of this process use it."""
    from minivllm.distributed import shm_broadcast
    spec = importlib.util.spec_from_file_location("learner_ring_buffer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    LearnerRing.module = module
    shm_broadcast.ShmRingBuffer = LearnerRing


if os.environ.get(RING_ENV):  # here, and in each spawned worker (see the module docstring)
    install(os.environ[RING_ENV])


# --- one run, in a child process ----------------------------------------------------------
def generate_tp3(model_dir: str) -> list[list[int]]:
    import numpy as np

    from minivllm.engine.config import EngineConfig
    from minivllm.engine.core import EngineCore
    from minivllm.engine.messages import EngineCoreRequest
    from minivllm.sampling_params import SamplingParams
    core = EngineCore(EngineConfig(model=model_dir, tensor_parallel_size=3))
    try:
        params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
        rng = np.random.default_rng(213)
        for i in range(NUM_PROMPTS):
            ids = rng.integers(3, 380, 5 + 9 * i).astype(np.int32)
            core.add_request(EngineCoreRequest(str(i), ids, params))
        tokens: dict[str, list[int]] = {str(i): [] for i in range(NUM_PROMPTS)}
        while core.has_unfinished_requests():
            for out in core.step().outputs:
                tokens[out.request_id] += np.asarray(out.new_token_ids).tolist()
        return [tokens[str(i)] for i in range(NUM_PROMPTS)]
    finally:
        core.shutdown()


def _child_main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    Path(args.out).write_text(json.dumps(generate_tp3(args.model)))


# --- the grader ---------------------------------------------------------------------------
def _run(ring: str | None, model_dir: str, workdir: str, label: str, timeout: float
         ) -> tuple[list | None, str]:
    """(tokens, "") or (None, what went wrong)."""
    out = os.path.join(workdir, f"{label}.json")
    env = {k: v for k, v in os.environ.items() if k not in (RING_ENV, SEGMENTS_ENV)}
    segments = os.path.join(workdir, f"{label}.segments")
    if ring:
        env[RING_ENV], env[SEGMENTS_ENV] = os.path.abspath(ring), segments
    try:
        proc = subprocess.run([sys.executable, "-m", "minivllm.judge.in_engine", "--model",
                               model_dir, "--out", out], env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return None, (f"the engine hung: no output after {timeout:.0f} s (a writer that "
                      f"never finds a free chunk, or a reader that never sees a written one).\n"
                      f"{_tail(e.stderr)}")
    created = Path(segments).read_text().split() if os.path.exists(segments) else []
    left = [name for name in created if os.path.exists(os.path.join("/dev/shm", name))]
    for name in left:  # the judge cleans up after the learner's code
        os.unlink(os.path.join("/dev/shm", name))
    if proc.returncode != 0:
        return None, f"the engine failed (exit code {proc.returncode}):\n{_tail(proc.stderr)}"
    tracker = re.search(r"There appear to be (\d+) leaked shared_memory", proc.stderr)
    if left or tracker:  # Python's resource tracker unlinks what a creator left, at exit
        count = len(left) or int(tracker.group(1))
        return None, (f"the engine's output came, but your ring left {count} shared-memory "
                      f"segment(s) behind{': ' + str(sorted(left)) if left else ''} (Python's "
                      "resource tracker had to remove them at exit): close() in every process, "
                      "unlink() in the creator")
    return json.loads(Path(out).read_text()), ""


def _tail(text, lines: int = 15) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join(("    " + t) for t in (text or "").strip().splitlines()[-lines:])


def describe_difference(expected: list[list[int]], got: list[list[int]]) -> str:
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            j = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return (f"request {i}: token {j} differs: the reference ring gave {a[j:j + 5]}..., "
                    f"yours {b[j:j + 5]}... ({len(a)} and {len(b)} tokens). A step reached the "
                    "workers changed, twice, or out of order")
    return f"{len(expected)} requests expected, {len(got)} came back"


def grade(learner_file: str) -> bool:
    """Print the verdict; True when the learner's ring gives the reference's output."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from tiny_model import make_tiny_model_dir
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="judge213-") as workdir:
        model = make_tiny_model_dir(os.path.join(workdir, "tiny"))
        print(f"in-engine check of {learner_file}: TP=3 tiny model, {NUM_PROMPTS} requests x "
              f"{NUM_TOKENS} greedy tokens, every MessageQueue on your ring")
        expected, error = _run(None, model, workdir, "reference", REFERENCE_TIMEOUT_S)
        if expected is None:
            print(f"could not run the reference engine on this machine:\n{error}")
            return False
        timeout = max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * (time.monotonic() - start))
        got, error = _run(learner_file, model, workdir, "learner", timeout)
    took = time.monotonic() - start
    if got is None:
        print(f"FAIL ({took:.0f} s): {error}")
        return False
    if got != expected:
        print(f"FAIL ({took:.0f} s): the engine's output differed: "
              f"{describe_difference(expected, got)}")
        return False
    print(f"PASS ({took:.0f} s): the engine's output on your ring equals the reference's")
    return True


if __name__ == "__main__":
    _child_main()
