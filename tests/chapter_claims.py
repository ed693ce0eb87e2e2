"""What each chapter's prose says its cells show, as patterns its executed outputs must contain.

tests/test_chapters.py runs every chapter in quick mode and checks these against the text the
cells printed (stdout, and the name and message of an error a `raises-exception` cell raised).
A claim here is structural (a count, an order, which error, that a schedule breaks), never a
machine's timing: where the prose compares speeds, the cell prints "on this machine ..." from
its own measurement, and the claim checks that the sentence is there, not what it says.
"""

# What no chapter's output may show (stdout or stderr): a drill reports expected failures in
# one line each, and a progress bar is one output line redrawn in place, never a stream of redraws.
ABSENT: list[tuple[str, str]] = [
    (r"Traceback \(most recent call last\)", "a traceback outside a cell meant to raise"),
    (r"TqdmWarning", "tqdm's text bar in a notebook"),
]

# chapter number -> [(regex, what the prose relies on)]
CLAIMS: dict[str, list[tuple[str, str]]] = {
    "01": [
        (r"2 burns on 2 processes: .*x serial", "the processes' speed-up is measured"),
        (r"on this machine threads ran [0-9.]+x serial and processes [0-9.]+x",
         "the thread vs process comparison is stated from this run"),
        (r"the forked child waited 1 s for the lock and gave up",
         "a fork copies a held lock without its owner"),
        (r"ChildStartError: .*\n(?:.*\n){0,8}.*Can't get attribute 'work'",
         "spawn cannot find a target defined in a notebook"),
        (r"unguarded\.py: stdout 'child exit code 1'.*bootstrapping phase",
         "an unguarded script fails under spawn"),
        (r"guarded\.py: stdout 'child exit code 0'", "the guarded script works"),
        (r"tp=2 dp=4 api=default: 1 launcher \+ 4 API servers \+ 4 engine cores \+ 8 workers "
         r"\+ 1 DP coordinator = 18 processes", "-tp 2 -dp 4 starts 18 processes"),
        (r"both children gone [0-9.]+ ms after their parent's SIGKILL",
         "the death pipe stops the children of a killed parent"),
    ],
    "02": [
        (r"on this machine, 64 B round trips: ", "the round-trip order is this run's"),
        (r"on this machine at 1 MiB: unix [0-9.]+ GB/s, tcp [0-9.]+ GB/s",
         "unix vs TCP is stated from this run"),
        (r"same_file\s*\n.*True\s*\n", "the passed descriptor names the same file"),
        (r"every byte arrived: True", "the shm ring delivers every byte"),
        (r"on this machine at 1 MiB: \w+ moved the most between processes, [0-9.]+ GB/s = [0-9.]+x "
         r"memcpy", "which transport won at each size is printed from this run, against memcpy"),
        (r"at 1 MiB: \w+ moved the most .*x memcpy \(the median of \d rounds, as in the summary\)",
         "at 1 MiB the verdict's ratio is the summary table's"),
    ],
    "03": [
        (r"send at once\s*: \[30, 0, 0\]", "a PUSH that sends at once feeds the first puller"),
        (r"wait for pullers : \[10, 10, 10\]", "round-robin once every puller is connected"),
        (r"all 3 SUBs got all 5 in 10 of 10 trials", "XPUB waiting for subscriptions loses nothing"),
        (r"the same with ROUTER_MANDATORY: Host unreachable", "ROUTER_MANDATORY refuses an unknown peer"),
        (r"engine 0 got: \[\] \| engine 1 got: \[\[b'ADD req-1'\]\]", "ROUTER drops to an unknown identity"),
        (r"PUSH, HWM 10     : sent \d+ before Again, received \d+\n  (the loop stopped at its first "
         r"Again: the PUSH's 10-message pipe was full|\d+ > 10: before the first Again the PUSH's "
         r"I/O thread moved \d+)", "why the PUSH stopped where it did is printed from this run"),
        (r"PUB,  HWM 10     : sent 20000 \(never blocks\), received \d+: the rest dropped",
         "PUB drops past its high-water mark"),
        (r"the send loop took \d+ ms; (\d+ > 10 \+ 10 because the PUB's I/O thread moved \d+ messages "
         r"past the two pipes|no more than the two pipes' 10 \+ 10 got through)",
         "why more than the two pipes' HWM got through is explained from this run's numbers"),
        (r"a 1 ms pause every 10 sends: sent 2000 in \d+ ms, received \d+: between bursts the I/O "
         r"threads move messages on, into the kernel's socket buffers \(up to \d+ B",
         "the I/O threads and the kernel's buffers behind the HWM, measured"),
        (r"closed with linger=1000 ms before anyone bound; the late PULL got \[\[b'survivor'\]\]",
         "linger keeps a pending message"),
        (r"after IpcDir\.close\(\), directory exists\? False", "IpcDir removes its socket files"),
        (r"on this machine ipc's round trip took [0-9.]+x tcp's", "ipc vs tcp is stated from this run"),
    ],
    "04": [
        (r"frame 1 is the sender's array itself: True", "a large array goes out of band without a copy"),
        (r"receiver's array views frame 1's memory: True", "the receiver views the frame"),
        (r"file created by decoding: True", "unpickling runs code"),
        (r"encode refused: cannot send a Payload", "minivllm refuses pickle by default"),
        (r"round trip ok: True", "the tensor round trip"),
        (r"on this machine, ids that stay an array: the array won at .*, the list at ",
         "which side won at each size, ids kept as an array, is printed from this run"),
        (r"on this machine, when the receiver needs Python ints: array \+ tolist\(\) won at .*, "
         r"the list at ", "which side won when the receiver needs ints is printed from this run"),
    ],
    "05": [
        (r"reference order: \d+ schedules explored, no failure",
         "the correct ring explores every schedule without failure"),
        (r"wrong order: schedule number \d+ breaks it -> reader 0: received b'm0' as message 2, "
         r"expected b'm2--' \(a message it already had\)",
         "the wrong flag order makes the reader take m0 twice"),
        (r"schedule \d+: reader 0: received .* \(a corrupted message\)",
         "releasing before copying corrupts a message"),
        (r"on this machine MessageQueue moved [0-9.]+x the bare ring's messages",
         "MessageQueue vs the bare ring is stated from this run"),
        (r"TimeoutError: worker 1 sent no reply within [0-9.]+ s \(its process: dead",
         "a killed worker is named by its rank, not by the reply queue's reader 0"),
        (r"segments left behind: none", "a failed ring leaves no segment"),
        (r"batched: a quarter ring +[0-9.]+ +0\.\d+", "the batched doorbell sleeps under once a message"),
        (r"4 KiB, after a fork +[0-9.]+ +[1-9]\d{3,}", "a forked child's pages fault on every copy"),
        (r"on this machine numpy's ring \(\d+% in 2 MiB pages\) copied [0-9.]+x the GB/s of 4 KiB pages",
         "what 2 MiB pages buy memcpy is printed from this run"),
        (r"on this machine the ring moved [0-9.]+x memcpy at 1 MiB \(median of \d rounds, spread",
         "the ring against memcpy is stated from this run, with its spread"),
    ],
    "06": [
        (r"new names in /dev/shm: none", "the file_descriptor strategy leaves no name in /dev/shm"),
        (r"round 2: .*engine == trainer: True", "a later round hands the weights over too"),
        (r"engine's tensors kept their memory \(in place\): True", "the engine copies in place"),
        (r"on this machine the first shared-memory round was [0-9.]+x faster than pickle, a warm "
         r"one [0-9.]+x", "cold vs warm rounds are stated from this run"),
        (r"On CUDA, torch's\nIPC ref counter keeps a freed block out of the caching allocator",
         "the protocol's docstring says what sections 1, 7 and 10 say: torch parks a freed block"),
    ],
    "07": [
        (r"MINIVLLM::EngineCore_0", "the engine core carries its title"),
        (r"measured: \d+ carry the title; \d+ are libzmq's", "the thread names are counted, not assumed"),
        (r"frame 0: identity b'\\x00\\x00' = engine 0", "the ROUTER's identity frame is the DP rank"),
        (r"frame 1: type byte b'\\x00' = ADD", "the type byte of ADD"),
        (r"on this machine, through the process, a step took", "the boundary's cost is this run's"),
        (r"on this machine, through the process, a step took [+-][0-9.]+ ms at batch 1 \([+-]\d+% of "
         r"the in-process step; (\d round\(s\): too few to tell its sign from noise|within the noise|"
         r"beyond the noise)", "the step's difference says whether its rounds can tell it from noise"),
        (r"engine -> launcher  identity b'\\x01\\x00' = rank 1: \['HELLO', 1, \d+\]",
         "the handshake on the wire: engine 1's HELLO under its identity"),
        (r"launcher -> engine  identity b'\\x01\\x00' = rank 1: \[\['ipc://", "the addresses sent back"),
        (r"engine -> launcher  identity b'\\x00\\x00' = rank 0: \['READY', \[0, ", "engine 0's READY"),
        (r"per engine: \{0: 3, 1: 3\}", "least-loaded routing spreads 6 requests 3 and 3"),
        (r"requests held per engine: \[0, 1\] before the abort of dp-5, \[0, 0\] after; engine 1, "
         r"which held it, let it go: True", "the abort follows its request to its engine"),
        (r"the blocked caller got EngineDeadError [0-9.]+ ms after the kill",
         "kill -9 of the engine core wakes a blocked caller with EngineDeadError"),
        (r"its log, the engine core's stderr, which this notebook sent to a file: \d+ line\(s\), "
         r"\d+ traceback\(s\)", "the log the EngineDeadError points to is shown, not assumed"),
        (r"a later call fails at once: EngineDeadError", "every later call fails too"),
        (r"after shutdown: engine alive\? False \| ipc dir left\? False \| child processes: \[\]",
         "nothing is left behind"),
    ],
    "08": [
        (r"chapter 01's formula for serve -tp 3: .* = 5 processes\s+here: this process \+ 4 "
         r"titled children = 5 processes", "TP=3 is an engine core and 3 workers, as chapter 01 counts"),
        (r"\+ *[0-9.]+ ms  EngineDeadError raised in this process",
         "killing a worker mid-generation raises EngineDeadError in the caller"),
        (r"one line per failure:\n(?:   .*\n)*   WorkerDiedError: execute_model: worker 1 ",
         "the drill reports the engine core's WorkerDiedError in one line"),
        (r"the log the error points to: .* \(\d+ lines\); one line per failure:",
         "the log the EngineDeadError points to is shown"),
        (r"gloo errors from the 2 surviving workers: \d+ distinct line\(s\)",
         "the survivors' gloo errors are counted, not promised"),
        (r"minivllm processes left: \[\]", "the survivors are stopped"),
        (r"one prefill step of \d+ tokens: 1 frame\(s\), .* 3 readers\)",
         "one step is one message in one chunk, read by 3 workers"),
        (r"\(61 all-reduces: 2 per layer and the embedding's\)", "2L + 1 all-reduces a step"),
        (r"on this machine at batch 8, TP=[13] was faster: a TP=3 step took [0-9.]+x a TP=1 step",
         "which of TP=1 and TP=3 was faster is printed from this run"),
        (r"the ring takes 1 write per step \(200 in all\), the sockets 3 sends per step \(600 in all\)"
         r"\nevery reader got every step: ring True, sockets True",
         "over sockets one step is three sends; through the ring, one write"),
        (r"ValueError: tensor_parallel_size=2 does not split this model", "TP must divide the heads"),
    ],
    "09": [
        (r"(\d+) processes; chapter 01 says: .* = \1 processes", "the server's tree is chapter 01's count"),
        (r"each chunk's text, as it arrives:\n['\"].*\n\[\d+ tokens in [0-9.]+ s\]",
         "the stream is printed chunk by chunk, each chunk's text visible even when it is a newline"),
        (r"-tp 3 --api-server-count 2: counted (\d+) processes; chapter 01's formula: .*launcher.* = "
         r"\1 processes", "self-test 1: -tp 3 with two API servers, a launcher included"),
        (r"not JSON: 400 BadRequestError: (?!Unsupported Media Type)",
         "a malformed JSON body (sent as JSON) is 400 with OpenAI's error body"),
        (r"unknown model: 404 NotFoundError", "an unknown model is 404"),
        (r"after the disconnect: blocks used 0\.0 running 0\.0", "a disconnect frees the KV blocks"),
        (r"/health after the kill, every 50 ms: \[.*503\]", "/health turns 503 after the engine dies"),
        (r'data: \{"error":\{"message":"the engine is dead', "the stream ends with an error event"),
        (r"the server's log: [1-9]\d* line\(s\) about the death:",
         "the log the error event points to is shown"),
        (r"processes left: \[\]", "the dead server leaves nothing behind"),
        (r"on this machine from 1 to \d+ streams: throughput (rose|fell) .*, TTFT p50 (rose|fell) .*, "
         r"ITL p50 (rose|fell)", "which way the latencies went is printed from this run"),
        (r"serve_vs_inproc_c\d+ = [0-9.]+", "the serving path is measured against the bare engine"),
        (r"serve_vs_inproc_c\d+ came from \d+ requests a side, [0-9.]+ s of serving: ",
         "the ratio says how much it rests on"),
        (r"bytes per decode step: float32 \d+ MB, blocks \d+ MB", "a step's bytes, both ways"),
        (r"batch  1: float32 0\.5 FLOPs, blocks 2\.\d FLOPs per byte read",
         "batch 1 does little arithmetic per byte"),
        (r"batch 32: float32 16\.0 FLOPs, blocks \d\d\.\d FLOPs per byte read",
         "batch 32 does 32 times more on the same bytes"),
        (r"on this machine: .* memory-bound below [0-9.]+ FLOPs per byte",
         "the machine's balance is measured in this run"),
        (r"the C GEMM pads rows to a multiple of \d+; gate_up at 16, 17, 32, 33 rows: "
         r"([0-9.]+, ){3}[0-9.]+ ms\n17 rows cost [0-9.]+x of 32 rows' time, 33 rows [0-9.]+x"
         r"|the C ops are not built here", "a matmul's time is measured at 16, 17, 32, 33 rows"),
        (r"budget 512: .*ITL p50 .* p99 .*\nbudget 128: .*ITL p50 .* p99 ",
         "both step budgets are measured, 512 first"),
        (r"on this machine at \d+ streams the (512|128)-token budget had the lower ITL p99 "
         r"\([0-9.]+ vs [0-9.]+ ms\); 128/512: throughput [0-9.]+x, TTFT p50 [0-9.]+x",
         "which budget had the lower ITL tail, and the throughput and TTFT ratios, are this run's"),
    ],
    "10": [
        (r"hosts: 3 (hosts made of network namespaces|loopback 'nodes' on 127\.0\.0\.1)",
         "the chapter says whether its hosts are separated or loopback nodes"),
        (r"decode +step, +\d+ request\(s\), +\d+ tokens: broadcast +\d+ B to each remote reader, "
         r"reply +\d+ B from the output rank; all-reduces 61 x",
         "a step's broadcast and reply are measured in bytes, next to 2L + 1 all-reduces"),
        (r"the collectives are \d+x the messages", "the collectives outweigh the messages"),
        (r"a PUB that publishes at once: the SUB got \[[0-9, ]+\] of 100",
         "the slow joiner over tcp is shown"),
        (r"XPUB and READY first: the remote reader got 100 of 100, in order: True",
         "the ring's remote reader loses nothing and reads in order"),
        (r"local  reader: p50 .*\nremote reader: p50 ", "a local and a remote reader are measured"),
        (r"on this machine the remote reader's p50 was [0-9.]+x the local reader's",
         "remote vs local is stated from this run"),
        (r"(ping RTT min [0-9.]+ ms -> [0-9.]+ ms with every host's sends delayed 1 ms by "
         r"(the wire|tc netem)|no delayed link: loopback nodes)",
         "a delayed link is pinged and says whether netem or the wire made the delay"),
        (r"on this machine the all-reduce across hosts took [0-9.]+x the one-host time",
         "the all-reduce across hosts is stated from this run"),
        (r"cross_host_tp3_vs_one_host_tp3_b\d+ = [0-9.]+", "TP=3 across hosts runs the whole engine"),
        (r"cross_host_tp3_vs_one_host_tp3_b\d+ = [0-9.]+: (crossing hosts|one host) was faster, "
         r"(within|beyond) the noise", "which run was faster, and whether beyond its rounds' spread"),
        (r"kill -9 of the remote worker: detected after \d+ ms",
         "a killed remote worker is detected"),
        (r"(ip link set h1 down|SIGSTOP of the remote process).*: detected after \d+ ms",
         "a silent remote host is detected (by heartbeats)"),
        (r"processes left: \[\]", "nothing is left behind"),
    ],
    "11": [
        (r"internal node 0: .* -> engines \[0, 1\], 4 API server\(s\), internal, tcp",
         "internal mode: -dp API servers on node 0, engines reached over tcp"),
        (r"internal node 1: .* -> engines \[2, 3\], no API server, internal, tcp",
         "--nnodes places the DP ranks of a headless node from its node rank"),
        (r"hybrid   node 1: .* -> engines \[2, 3\], 2 API server\(s\), hybrid",
         "hybrid load balancing: -dpl API servers on every node for its own engines"),
        (r"external node 1: .* -> engines \[1\], 1 API server\(s\), external",
         "-dpl 1 -dpr R is external load balancing for a dense model"),
        (r"external node 1: .*external, ipc\n +the resolution logged warning: hybrid load balancing "
         r"with data_parallel_size_local 1: switching to external",
         "the switch from hybrid to external is logged under the row it explains"),
        (r"-dpr without -dpl .* -> engines \[0, 1, 2, 3\], no API server",
         "-dpr without -dpl sets no start rank: the node runs every DP rank from 0"),
        (r"-dpl inferred from --nnodes .* -> engines \[2, 3\], 1 API server\(s\), hybrid",
         "hybrid's API servers take -dpl as typed, else 1"),
        (r"-dpe, a dense model .* -> refused: Non-MoE models do not support external",
         "-dpe is refused for a dense model"),
        (r"two modes at once .* -> refused: Cannot use more than one data parallel load "
         r"balancing mode", "two load-balancing modes at once are refused"),
        (r"--headless with -asc 1 .* -> refused: --api-server-count=1 cannot be used with "
         r"--headless", "a headless node takes no API server"),
        (r"-dpe, an MoE model .* -> engines \[1\], 1 API server\(s\), external",
         "-dpe gives an MoE model external mode"),
        (r"handed out, then bound: Address already in use",
         "a port handed out before it is bound can be taken in between"),
        (r"bound first: another process gets EADDRINUSE", "a port bound first cannot be taken"),
        (r"the ROUTER on the adopted socket got b'HELLO' from b'engine-2'",
         "ZMQ adopts the listening socket (ZMQ_USE_FD)"),
    ],
}
