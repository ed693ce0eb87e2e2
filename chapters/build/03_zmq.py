"""Writes chapters/03_zmq.ipynb (no outputs): .venv/bin/python chapters/build/03_zmq.py"""

from pathlib import Path

from nbwriter import write_notebook
from nbformat.v4 import new_code_cell, new_markdown_cell

md, code = new_markdown_cell, new_code_cell
cells = [
md("""# 03 · ZMQ: the sockets between the front end and the engine

vLLM 0.33.0 pointers used in this chapter: `vllm/utils/network_utils.py:349` (make_zmq_socket),
`vllm/v1/engine/core_client.py:1045` (the ROUTER send), `vllm/v1/engine/core.py:1979` (the ready
message), `vllm/distributed/device_communicators/shm_broadcast.py:693` (XPUB: wait for readers).

## 1. Self-test
1. A PUB sends 5 messages right after a SUB connects. How many arrive?
2. Why can a ROUTER not send to an engine that has not sent anything yet?
3. What does `SNDHWM = 0` change, and why does vLLM set it on PUSH, DEALER and ROUTER?
4. May you change a numpy array right after `sock.send(arr, copy=False)` returns?

<details><summary>Answers</summary>

1. Often none: the subscription travels to the PUB asynchronously; until it arrives the PUB
   drops everything (the *slow joiner*). Wait for the subscription with XPUB.
2. A ROUTER routes by the identity frame of a connected peer, and learns the peer's identity
   when it connects; with DEALERs connecting, the engine's first message (ready) is the proof
   that the pipe exists. Sent to an unknown identity, a message is silently dropped.
3. No high-water mark: the queue grows without limit instead of blocking the sender (PUSH,
   DEALER) or dropping (ROUTER). The engine prefers memory growth to a stalled busy loop.
4. No. libzmq's IO thread reads the buffer later. Wait on a `MessageTracker` (`track=True`).
</details>

## 2. The idea
ZMQ is a message library: a *socket* sends whole messages (lists of frames), queues them, and a
background I/O thread moves them over tcp://, ipc:// or inproc://, reconnecting as needed. Each
socket *type* is a pattern: PUSH/PULL deals work out, PUB/SUB broadcasts, REQ/REP is a strict
conversation, ROUTER/DEALER are asynchronous and addressable.

Everyday comparison: ZMQ is the post room of an office. You drop a labelled envelope (a
multipart message) in the out-tray and go back to work; the clerk (the I/O thread) delivers it
later. A ROUTER is a switchboard that can only call back desks that have called it once.

## 3. The picture
![the engine's sockets](../figures/03_engine_sockets.png)

(made by `figures/make_03.py`)

## 4. Experiments
Every cell bounds its waits with `poll(timeout)` and closes its sockets. Threads stand in for
peers where a process would add nothing: the socket semantics are the same. What each cell prints is
example output on this machine; the only reference numbers (BENCHMARKS.md) are labelled as such."""),
code("""import os, statistics, threading, time
import numpy as np
import zmq
from minivllm.utils.zmq import (IpcDir, bound_address, close_all, dp_rank_identity,
                                identity_to_rank, make_zmq_socket, tcp_address)

QUICK = os.environ.get("MINIVLLM_QUICK", "") not in ("", "0")
ctx = zmq.Context()
ipc = IpcDir()          # every ipc:// file of this chapter lives here; removed at the end
WAIT_MS = 2000          # the longest any cell waits for a message

def drain(sock, timeout_ms=200):
    \"\"\"Receive until nothing arrives for timeout_ms.\"\"\"
    got = []
    while sock.poll(timeout_ms):
        got.append(sock.recv_multipart())
    return got
print("pyzmq", zmq.__version__, "libzmq", zmq.zmq_version(), "| ipc dir:", ipc.dir)"""),
md("""### PUSH/PULL: load balancing, and the first worker that takes everything
A PUSH deals messages round-robin over the pullers **connected at that moment**. Send before
the others connect and the first one gets the whole batch."""),
code("""def push_pull(wait_for_all):
    push = make_zmq_socket(ctx, ipc.path("work"), zmq.PUSH, bind=True, linger=0)
    pulls = []
    for i in range(3):
        pulls.append(make_zmq_socket(ctx, ipc.path("work"), zmq.PULL, bind=False, linger=0))
        if i == 0 and not wait_for_all:
            for n in range(30):
                push.send(b"job %d" % n)
    if wait_for_all:
        time.sleep(0.2)   # a real engine waits for a ready message from each worker instead
        for n in range(30):
            push.send(b"job %d" % n)
    counts = [len(drain(p)) for p in pulls]
    close_all(push, *pulls)
    return counts
print("send at once     :", push_pull(False), "<- the first puller took everything")
print("wait for pullers :", push_pull(True), "<- round-robin")"""),
md("""### PUB/SUB: the slow joiner, then XPUB to fix it
A SUB's subscription reaches the PUB a little after `connect` returns. Until then the PUB has no
subscriber and drops. Whether the 5 messages below arrive is a race, so the cell runs it many
times. An XPUB receives each subscription as a message (`b"\\x01" + topic`), so
the writer can wait until every reader has joined: that is how vLLM's MessageQueue starts."""),
code("""from collections import Counter
TRIALS = 10 if QUICK else 20   # it is a race, so count how often each side wins

def pub_right_away():
    \"\"\"PUB binds, SUB connects and subscribes, PUB sends 5 at once: how many arrive?\"\"\"
    pub = make_zmq_socket(ctx, ipc.path("pub"), zmq.PUB, linger=0)
    sub = make_zmq_socket(ctx, ipc.path("pub"), zmq.SUB, linger=0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    for n in range(5):
        pub.send(b"update %d" % n)
    got = len(drain(sub, 50))
    close_all(pub, sub)
    return got

def xpub_waits(n_subs=3):
    \"\"\"XPUB binds, waits for n_subs subscriptions, then sends 5: how many does each SUB get?\"\"\"
    xpub = make_zmq_socket(ctx, ipc.path("xpub"), zmq.XPUB, linger=0)   # XPUB_VERBOSE is set
    subs = [make_zmq_socket(ctx, ipc.path("xpub"), zmq.SUB, linger=0) for _ in range(n_subs)]
    for s in subs:
        s.setsockopt(zmq.SUBSCRIBE, b"")
    joined = 0
    while joined < n_subs and xpub.poll(WAIT_MS):
        joined += xpub.recv()[:1] == b"\\x01"    # \\x01 = subscribe, \\x00 = unsubscribe
    for n in range(5):
        xpub.send(b"update %d" % n)
    got = [len(drain(s, 50)) for s in subs]
    close_all(xpub, *subs)
    return joined, got

pub_counts = Counter(pub_right_away() for _ in range(TRIALS))
print(f"PUB, send at once: {{received of 5: trials}} = {dict(pub_counts)}; "
      f"messages lost in {TRIALS - pub_counts[5]} of {TRIALS} trials (the slow joiner)")
xpub_runs = [xpub_waits() for _ in range(TRIALS)]
print(f"XPUB, wait first : saw {sorted({j for j, _ in xpub_runs})} subscriptions per trial; "
      f"all 3 SUBs got all 5 in {sum(got == [5, 5, 5] for _, got in xpub_runs)} of {TRIALS} trials")"""),
md("""### REQ/REP: lockstep, and what a lost reply does
REQ must alternate send, recv, send... A second send is an error (EFSM). If the reply is lost
(the server died after reading), the REQ is stuck: it cannot send again. The only cure is to
close it and open a new socket (the ZMQ Guide's *lazy pirate*)."""),
code("""rep = make_zmq_socket(ctx, ipc.path("rep"), zmq.REP, linger=0)
req = make_zmq_socket(ctx, ipc.path("rep"), zmq.REQ, bind=False, linger=0)
req.send(b"ping")
try:
    req.send(b"ping again")
except zmq.ZMQError as e:
    print("second send without recv:", e)
rep.recv(); rep.close()                      # the server reads, then dies without replying
print("reply within 300 ms?", bool(req.poll(300)))
try:
    req.send(b"retry")
except zmq.ZMQError as e:
    print("retry on the same REQ:", e, "-> close it and make a new one")
req.close()"""),
md("""### ROUTER/DEALER: identities, routing, and why the engine says "ready" first
A ROUTER prepends the sender's identity to each message it receives, and routes an outgoing
message by its first frame. The engine's DEALER takes its DP rank as identity (2 bytes, little
endian). With `ROUTER_MANDATORY`, routing to a peer the ROUTER does not know is an error instead
of a silent drop: that is the message you would lose without the ready handshake."""),
code("""router = make_zmq_socket(ctx, ipc.path("input"), zmq.ROUTER, linger=0)
router.send_multipart([dp_rank_identity(1), b"ADD req-0"])   # no engine yet: no error either
print("route req-0 to rank 1 before any engine connected: send returned normally")
router.setsockopt(zmq.ROUTER_MANDATORY, 1)
try:
    router.send_multipart([dp_rank_identity(1), b"ADD req-0b"])
except zmq.ZMQError as e:
    print("the same with ROUTER_MANDATORY:", e)
engines = [make_zmq_socket(ctx, ipc.path("input"), zmq.DEALER, bind=False, linger=0,
                           identity=dp_rank_identity(r)) for r in range(2)]
for e in engines:
    e.send(b"ready")                     # vllm/v1/engine/core.py:1979
for _ in engines:
    if router.poll(WAIT_MS):
        ident, msg = router.recv_multipart()
        print("ROUTER got", msg, "from identity", ident, "= DP rank", identity_to_rank(ident))
router.send_multipart([dp_rank_identity(1), b"ADD req-1"])
print("engine 0 got:", drain(engines[0], 100), "| engine 1 got:", drain(engines[1]),
      "<- req-0 was dropped, not queued")
close_all(router, *engines)"""),
md("""### Connect before bind, and multipart frames
ZMQ connects in the background and retries, so the connecting side may start first: the
message waits in its queue. A multipart message arrives whole or not at all."""),
code("""push = make_zmq_socket(ctx, ipc.path("late"), zmq.PUSH, bind=False, linger=0)  # nobody bound yet
push.send_multipart([b"\\x00", b"msgpack body", b"raw frame" * 100])
time.sleep(0.1)
pull = make_zmq_socket(ctx, ipc.path("late"), zmq.PULL, bind=True, linger=0)
frames = pull.recv_multipart() if pull.poll(WAIT_MS) else []
print("bound 100 ms after the send, got", len(frames), "frames of", [len(f) for f in frames], "bytes")
close_all(push, pull)"""),
md("""### `copy=False` and the MessageTracker
`copy=False` hands libzmq a pointer instead of a copy; the I/O thread reads it later. A
`MessageTracker` says when libzmq let go of the buffer. Writing before that corrupts the
message in flight (vLLM reuses its encode buffer only after `tracker.done`:
`vllm/v1/engine/core.py:2104`)."""),
code("""MIB = 1 << 20
arr = np.ones((32 if QUICK else 128) * MIB, np.uint8)
push = make_zmq_socket(ctx, tcp_address(), zmq.PUSH, bind=True, linger=0)
pull = make_zmq_socket(ctx, bound_address(push), zmq.PULL, bind=False, linger=0)
for copy in (True, False):
    t0 = time.perf_counter()
    tracker = push.send(arr, copy=copy, track=not copy)   # a tracker exists only for copy=False
    t1 = time.perf_counter()
    released = "yes (copied)" if copy else tracker.done
    print(f"copy={copy!s:5}: send returned after {(t1 - t0) * 1e3:7.2f} ms; "
          f"may I reuse arr now? {released}")
    pull.recv(copy=False)
    if tracker is not None:
        tracker.wait(WAIT_MS / 1000)
    print(f"             delivered and released after {(time.perf_counter() - t0) * 1e3:7.2f} ms")
close_all(push, pull)"""),
md("""### The high-water mark
Each pipe holds at most HWM messages. At the mark, PUSH/DEALER **block** (or raise `Again`
with NOBLOCK) and PUB **drops**. minivllm's engine sockets set HWM 0: unlimited."""),
code("""def fill(hwm, kind=zmq.PUSH, peer=zmq.PULL, n=20_000):
    tx = ctx.socket(kind); tx.setsockopt(zmq.SNDHWM, hwm); tx.setsockopt(zmq.LINGER, 0)
    rx = ctx.socket(peer); rx.setsockopt(zmq.RCVHWM, hwm); rx.setsockopt(zmq.LINGER, 0)
    addr = ipc.path("hwm")
    tx.bind(addr); rx.connect(addr)
    if peer == zmq.SUB:
        rx.setsockopt(zmq.SUBSCRIBE, b"")
    time.sleep(0.1)
    sent = 0
    for _ in range(n):
        try:
            tx.send(b"x" * 100, zmq.NOBLOCK); sent += 1
        except zmq.Again:
            break
    got = len(drain(rx, 100))
    close_all(tx, rx)
    return sent, got
print("PUSH, HWM 10     : sent %d before Again, received %d" % fill(10))
print("PUSH, HWM 0      : sent %d of 20000, received %d" % fill(0))
print("PUB,  HWM 10     : sent %d (never blocks), received %d: the rest dropped" % fill(10, zmq.PUB, zmq.SUB))"""),
md("""### ipc:// vs tcp://, measured
Round-trip latency of a 64-byte message and throughput of 1 MiB messages between two sockets
(the peer is a thread; libzmq's I/O threads do the transport work either way)."""),
code("""def echo(addr, stop):
    s = make_zmq_socket(ctx, addr, zmq.DEALER, bind=False, linger=0)
    s.send(b"ready")                  # so the ROUTER learns our identity
    while not stop.is_set():
        if s.poll(50):
            s.send_multipart(s.recv_multipart(copy=False), copy=False)
    s.close()

def measure(addr_for_bind):
    router = make_zmq_socket(ctx, addr_for_bind, zmq.ROUTER, linger=0)
    stop = threading.Event()
    t = threading.Thread(target=echo, args=(bound_address(router), stop)); t.start()
    try:
        assert router.poll(WAIT_MS), "the echo thread did not say ready"
        ident = router.recv_multipart()[0]
        small, big = b"x" * 64, np.ones(MIB, np.uint8)
        rtts = []
        for _ in range(200 if QUICK else 2000):
            t0 = time.perf_counter()
            router.send_multipart([ident, small])
            assert router.poll(WAIT_MS); router.recv_multipart()
            rtts.append(time.perf_counter() - t0)
        n = 50 if QUICK else 300
        t0 = time.perf_counter()
        for _ in range(n):
            router.send_multipart([ident, big], copy=False)
            assert router.poll(WAIT_MS); router.recv_multipart(copy=False)
        gbps = 2 * n * MIB / (time.perf_counter() - t0) / 1e9
    finally:
        stop.set(); t.join(); router.close()
    return statistics.median(rtts) * 1e6, gbps

for name, addr in [("ipc", ipc.path("bench")), ("tcp", tcp_address())]:
    us, gbps = measure(addr)
    print(f"{name}: round trip {us:6.1f} µs (median), 1 MiB echo {gbps:5.2f} GB/s")
print("reference, not this machine (BENCHMARKS.md): zmq REQ/REP ipc 72.7 µs; PUSH/PULL ipc 3.6 GB/s")"""),
md("""### The background I/O thread
`send` only queues; libzmq's I/O thread (one per context by default) writes to the kernel.
You can see the threads in `/proc/self/task`. Because the I/O thread owns the message, it outlives
`close()`: a socket closed with a linger keeps trying to deliver for that long, even to a peer
that binds only after the close. With linger 0 the message is dropped at once."""),
code("""def threads():
    return len(os.listdir("/proc/self/task"))
before = threads()
c2 = zmq.Context(io_threads=2)
s = c2.socket(zmq.PUSH)          # the first socket starts the context's threads
print(f"OS threads: {before} before, {threads()} with a 2-I/O-thread context "
      "(2 I/O threads + libzmq's reaper)")
s.close(linger=0); c2.term()
print(f"after term: {threads()}")

for linger in (0, 1000):
    addr = ipc.path(f"linger{linger}")
    push = make_zmq_socket(ctx, addr, zmq.PUSH, bind=False)   # nobody has bound yet
    push.send(b"survivor")
    push.close(linger=linger)                                 # gone from Python ...
    time.sleep(0.05)
    pull = make_zmq_socket(ctx, addr, zmq.PULL, bind=True, linger=0)   # ... then a peer binds
    print(f"closed with linger={linger:4} ms before anyone bound; the late PULL got", drain(pull, 500))
    pull.close()"""),
md("""## 5. In vLLM
- `vllm/utils/network_utils.py:349`: `make_zmq_socket`; `:372` and `:376` set RCVHWM/SNDHWM to 0;
  `:390` XPUB_VERBOSE; `:334` the buffer-size policy (0.5 GiB only on big machines).
- `vllm/utils/network_utils.py:175`: `get_open_zmq_ipc_path`, a fresh ipc path per engine.
- `vllm/v1/engine/core_client.py:754`: engine identities are `rank.to_bytes(2, "little")`;
  `:1045` sends `(identity, request_type, *frames)` through the ROUTER.
- `vllm/v1/engine/core.py:1979`: each DEALER sends its ready message first; `:1992` reads
  `type_frame, *data_frames`.
- `vllm/v1/engine/core.py:2156`: `send(..., copy=False, track=True)`; `:2104` keeps the buffer
  while `not tracker.done`.
- `vllm/distributed/device_communicators/shm_broadcast.py:537`: the MessageQueue's XPUB;
  `:693` waits for all readers to subscribe.

## 6. What we add to minivllm
`minivllm/utils/zmq.py`: the socket factory with vLLM's defaults, a private ipc directory that
is removed on close, tcp port 0, and DP identities. The directory matters because closing a
bound ipc:// socket leaves its socket file behind (libzmq 4.3); vLLM unlinks its files itself
(`vllm/utils/network_utils.py:43`)."""),
code("""import inspect, minivllm.utils.zmq as mz
print(inspect.getsource(mz.make_zmq_socket)); print(inspect.getsource(mz.IpcDir))"""),
code("""with IpcDir() as d:
    print("mode", oct(os.stat(d.dir).st_mode & 0o777), d.path("input"))
    s = make_zmq_socket(ctx, d.path("input"), zmq.ROUTER, linger=0)
    print("SNDHWM", s.getsockopt(zmq.SNDHWM), "RCVHWM", s.getsockopt(zmq.RCVHWM), "files:", os.listdir(d.dir))
    s.close(); time.sleep(0.1)
    print("socket closed; files still in the directory:", os.listdir(d.dir),
          "<- libzmq 4.3 does not unlink a bound ipc file")
print("after IpcDir.close(), directory exists?", os.path.exists(d.dir))
t = make_zmq_socket(ctx, "tcp://127.0.0.1:0", zmq.PULL, linger=0)
print("port 0 bound to", bound_address(t)); t.close()"""),
md("""## 7. What can go wrong
| symptom | cause |
|---|---|
| the first messages of a broadcast vanish | slow joiner: PUB drops until the subscription arrives; wait with XPUB |
| a request to one engine never arrives, no error | ROUTER dropped it: that identity had not connected; wait for ready, or set ROUTER_MANDATORY |
| the client hangs forever after a server restart | REQ waiting for a lost reply; use DEALER, or poll with a timeout and recreate the socket |
| `ctx.term()` hangs at exit | a socket still open with unsent messages and linger -1: close sockets with a linger |
| one worker gets all the work | PUSH sent before the others connected |
| output corrupted under load | a buffer reused after `send(copy=False)` before the tracker was done |
| stale `ipc` socket files pile up in /tmp | libzmq does not unlink a bound ipc file on close; remove it (or its private directory) yourself |
| memory grows without bound | HWM 0 and a consumer that stopped reading: the price of never blocking |

## 8. Check yourself
- *Easy.* Which side of the engine's input channel binds, and why may the engine start first?
  **Answer:** the front end's ROUTER binds; the engine's DEALER connects, and ZMQ retries the
  connection in the background, so either may start first.
- *Easy.* What is in frame 0 of a message the ROUTER receives? **Answer:** the sender's identity.
- *Medium.* Give the timeline that loses a request. **Answer:** front end binds ROUTER, engine
  DEALER connects (not yet completed), front end sends `[b"\\x00\\x00", ADD, ...]`; the ROUTER has
  no pipe for that identity and drops it. The ready message makes the front end wait for step 2.
- *Medium.* Why HWM 0 on the engine's sockets but not on PUB? **Answer:** the engine must not
  block its busy loop or lose requests; a PUB used for best-effort broadcast may drop.
- *Hard.* Which channel for sending the same scheduler output to 8 workers on one host, and why
  not ZMQ PUB? **Answer:** a shared-memory ring (chapter 05): one copy for all readers instead of
  8 socket writes; PUB keeps for remote readers, with XPUB for the start-up.
- *Hard.* A ROUTER serves 2 engines; engine 1 crashes and restarts with the same identity. What
  happens? **Answer:** by default the ROUTER refuses the duplicate identity while the old pipe
  lives; vLLM sets ROUTER_HANDOVER (`network_utils.py:381`) so the new connection takes over.

## 9. How to explain it
"The front end and the engine talk over two ZMQ channels: a ROUTER to DEALER pipe for requests,
addressed by the engine's DP rank, and PUSH to PULL for outputs. ZMQ gives us whole multipart
messages, background I/O and reconnection. Two traps shape the protocol: a ROUTER cannot route
to a peer it has not heard from, so each engine says ready first, and subscribers join late, so
broadcasts wait for subscriptions on an XPUB. We set the high-water mark to zero so the busy loop
never blocks, and we send large buffers with copy=False and track them."

## 10. Summary and Practice
- Pick the pattern by the conversation: deal out (PUSH/PULL), broadcast (PUB/SUB), address
  (ROUTER/DEALER); avoid REQ/REP where a reply can be lost.
- Handshakes cover what ZMQ does not: ready messages for ROUTER, subscriptions for PUB.
- HWM decides between blocking, dropping and memory; the engine chooses memory.
- `copy=False` saves a copy but lends the buffer; a tracker returns it.

Practice:
- `python judge.py 201` · a ROUTER front end that dispatches to engines by identity and gathers outputs
- `python judge.py 202` · a PUB/SUB start-up safe against the slow joiner, with XPUB"""),
code("""ctx.term()   # every socket above is closed, so this returns at once
ipc.close()
print("closed; ipc dir removed:", not os.path.exists(ipc.dir))"""),
]

out = Path(__file__).resolve().parents[1] / "03_zmq.ipynb"
write_notebook(cells, out)
