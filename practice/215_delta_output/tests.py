"""The judge's tests for exercise 215. Each receives the learner's module as `impl`.

The first tests drive the learner's DeltaEncoder and WorkerState by hand, a few steps at a time,
through encode/decode. The last one replays 500 steps of the judge's own scheduler (chunked
prefill, a small block pool that forces preemption, finishes, aborts, an id reused after an
abort) with the worker in another process, the bytes on a real pipe, and compares the worker's
table with the scheduler's truth after every step.
"""

from __future__ import annotations

import multiprocessing as mp
import random
from collections import deque

import msgspec

from minivllm.judge.api import Fail, check_equal, scaled, step, test

WAIT_S = scaled(5.0)  # the worker process answers one step well within this
STEPS = 500


# --- helpers ----------------------------------------------------------------------------------
def _req(impl, rid, prompt, outputs, blocks, computed, scheduled, resumed=False, max_tokens=16):
    return impl.ScheduledRequest(rid, list(prompt), impl.SamplingParams(0.5, 0.9, max_tokens),
                               list(outputs), list(blocks), computed, scheduled, resumed)


class _Known:
    """The ids the workers hold, as the judge applies each output by the README (finished first,
    then the new requests, then the deltas): an output that no worker could apply is the
    encoder's fault, named here before the learner's worker crashes on it."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    def apply(self, out, call: str) -> None:
        known = self.ids - set(out.finished_req_ids)
        for new in out.scheduled_new_reqs:
            if new.req_id in known:
                raise Fail(f"make_output sent {new.req_id!r} whole (NewRequestData) while the "
                           "workers still hold it (it is not in finished_req_ids): send a "
                           "request whole only the first time, then deltas", input=call)
            known.add(new.req_id)
        for rid in out.scheduled_cached_reqs.req_ids:
            if rid not in known:
                why = (" it is in this output's finished_req_ids, which the workers apply "
                       "first, so the request scheduled under that id is a new one: forget "
                       "finished ids first, then send it whole" if rid in out.finished_req_ids
                       else " it was never sent whole, or finished earlier")
                raise Fail(f"make_output sent a delta (scheduled_cached_reqs) for {rid!r}, which "
                           f"the workers do not hold:{why}", input=call)
        self.ids = known


_KNOWN: dict[int, _Known] = {}  # per worker: what the workers hold after each output


def _update(worker, out, call: str) -> None:
    """worker.update(out), once the judge found that a worker can apply out."""
    _KNOWN.setdefault(id(worker), _Known()).apply(out, call)
    step(f"WorkerState.update(the output of {call})")
    worker.update(out)
    step(f"{call}, then the worker's update() of it")


def _call(scheduled, finished) -> str:
    return (f"make_output(scheduled {[r.req_id for r in scheduled]}, finished "
            f"{list(finished)})")


def _step(impl, enc, worker, scheduled, finished=()):
    """One step through the wire: make_output, encode, decode, update. The decoded output.
    Between make_output and a second encode, the lists of every scheduled request grow in place
    (as the scheduler's next step grows them): the output must not change."""
    call = _call(scheduled, finished)
    step(call)
    out = enc.make_output(scheduled, list(finished))
    wire = impl.encode(out)
    for r in scheduled:
        r.output_token_ids.append(999)
        r.block_ids.append(999)
    if impl.encode(out) != wire:
        raise Fail("the output changed when the scheduler grew a request's output_token_ids and "
                   "block_ids in place after make_output returned: it holds the scheduler's own "
                   "lists, and the output may be encoded later. Copy (slice) every list you put "
                   "in an output, cached deltas and resumed tables too",
                   input=f"scheduled {[r.req_id for r in scheduled]}, then 999 appended to "
                         "each one's output_token_ids and block_ids, then encode again")
    for r in scheduled:
        r.output_token_ids.pop()
        r.block_ids.pop()
    back = impl.decode(wire)
    _update(worker, back, call)
    return back


def _cached(out) -> dict:
    """{req_id: (new tokens, new blocks, computed, resumed)} of the cached part."""
    c = out.scheduled_cached_reqs
    if not (len(c.req_ids) == len(c.new_token_ids) == len(c.new_block_ids)
            == len(c.num_computed_tokens)):
        raise Fail("CachedRequestData's lists must be parallel: one entry per req_id",
                   got={"req_ids": c.req_ids, "new_token_ids": c.new_token_ids,
                        "new_block_ids": c.new_block_ids,
                        "num_computed_tokens": c.num_computed_tokens})
    return {r: (list(t), list(b), n, r in c.resumed_req_ids)
            for r, t, b, n in zip(c.req_ids, c.new_token_ids, c.new_block_ids,
                                  c.num_computed_tokens)}


FIELDS = ("prompt_token_ids", "sampling_params", "output_token_ids", "block_ids",
          "num_computed_tokens")


def _row(state) -> list:
    """A worker's CachedRequestState, or the scheduler's ScheduledRequest, as plain lists."""
    p = state.sampling_params
    return [list(state.prompt_token_ids), [p.temperature, p.top_p, p.max_tokens],
            list(state.output_token_ids), list(state.block_ids), state.num_computed_tokens]


def _rows(worker) -> dict:
    return {rid: _row(s) for rid, s in worker.requests.items()}


def _check_worker(worker, expected: dict, when: str):
    wrong = {rid: s.req_id for rid, s in worker.requests.items() if s.req_id != rid}
    if wrong:
        raise Fail(f"{when}: a CachedRequestState's req_id is not the id the worker keeps it "
                   "under", expected=sorted(wrong), got=list(wrong.values()))
    _check_rows(_rows(worker), {rid: [list(v) if isinstance(v, tuple) else v for v in row]
                                for rid, row in expected.items()}, when)


def _check_rows(got: dict, expected: dict, when: str):
    if set(got) != set(expected):
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        raise Fail(f"{when}: the worker's table holds the wrong requests (finished ones leave, "
                   "preempted or unscheduled ones stay): "
                   + "; ".join(([f"missing {missing}"] if missing else [])
                               + ([f"not expected {extra}"] if extra else [])),
                   expected=sorted(expected), got=sorted(got))
    for rid in expected:
        if got[rid] != expected[rid]:
            bad = [f for f, a, b in zip(FIELDS, got[rid], expected[rid]) if a != b]
            raise Fail(f"{when}: the worker's {rid!r} is wrong in {', '.join(bad)}",
                       expected={f: a for f, a in zip(FIELDS, expected[rid]) if f in bad},
                       got={f: a for f, a in zip(FIELDS, got[rid]) if f in bad})


# --- the tests ------------------------------------------------------------------------------
@test(input="encode/decode of an output with one new and one cached request; decode(b'\\x93junk')")
def wire_round_trip(impl):
    out = impl.SchedulerOutput(
        [impl.NewRequestData("a", [1, 2, 3], impl.SamplingParams(0.5, 0.9, 7), [4, 5], 0)],
        impl.CachedRequestData(["b"], {"b"}, [[9]], [[6, 7]], [12]),
        {"a": 3, "b": 1}, ["z"])
    wire = {"scheduled_new_reqs": [{"req_id": "a", "prompt_token_ids": [1, 2, 3],
                                    "sampling_params": {"temperature": 0.5, "top_p": 0.9,
                                                        "max_tokens": 7},
                                    "block_ids": [4, 5], "num_computed_tokens": 0}],
            "scheduled_cached_reqs": {"req_ids": ["b"], "resumed_req_ids": ["b"],
                                      "new_token_ids": [[9]], "new_block_ids": [[6, 7]],
                                      "num_computed_tokens": [12]},
            "num_scheduled_tokens": {"a": 3, "b": 1}, "finished_req_ids": ["z"]}
    step("encode(an output with one new and one cached request), read by the judge's msgpack")
    try:
        seen = msgspec.msgpack.decode(impl.encode(out))
    except msgspec.DecodeError as e:
        raise Fail("encode(out) must be msgpack (the judge's own msgpack reader failed)",
                   got=str(e)) from None
    check_equal(seen, wire, "encode(out) as the judge's msgpack reader sees it (each Struct a "
                            "map of its fields)")
    step("decode(the judge's own msgpack encoding of that output)")
    check_equal(impl.decode(msgspec.msgpack.encode(wire)), out,
                "decode() of the judge's own msgpack encoding of that output")
    step("decode(encode(out))")
    back = impl.decode(impl.encode(out))
    check_equal(back, out, "decode(encode(out))")
    if not isinstance(back.scheduled_new_reqs[0], impl.NewRequestData) or not isinstance(
            back.scheduled_new_reqs[0].sampling_params, impl.SamplingParams):
        raise Fail("decode must return typed Structs (msgspec.msgpack.Decoder(SchedulerOutput)), "
                   "not dicts and lists", got=type(back.scheduled_new_reqs[0]).__name__)
    step("decode(b'\\x93junk')")
    try:
        got = impl.decode(b"\x93junk")
    except msgspec.DecodeError:
        return
    raise Fail("decode of malformed bytes must raise msgspec.DecodeError", got=got)


@test(input="r0: new (prompt 5 tokens, blocks [0, 1]); a decode step (+1 token, +block 2); a "
            "chunked-prefill step of r1 (no token, no block); r0 gains 3 tokens at once")
def new_then_delta(impl):
    enc, worker = impl.DeltaEncoder(), impl.WorkerState()
    p = [11, 12, 13, 14, 15]
    r0 = _req(impl, "r0", p, [], [0, 1], 0, 5)
    step(_call([r0], []))
    out = enc.make_output([r0], [])
    r0.block_ids.append(2)  # the scheduler's next step grows its lists in place, as vLLM's does
    if out.scheduled_new_reqs and out.scheduled_new_reqs[0].block_ids != [0, 1]:
        raise Fail("r0's NewRequestData changed after make_output returned: it holds the "
                   "scheduler's own block_ids list, which the next step grows in place, and the "
                   "output may be encoded later (an async executor sends it while the scheduler "
                   "runs on). Copy the lists you put in an output", expected=[0, 1],
                   got=out.scheduled_new_reqs[0].block_ids,
                   input="make_output, then block 2 appended to r0.block_ids, then encode")
    r0.block_ids.pop()
    out = impl.decode(impl.encode(out))
    _update(worker, out, _call([r0], []))
    check_equal([n.req_id for n in out.scheduled_new_reqs], ["r0"],
                "step 1: scheduled_new_reqs (a request seen for the first time goes whole)")
    check_equal(_cached(out), {}, "step 1: scheduled_cached_reqs")
    new = out.scheduled_new_reqs[0]
    check_equal((new.prompt_token_ids, new.block_ids, new.num_computed_tokens), (p, [0, 1], 0),
                "step 1: r0's NewRequestData (prompt_token_ids, block_ids, num_computed_tokens)")
    check_equal(out.num_scheduled_tokens, {"r0": 5}, "step 1: num_scheduled_tokens ({req_id: "
                "num_scheduled_tokens} of every scheduled request)")
    _check_worker(worker, {"r0": (p, (0.5, 0.9, 16), [], [0, 1], 0)}, "after step 1")

    out = _step(impl, enc, worker, [_req(impl, "r0", p, [7], [0, 1, 2], 5, 1),
                                  _req(impl, "r1", [1] * 10, [], [3], 0, 4)])
    check_equal([n.req_id for n in out.scheduled_new_reqs], ["r1"],
                "step 2: scheduled_new_reqs (r0 is known to the workers: it goes as a delta)")
    check_equal(_cached(out), {"r0": ([7], [2], 5, False)},
                "step 2: the cached part {req_id: (new_token_ids, new_block_ids, "
                "num_computed_tokens, resumed)}: only what the workers have not seen")
    check_equal(out.num_scheduled_tokens, {"r0": 1, "r1": 4},
                "step 2: num_scheduled_tokens (every scheduled request, cached ones too)")
    out = _step(impl, enc, worker, [_req(impl, "r1", [1] * 10, [], [3], 4, 4)])
    check_equal(_cached(out), {"r1": ([], [], 4, False)},
                "step 3: a prefill chunk that adds no token and no block")
    out = _step(impl, enc, worker, [_req(impl, "r0", p, [7, 8, 9, 10], [0, 1, 2], 6, 3),
                                    _req(impl, "r2", p, [], [0, 4], 4, 1)])
    check_equal(_cached(out), {"r0": ([8, 9, 10], [], 6, False)},
                "step 4: r0 gained 3 tokens since it was last sent (all three are new)")
    check_equal([(n.req_id, n.num_computed_tokens) for n in out.scheduled_new_reqs], [("r2", 4)],
                "step 4: the new r2 starts with 4 tokens computed (a prefix-cache hit): "
                "NewRequestData carries the request's num_computed_tokens")
    _check_worker(worker, {"r0": (p, (0.5, 0.9, 16), [7, 8, 9, 10], [0, 1, 2], 6),
                           "r1": ([1] * 10, (0.5, 0.9, 16), [], [3], 4),
                           "r2": (p, (0.5, 0.9, 16), [], [0, 4], 4)}, "after step 4")


@test(input="r0 and r1 run; r0 finishes; an abort of 'ghost', never scheduled; r0's id reused "
            "by a new request two steps later")
def finish_and_forget(impl):
    enc, worker = impl.DeltaEncoder(), impl.WorkerState()
    _step(impl, enc, worker, [_req(impl, "r0", [1, 2], [], [0], 0, 2),
                            _req(impl, "r1", [3, 4], [], [1], 0, 2)])
    _step(impl, enc, worker, [_req(impl, "r0", [1, 2], [5], [0], 2, 1),
                            _req(impl, "r1", [3, 4], [6], [1], 2, 1)])
    out = _step(impl, enc, worker, [_req(impl, "r1", [3, 4], [6, 8], [1], 3, 1)], ["r0", "ghost"])
    check_equal(sorted(out.finished_req_ids), ["ghost", "r0"], "finished_req_ids")
    _check_worker(worker, {"r1": ([3, 4], (0.5, 0.9, 16), [6, 8], [1], 3)},
                  "after r0 finished and 'ghost' (unknown to the worker) was aborted")
    check_equal(enc.num_tracked(), 1, "num_tracked() after r0 finished (forget finished ids)")
    out = _step(impl, enc, worker, [_req(impl, "r1", [3, 4], [6, 8, 9], [1, 2], 4, 1)])
    check_equal(out.finished_req_ids, [], "finished_req_ids of the step after r0 and 'ghost' "
                "went out (each id goes out once, in the output make_output received it for)")
    out = _step(impl, enc, worker, [_req(impl, "r0", [42], [], [0], 0, 1)])
    check_equal([n.req_id for n in out.scheduled_new_reqs], ["r0"],
                "scheduled_new_reqs when the finished id r0 comes back as a new request")
    _check_worker(worker, {"r0": ([42], (0.5, 0.9, 16), [], [0], 0),
                           "r1": ([3, 4], (0.5, 0.9, 16), [6, 8, 9], [1, 2], 4)},
                  "after r0 came back as a new request")


@test(input="r0 runs on blocks [0, 1, 2]; preempted (not scheduled for 2 steps, its blocks "
            "freed); resumed on blocks [5, 3]; then a decode step adds block 4")
def preempt_and_resume(impl):
    enc, worker = impl.DeltaEncoder(), impl.WorkerState()
    p = list(range(10))
    _step(impl, enc, worker, [_req(impl, "r0", p, [], [0, 1, 2], 0, 10)])
    _step(impl, enc, worker, [_req(impl, "r0", p, [50], [0, 1, 2], 10, 1)])
    _step(impl, enc, worker, [_req(impl, "r1", [9], [], [0], 0, 1)])
    _check_worker(worker, {"r0": (p, (0.5, 0.9, 16), [50], [0, 1, 2], 10),
                           "r1": ([9], (0.5, 0.9, 16), [], [0], 0)},
                  "while r0 is preempted (the worker keeps its cached state)")
    _step(impl, enc, worker, [_req(impl, "r1", [9], [51], [0], 1, 1)])
    out = _step(impl, enc, worker, [_req(impl, "r0", p, [50, 60], [5, 3], 0, 8, resumed=True)],
                ["r1"])
    check_equal(_cached(out), {"r0": ([60], [5, 3], 0, True)},
                "the resumed step: r0 in resumed_req_ids with its whole new block table; its "
                "output tokens are still a delta (the worker kept them)")
    _check_worker(worker, {"r0": (p, (0.5, 0.9, 16), [50, 60], [5, 3], 0)},
                  "after the resumed step (the new block table replaces the old one)")
    out = _step(impl, enc, worker, [_req(impl, "r0", p, [50, 60], [5, 3, 4], 8, 4)])
    check_equal(_cached(out), {"r0": ([], [4], 8, False)},
                "the step after the resume: a plain delta again")
    _check_worker(worker, {"r0": (p, (0.5, 0.9, 16), [50, 60], [5, 3, 4], 8)},
                  "after the step after the resume")


@test(input="r0 running; in one step r0 is aborted and a new request with the same id 'r0' "
            "is scheduled (finished_req_ids and scheduled_new_reqs both name it)")
def same_id_finished_and_new(impl):
    enc, worker = impl.DeltaEncoder(), impl.WorkerState()
    _step(impl, enc, worker, [_req(impl, "r0", [1, 2, 3], [], [0], 0, 3)])
    _step(impl, enc, worker, [_req(impl, "r0", [1, 2, 3], [4], [0], 3, 1)])
    out = _step(impl, enc, worker, [_req(impl, "r0", [7, 7], [], [2], 0, 2)], ["r0"])
    check_equal(([n.req_id for n in out.scheduled_new_reqs], out.finished_req_ids),
                (["r0"], ["r0"]), "(scheduled_new_reqs ids, finished_req_ids): the old r0 "
                "finished, the new r0 is new")
    _check_worker(worker, {"r0": ([7, 7], (0.5, 0.9, 16), [], [2], 0)},
                  "after the step (apply finished_req_ids first, then the new requests)")


@test(input="step 2's output encoded again after step 3's make_output; then a second "
            "DeltaEncoder and a second WorkerState next to the first ones")
def outputs_stand_alone(impl):
    enc, worker, p = impl.DeltaEncoder(), impl.WorkerState(), [1, 2, 3]
    _step(impl, enc, worker, [_req(impl, "r0", p, [], [0], 0, 3)])
    step("step 2: make_output(scheduled ['r0', 'r1'], finished []), then encode")
    out2 = enc.make_output([_req(impl, "r0", p, [7], [0, 1], 3, 1),
                            _req(impl, "r1", [5], [], [2], 0, 1)], [])
    wire2 = impl.encode(out2)
    step("step 3: make_output(scheduled ['r1'] resumed, finished ['r0']), then step 2's output "
         "encoded again")
    enc.make_output([_req(impl, "r1", [5], [6], [3], 0, 1, resumed=True)], ["r0"])
    if impl.encode(out2) != wire2:
        raise Fail("step 2's output changed when make_output built step 3's: each output must "
                   "own its lists, sets and dicts (an executor may encode it after the next "
                   "step is scheduled); do not reuse one between calls",
                   expected=msgspec.msgpack.decode(wire2),
                   got=msgspec.msgpack.decode(impl.encode(out2)))
    _update(worker, impl.decode(wire2), "step 2's make_output")
    step("a second DeltaEncoder() and WorkerState(), then its make_output(scheduled ['r0'])")
    other, other_worker = impl.DeltaEncoder(), impl.WorkerState()
    check_equal((other.num_tracked(), _rows(other_worker)), (0, {}),
                "(num_tracked(), requests) of a second, new encoder and worker: two engines in "
                "one process share nothing (keep the state on the instance, not the class)")
    out = other.make_output([_req(impl, "r0", p, [7], [0, 1], 4, 1)], [])
    check_equal([n.req_id for n in out.scheduled_new_reqs], ["r0"],
                "a second encoder's scheduled_new_reqs: its workers have never seen r0")


@test(input="five outputs built by the judge, given to your worker's update() in turn: r0 new on "
            "blocks [0, 1]; +token 7 +block 2; +token 8; resumed on [5, 3] with +token 9; "
            "+block 4. Each output kept and compared after every later update()")
def worker_keeps_copies(impl):
    sp = impl.SamplingParams(0.5, 0.9, 16)

    def cached(tokens, blocks, computed, resumed=False):
        return impl.SchedulerOutput([], impl.CachedRequestData(
            ["r0"], {"r0"} if resumed else set(), [tokens], [blocks], [computed]), {"r0": 1}, [])
    outputs = [impl.SchedulerOutput([impl.NewRequestData("r0", [1, 2, 3], sp, [0, 1], 0)],
                                    impl.CachedRequestData([], set(), [], [], []), {"r0": 3}, []),
               cached([7], [2], 3), cached([8], [], 4), cached([9], [5, 3], 0, resumed=True),
               cached([], [4], 5)]
    names = ["r0 new on [0, 1]", "+token 7 +block 2", "+token 8", "resumed on [5, 3]",
             "+block 4"]
    worker, kept = impl.WorkerState(), []
    for i, out in enumerate(outputs):
        kept.append((i, out, msgspec.msgpack.encode(out)))
        step(f"WorkerState.update(output {i + 1}: {names[i]})")
        worker.update(out)
        for j, old, wire in kept:
            if msgspec.msgpack.encode(old) != wire:
                raise Fail(f"output {j + 1} ({names[j]}), given to your worker earlier, changed "
                           f"when update() applied output {i + 1} ({names[i]}): the worker keeps a "
                           "list of the message (a new request's block_ids, or a resumed "
                           "request's new block table) in its table and then extends it. Copy "
                           "what you keep (list(...)): the caller may still hold the output",
                           expected=msgspec.msgpack.decode(wire),
                           got=msgspec.msgpack.decode(msgspec.msgpack.encode(old)))
    _check_worker(worker, {"r0": ([1, 2, 3], (0.5, 0.9, 16), [7, 8, 9], [5, 3, 4], 5)},
                  "after the five outputs")


# --- the judge's scheduler ---------------------------------------------------------------------
class _SimReq:
    def __init__(self, rid, prompt, max_tokens):
        self.rid, self.prompt, self.max_tokens = rid, prompt, max_tokens
        self.outputs: list[int] = []
        self.blocks: list[int] = []
        self.computed = 0
        self.resumed = False


class Sim:
    """A small paged scheduler: token budget, chunked prefill, recompute preemption, aborts."""

    BLOCK, NUM_BLOCKS, BUDGET, MAX_RUNNING = 4, 40, 40, 8

    def __init__(self, impl, seed: int):
        self.impl, self.rng = impl, random.Random(seed)
        self.free = list(range(self.NUM_BLOCKS))
        self.waiting: deque[_SimReq] = deque()
        self.running: list[_SimReq] = []
        self.finished: list[str] = []
        self.next_id = 0
        self.events = {"preempted": 0, "resumed": 0, "finished": 0, "aborted": 0, "reused": 0}

    def _new(self, rid=None, front=False):
        if rid is None:
            rid, self.next_id = f"req-{self.next_id}", self.next_id + 1
        r = _SimReq(rid, [self.rng.randrange(1, 1000) for _ in range(self.rng.randint(1, 30))],
                    self.rng.randint(1, 40))
        self.waiting.appendleft(r) if front else self.waiting.append(r)

    def _release(self, r):
        self.free.extend(r.blocks)
        r.blocks = []

    def _abort(self):
        live = list(self.waiting) + self.running
        r = self.rng.choice(live)
        (self.running if r in self.running else self.waiting).remove(r)
        self._release(r)
        self.finished.append(r.rid)
        self.events["aborted"] += 1
        if self.rng.random() < 0.5:  # the client retries with the same id
            self._new(r.rid, front=True)
            self.events["reused"] += 1

    def _grow(self, r, n) -> bool:
        need = -(-(r.computed + n) // self.BLOCK) - len(r.blocks)
        if need > len(self.free):
            return False
        r.blocks += [self.free.pop(self.rng.randrange(len(self.free))) for _ in range(need)]
        return True

    def step(self):
        """Schedule one step: (the ScheduledRequests, the ids finished since the last step, each
        scheduled request's row as it is now). Like vLLM's scheduler, the ScheduledRequests hold
        the scheduler's own lists, which execute() then grows in place."""
        if self.rng.random() < 0.35 or not (self.waiting or self.running):
            self._new()
        if (self.waiting or self.running) and self.rng.random() < 0.04:
            self._abort()
        budget, scheduled = self.BUDGET, []
        for r in list(self.running):
            if r not in self.running or budget == 0:
                continue
            n = min(len(r.prompt) + len(r.outputs) - r.computed, budget)
            while not self._grow(r, n):
                victim = self.running.pop()  # preempt the latest: free its blocks, recompute
                self._release(victim)
                victim.computed, victim.resumed = 0, True
                self.waiting.appendleft(victim)
                self.events["preempted"] += 1
                if victim is r:
                    break
            else:
                scheduled.append((r, n))
                budget -= n
        while self.waiting and budget and len(self.running) < self.MAX_RUNNING:
            r = self.waiting[0]
            n = min(len(r.prompt) + len(r.outputs) - r.computed, budget)
            if not self._grow(r, n):
                break
            self.waiting.popleft()
            self.running.append(r)
            scheduled.append((r, n))
            budget -= n
        impl = self.impl
        view = [impl.ScheduledRequest(r.rid, r.prompt, impl.SamplingParams(1.0, 0.95, r.max_tokens),
                                      r.outputs, r.blocks, r.computed, n, r.resumed)
                for r, n in scheduled]
        self.events["resumed"] += sum(r.resumed for r, _ in scheduled)
        finished, self.finished = self.finished, []
        self._scheduled = scheduled
        return view, finished, {v.req_id: _row(v) for v in view}

    def execute(self):
        self._execute(self._scheduled)

    def _execute(self, scheduled):
        for r, n in scheduled:
            r.resumed = False
            r.computed += n
            if r.computed < len(r.prompt) + len(r.outputs):
                continue  # a prefill chunk: nothing sampled yet
            r.outputs.append(self.rng.randrange(1, 1000))
            if len(r.outputs) >= r.max_tokens:
                self.running.remove(r)
                self._release(r)
                self.finished.append(r.rid)
                self.events["finished"] += 1


_step_name = step  # replay_500_steps counts its steps in a variable named step


def _worker_main(impl, conn):
    """The worker process: decode each step, apply it, answer with its table (msgpack)."""
    worker = impl.WorkerState()
    while True:
        data = conn.recv_bytes()
        if not data:
            return
        try:
            worker.update(impl.decode(data))
            conn.send_bytes(msgspec.msgpack.encode(["ok", _rows(worker)]))
        except Exception as e:
            conn.send_bytes(msgspec.msgpack.encode(["error", f"{type(e).__name__}: {e}"]))


@test(input=f"{STEPS} steps of the judge's scheduler (seed 215), the worker in another process, "
            "the encoded outputs on a pipe", timeout=60,
      hang="the worker process did not answer: did update() block or the process die?")
def replay_500_steps(impl):
    sim = Sim(impl, seed=215)
    enc = impl.DeltaEncoder()
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_worker_main, args=(impl, there), daemon=True)
    proc.start()
    there.close()
    expected: dict[str, tuple] = {}
    known = _Known()
    try:
        for step in range(STEPS):
            scheduled, finished, rows = sim.step()
            call = f"step {step}: " + _call(scheduled, finished)
            _step_name(call)
            out = enc.make_output(scheduled, finished)
            check_equal(list(out.finished_req_ids), finished, f"step {step}: finished_req_ids (the "
                        "ids passed to this make_output, each once, in this output)")
            check_equal(dict(out.num_scheduled_tokens), {r.req_id: r.num_scheduled_tokens
                                                         for r in scheduled},
                        f"step {step}: num_scheduled_tokens (every scheduled request)")
            known.apply(impl.decode(impl.encode(out)), call)
            here.send_bytes(impl.encode(out))
            sim.execute()  # the scheduler's lists grow in place, after make_output returned
            if not here.poll(WAIT_S):
                raise Fail(f"step {step}: the worker process gave no answer within {WAIT_S:g} s")
            status, table = msgspec.msgpack.decode(here.recv_bytes())
            if status != "ok":
                raise Fail(f"step {step}: the worker's update() raised {table}")
            for rid in finished:
                expected.pop(rid, None)
            expected.update(rows)
            _check_rows(table, expected, f"step {step}")
        check_equal(enc.num_tracked(), len(expected),
                    f"DeltaEncoder.num_tracked() after {STEPS} steps (the requests the workers "
                    "hold; finished ones forgotten)")
    finally:
        here.send_bytes(b"")
        proc.join(WAIT_S)
        if proc.is_alive():
            proc.kill()
            proc.join()
        here.close()
    for event, count in sim.events.items():  # the replay exercised every path
        if count == 0:
            raise Fail(f"the judge's scheduler had no '{event}' event (a bug in the judge)")

