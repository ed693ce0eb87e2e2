"""Writes chapters/04_serialization.ipynb (no outputs): .venv/bin/python chapters/build/04_serialization.py"""

from pathlib import Path

from nbwriter import write_notebook
from nbformat.v4 import new_code_cell, new_markdown_cell

md, code = new_markdown_cell, new_code_cell
cells = [
md("""# 04 · Serialization: what a message costs, and who pays

vLLM 0.33.0 pointers used in this chapter: `vllm/v1/serial_utils.py:135` (MsgpackEncoder),
`:312` (MsgpackDecoder), `vllm/v1/engine/__init__.py:113` (EngineCoreRequest).

## 1. Self-test
1. msgpack is a tighter format than pickle. Is it 10x faster for a batch of token-id lists?
2. Where does the time go when decoding 8,432 token ids from a list?
3. What does the receiver's numpy array point to after an out-of-band decode?
4. Why may the engine not `pickle.loads` a message from its socket?

<details><summary>Answers</summary>

1. No, about 1.3-2x: both create one Python int per id. Flat int32 arrays are 10-100x faster.
2. In creating Python objects (ints, lists, dicts), not in parsing bytes.
3. At the received frame's memory: `np.frombuffer`, no copy.
4. Unpickling runs code chosen by the sender: anyone who can reach the port owns the process.
</details>

## 2. The idea
Every request and every step crosses a process boundary, so it is turned into bytes and back.
The format matters less than the number of Python objects the receiver must build. So minivllm's
messages are msgspec Structs (`array_like`: values only, no field names) and every id list is a
numpy int32 array that travels as raw bytes in its own frame.

Everyday comparison: moving house. Pickle wraps every book separately and the receiver unwraps
every one; msgpack uses thinner paper, but still one parcel per book. Flat arrays move the
whole bookshelf in one piece.

## 3. The picture
![frames](../figures/04_frames.png)

(made by `figures/make_04.py`)

## 4. Experiments
What each cell prints is example output on this machine. Reference numbers from the project's
development machine (BENCHMARKS.md) are labelled as reference."""),
code("""import os, pickle, statistics, tempfile, time
import numpy as np
import matplotlib.pyplot as plt
from minivllm.bench import serial_batch as sb
QUICK = os.environ.get("MINIVLLM_QUICK", "") not in ("", "0")
REPEATS = 30 if QUICK else 300

batch = sb.seed_batch()
print(len(batch), "requests,", sum(len(r["token_ids"]) for r in batch), "token ids,",
      sum(len(r["block_ids"]) for r in batch), "block ids")
print("one request:", {k: (v if k == "request_id" else f"{len(v)} ints") for k, v in batch[1].items()})"""),
md("""### Four formats, the same batch
pickle of dicts; msgpack of the same dicts; array_like Structs (`omit_defaults=True`) of lists;
and one flat Struct whose ids are int32 arrays, through `minivllm.serial`."""),
code("""rows = []
for name, (encode, decode) in sb.codecs(batch).items():
    wire = encode()
    assert sb.same_batch(decode(wire), batch)
    enc, dec = [], []
    for _ in range(REPEATS):
        t0 = time.perf_counter(); wire = encode(); t1 = time.perf_counter(); decode(wire)
        enc.append(t1 - t0); dec.append(time.perf_counter() - t1)
    rows.append((name, sb.wire_bytes(wire), statistics.median(enc) * 1e6, statistics.median(dec) * 1e6))
base = rows[0][2] + rows[0][3]
print(f"{'format':15s} {'bytes':>7s} {'enc µs':>8s} {'dec µs':>8s} {'vs pickle':>9s}   (medians of {REPEATS})")
for name, nbytes, e, d in rows:
    print(f"{name:15s} {nbytes:7d} {e:8.1f} {d:8.1f} {base / (e + d):8.1f}x")
print("reference, not this machine: pickle ~870 µs, msgpack dicts ~560, Structs ~490, flat 6-7 µs")
fig, ax = plt.subplots(figsize=(6, 2.6))
ax.barh([r[0] for r in rows], [r[2] + r[3] for r in rows]); ax.set_xscale("log")
ax.set_xlabel("encode + decode, µs (log scale)"); ax.set_title("the seed step batch, this machine")
plt.tight_layout(); plt.show()"""),
md("""### The lesson, measured: the cost is creating Python objects
Decoding the same bytes costs far more when the result is many objects. Decode the token ids
alone: as a list of Python ints, and as one array."""),
code("""import msgspec
ids = np.concatenate([np.asarray(r["token_ids"], np.int32) for r in batch])
as_list = msgspec.msgpack.encode(ids.tolist())
as_bytes = msgspec.msgpack.encode(ids.tobytes())
dec = msgspec.msgpack.Decoder()
def median_us(fn):
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return statistics.median(times)
t_list = median_us(lambda: dec.decode(as_list))
t_arr = median_us(lambda: np.frombuffer(dec.decode(as_bytes), np.int32))
print(f"{len(ids)} ids -> list of ints: {t_list*1e6:7.1f} µs ({len(as_list)} B)")
print(f"{len(ids)} ids -> one int32 array: {t_arr*1e6:7.1f} µs ({len(as_bytes)} B)   {t_list / t_arr:.0f}x faster")
print("omit_defaults on array_like Structs: msgspec still writes every field:",
      msgspec.msgpack.encode(sb.RequestRow("r", [], [])))"""),
md("""### Tensors and arrays: inline below the threshold, out of band above
`MsgpackEncoder` puts an array smaller than 256 bytes inside the body; a larger one becomes an
extra frame that *is* the array's memory. The receiver's array is a view of the frame."""),
code("""import torch, zmq
from minivllm.serial import MsgpackDecoder, MsgpackEncoder
enc = MsgpackEncoder(size_threshold=256)
small, large = np.arange(10, dtype=np.int32), np.arange(100_000, dtype=np.int32)
frames = enc.encode({"small": small, "large": large, "weights": torch.ones(64, 64)})
print("frames:", [memoryview(f).nbytes for f in frames])
print("frame 1 is the sender's array itself:", np.shares_memory(np.frombuffer(frames[1], np.uint8), large))

ctx = zmq.Context()
a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
a.bind("inproc://ch04"); b.connect("inproc://ch04")
a.send_multipart(frames, copy=False)
got_frames = b.recv_multipart(copy=False)
msg = MsgpackDecoder().decode(got_frames)
frame_mem = np.frombuffer(got_frames[1].buffer, np.uint8)
print("receiver's array views frame 1's memory:", np.shares_memory(msg["large"], frame_mem),
      "| owns its data?", msg["large"].flags.owndata)
print("tensor:", msg["weights"].dtype, tuple(msg["weights"].shape))
a.close(); b.close(); ctx.term()"""),
md("""### pickle runs the sender's code: shown harmlessly
A pickle can name any callable and its arguments; `loads` calls it. This payload only writes a
file in a temporary directory, but it could run any command."""),
code("""import io
class Payload:
    def __init__(self, path): self.path = path
    def __reduce__(self):   # "to rebuild me, call open(path, 'w')"
        return (io.open, (self.path, "w"))
with tempfile.TemporaryDirectory() as d:
    target = os.path.join(d, "owned.txt")
    data = pickle.dumps(Payload(target))
    print("payload bytes:", data[:60], "...")
    pickle.loads(data).close()          # the receiver only *decodes*
    print("file created by decoding:", os.path.exists(target))"""),
code("""from minivllm.serial import INSECURE_ENV, DecodeError
try:
    MsgpackEncoder().encode({"x": Payload("/nonexistent")})
except TypeError as e:
    print("encode refused:", e)
os.environ[INSECURE_ENV] = "1"       # the user's explicit opt-in
pickled = MsgpackEncoder().encode({"x": Payload("/tmp/never-written")})
del os.environ[INSECURE_ENV]
try:
    MsgpackDecoder().decode(pickled)
except DecodeError as e:
    print("decode refused:", e)
try:
    MsgpackDecoder().decode([os.urandom(64)])
except DecodeError as e:
    print("garbage:", type(e).__name__, str(e)[:80])"""),
md("""## 5. In vLLM
- `vllm/v1/serial_utils.py:135`: `MsgpackEncoder`; `:236` `_encode_ndarray` inlines small arrays
  (`CUSTOM_TYPE_RAW_VIEW`, `:43`) and appends large ones to the extra buffers by index.
- `vllm/v1/serial_utils.py:220`: pickle only if `VLLM_ALLOW_INSECURE_SERIALIZATION`.
- `vllm/v1/serial_utils.py:312` `MsgpackDecoder`; `:388` `_decode_ndarray`: `np.frombuffer`, no copy.
- `vllm/v1/engine/__init__.py:113`: `EngineCoreRequest`, `array_like=True, omit_defaults=True`.
- `vllm/v1/engine/core_client.py:1045`: a request goes out as `(identity, type, *encoder.encode(req))`.

## 6. What we add to minivllm
`minivllm/serial.py` (the encoder and decoder) and `minivllm/engine/messages.py` (the wire
types). Unlike vLLM, an array is one msgpack ext value, so even an untyped decode rebuilds it."""),
code("""import inspect, minivllm.serial as serial, minivllm.engine.messages as messages
print(inspect.getsource(serial.MsgpackEncoder))
print(inspect.getsource(messages.EngineCoreRequest))"""),
code("""from minivllm.engine.messages import EngineCoreRequest
from minivllm.sampling_params import SamplingParams
req = EngineCoreRequest("req-0", np.arange(2000, dtype=np.int32), SamplingParams(max_tokens=8), time.time())
frames = MsgpackEncoder().encode(req)
back = MsgpackDecoder(EngineCoreRequest).decode(frames)
print("frames:", [memoryview(f).nbytes for f in frames], "| round trip ok:",
      np.array_equal(back.prompt_token_ids, req.prompt_token_ids) and back.sampling_params == req.sampling_params)"""),
md("""## 7. What can go wrong
| symptom | cause |
|---|---|
| the engine's step time grows with batch size even when the GPU is idle | ids sent as lists: one Python object per token |
| `TypeError ... MINIVLLM_ALLOW_INSECURE_SERIALIZATION` | an object msgpack cannot express; send a Struct, or opt in between trusted processes |
| a decoded array changes later | it views the frame; copy it if you keep it and the buffer is reused |
| `ValueError: assignment destination is read-only` | arrays decoded from bytes frames are read-only views |
| memory not released | a small view keeps a whole large frame alive |
| `DecodeError` | garbage or a peer on another version: the receiving loop logs and goes on |
| a 64 MiB tensor moves at a tenth of memcpy, although nothing is copied in Python | a socket copies twice (into the kernel, out of it), and libzmq mallocs fresh memory per message, so the receiver page-faults every 4 KiB; `minivllm bench serial` shows the raw-socket ceiling and a reused receive buffer side by side |

## 8. Check yourself
- *Easy.* Why `array_like=True`? **Answer:** field names are not sent: smaller and faster.
- *Easy.* Below what size does an array stay inline, and why? **Answer:** 256 B: an extra frame
  costs more than copying a few hundred bytes.
- *Medium.* msgpack of dicts is 1.3x faster than pickle here, flat arrays 10x+. Explain.
  **Answer:** both dict formats build 8,432 int objects and 256 dicts; flat arrays build 5.
- *Medium.* Give the timeline that corrupts a message sent with `copy=False`. **Answer:** encode
  views array A, send returns, the engine writes the next step into A, the I/O thread then reads
  A: the receiver sees the new values. Keep A until the tracker is done.
- *Hard.* "Out of band is zero copy, so a 64 MiB tensor over ZMQ ipc:// should move at memcpy
  speed." Where does the time go? **Answer:** zero copy means no copy *in Python*. The kernel
  still copies the bytes into the socket and out again, so even a raw AF_UNIX stream into a
  reused buffer reaches only about a third of memcpy (bench: `socket_ceiling_vs_memcpy`). On top,
  libzmq receives each large message into freshly malloc'd memory: 16,384 page faults per
  64 MiB. Receiving 1 MiB frames into a buffer faulted once roughly doubles the rate; for real
  memcpy speed, skip the socket: shared memory (chapter 05) or CUDA IPC (chapter 06).
- *Hard.* A colleague proposes pickle "because it handles everything". What do you answer?
  **Answer:** it executes code from the socket (show the payload), and it is not faster where it
  matters; a typed Struct also validates the input.

## 9. How to explain it
"Serialization cost is object creation. A step of 256 requests has 8,000 token ids; as lists,
both pickle and msgpack build 8,000 Python ints on the other side. So our wire types are msgspec
Structs with numpy arrays, and the encoder sends each large array as a separate zero-copy ZMQ
frame that the receiver wraps with np.frombuffer. pickle is refused on sockets unless the user
opts in, because unpickling runs the sender's code."

## 10. Summary and Practice
- Count the objects, not the bytes: flat int32 arrays beat any list format by 10x or more.
- array_like Structs: values only, typed and validated on decode.
- Large arrays travel out of band, zero copy on both sides; small ones inline.
- Never unpickle from a socket unless every peer is trusted, explicitly.

Practice:
- `python judge.py 211` · a flat-array encoder/decoder for a scheduler batch, zero copy
  (stuck? `python judge.py 211 --hint`)
- `python judge.py 212` · a msgpack extension encoder for numpy arrays: inline below a threshold,
  out-of-band zero-copy frames above it, one documented error for garbage
  (stuck? `python judge.py 212 --hint`)
- `minivllm bench serial` · the measurements above, plus a 64 MiB tensor between processes:
  out of band, pickled, memcpy and the raw-socket ceiling, side by side"""),
]

out = Path(__file__).resolve().parents[1] / "04_serialization.ipynb"
write_notebook(cells, out)
