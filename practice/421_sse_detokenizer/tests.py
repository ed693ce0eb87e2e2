"""The judge's tests for exercise 421. Each receives the learner's module as `impl`.

The tokenizer is the project's (SmolLM2's byte-level BPE). The judge's oracle for what may be
sent after each token is Python's own incremental UTF-8 decoder run over the token bytes: every
complete character at once, nothing incomplete, U+FFFD as soon as bytes can no longer become a
character. The SSE test sends the learner's events through a real socket pair and parses them
with the judge's own reader, a few bytes per recv().
"""

from __future__ import annotations

import codecs
import itertools
import json
import random
import socket
import threading

from minivllm.judge.api import Fail, check_equal, scaled, step, test
from minivllm.judge.properties import for_all, st
from minivllm.model.paths import default_model_path
from minivllm.tokenizer import Tokenizer

WAIT_S = scaled(10.0)  # a socket read that waits this long has lost its data
TEXTS = ["plain ascii, nothing to wait for", "héllo wörld, naïve café", "東京タワー 🤗🚀",
         "a 👩‍👩‍👧 family\n", "a real \ufffd in the text"]
SPLIT_EXAMPLES = 120  # streams of arbitrary splits: the same on every run (hypothesis, derandomized)
_tok = None


def tok() -> Tokenizer:
    global _tok
    if _tok is None:
        _tok = Tokenizer.from_path(default_model_path())
    return _tok


def byte_ids(*data: bytes) -> list[int]:
    """The token ids of single bytes (every byte has one in a byte-level vocabulary)."""
    return [tok().backend.token_to_id(_byte_char(b)) for chunk in data for b in chunk]


def _byte_char(b: int) -> str:
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


def oracle(impl, ids_so_far: list[int], skip=True) -> str:
    """What may have been sent after these tokens: the incremental decoder over their bytes."""
    t = tok()
    data = b"".join(impl.token_bytes(t, i) for i in ids_so_far
                    if not (skip and impl.is_special(t, i)))
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data)


def replay(impl, ids, what, skip=True, batch=1):
    """Push ids `batch` at a time (or batch[0], batch[1], ... in turn, for a list of sizes);
    after each push the text so far must be the oracle's."""
    step(f"{what}: IncrementalDetokenizer(tokenizer, skip_special_tokens={skip}), then push() of "
         f"the token ids {ids}, {batch} at a time, then flush()")
    d = impl.IncrementalDetokenizer(tok(), skip_special_tokens=skip)
    sent, end, sizes = "", 0, itertools.cycle([batch] if isinstance(batch, int) else batch)
    while end < len(ids):
        start, end = end, min(end + next(sizes), len(ids))
        piece = d.push(ids[start:end])
        if not isinstance(piece, str):
            raise Fail("push() must return a str", got=type(piece).__name__)
        sent += piece
        want = oracle(impl, ids[:end], skip)
        if sent != want:
            if want.startswith(sent) and "\ufffd" in want[len(sent):]:
                problem = ("bytes that can never become a character were held back: send their "
                           "U+FFFD as soon as that is known (E0 80 would be overlong, ED A0 a "
                           "surrogate, F4 90 past U+10FFFF: a lead byte is not enough to wait)")
            elif want.startswith(sent):
                problem = ("complete characters were held back (send each one as soon as its "
                           "last byte arrived)")
            elif sent.startswith(want) and "\ufffd" in sent[len(want):]:
                problem = ("a broken character was sent (bytes of one character came out as "
                           "U+FFFD before its last byte arrived)")
            else:
                problem = ("the text sent is not the decoding of the bytes so far (U+FFFD only "
                           "for bytes that can never become a character; special tokens add "
                           "nothing when skip_special_tokens=True)")
            raise Fail(f"{what}: after token {end} of {len(ids)}, {problem}",
                       expected=want, got=sent, input=f"token ids {ids}")
    return sent + d.flush()


@test(input="token_bytes of the id one past the vocabulary; each text of: "
            + " | ".join(repr(t) for t in TEXTS) + ", one token per push; "
            "then two detokenizers pushed in turn, one byte token each: '東京🤗' and 'é👩'")
def one_token_at_a_time(impl):
    _check_unknown_id(impl)
    for text in TEXTS:
        ids = tok().encode(text)
        check_equal(replay(impl, ids, repr(text)), text,
                    f"everything sent for {text!r}, flush() included")
    _check_two_at_once(impl, ["東京🤗", "é👩"])


def _check_unknown_id(impl):
    n = tok().vocab_size
    step(f"token_bytes(tokenizer, {n}) (given code): one past the vocabulary")
    try:
        got = impl.token_bytes(tok(), n)
    except ValueError as e:
        if str(n) not in str(e) or f"0..{n - 1}" not in str(e):
            raise Fail(f"token_bytes(tokenizer, {n}) (given code): the ValueError must name the id "
                       "and the vocabulary's range", expected=f"... {n} ... (0..{n - 1})",
                       got=str(e)) from None
        return
    raise Fail(f"token_bytes(tokenizer, {n}) (given code) must raise ValueError: the vocabulary "
               f"has ids 0..{n - 1}", got=got)


def _check_two_at_once(impl, texts):
    """Two requests stream at once: each detokenizer keeps its own unfinished bytes."""
    ids = [byte_ids(t.encode()) for t in texts]
    step(f"two IncrementalDetokenizers pushed in turn, one byte token each: {texts}")
    ds = [impl.IncrementalDetokenizer(tok()) for _ in texts]
    sent = ["" for _ in texts]
    for i in range(max(map(len, ids))):
        for k in range(len(texts)):
            if i < len(ids[k]):
                sent[k] += ds[k].push([ids[k][i]])
                if sent[k] != (want := oracle(impl, ids[k][:i + 1])):
                    raise Fail(f"two detokenizers pushed in turn, one byte token each: "
                               f"{texts[k]!r} after its byte {i + 1}. Each detokenizer keeps its "
                               "own unfinished bytes (nothing shared between instances)",
                               expected=want, got=sent[k])
    check_equal([s + d.flush() for s, d in zip(sent, ds)], texts,
                "the texts of two detokenizers pushed in turn, flush() included")


@test(input="the same texts, 3 tokens per push")
def batches_of_three(impl):
    for text in TEXTS:
        ids = tok().encode(text)
        check_equal(replay(impl, ids, repr(text), batch=3), text,
                    f"everything sent for {text!r}, 3 tokens per push")


def _streams():
    """(token ids, batch sizes, skip): pieces of text (the tokenizer's split), runs of single
    byte tokens (any split of UTF-8, and bytes that are not), and special tokens."""
    t = tok()
    bytes_with_token = [b for b in range(256) if t.backend.token_to_id(_byte_char(b)) is not None]
    specials = [i for i in (t.backend.token_to_id(s) for s in ("<|im_start|>", "<|im_end|>",
                                                             "<|endoftext|>")) if i is not None]
    piece = st.one_of(st.text(max_size=6).map(lambda x: t.encode(x)),
                      st.text(min_size=1, max_size=3).map(  # F1, F2 have no token: dropped
                          lambda x: [i for i in byte_ids(x.encode()) if i is not None]),
                      st.lists(st.sampled_from(bytes_with_token), min_size=1, max_size=3)
                      .map(lambda bs: byte_ids(bytes(bs))),
                      st.sampled_from(specials).map(lambda i: [i]))
    ids = st.lists(piece, max_size=8).map(lambda ps: [i for p in ps for i in p])
    return st.tuples(ids, st.lists(st.integers(1, 5), min_size=1, max_size=4), st.booleans())


def _check_stream(impl, ids, sizes, skip):
    t = tok()
    data = b"".join(impl.token_bytes(t, i) for i in ids if not (skip and impl.is_special(t, i)))
    check_equal(replay(impl, ids, f"pushed in batches of {sizes} (cycled), skip_special_tokens="
                                  f"{skip}", skip=skip, batch=sizes),
                data.decode("utf-8", errors="replace"), "everything sent, flush() included")


@test(input="push([]) and flush() of nothing; byte tokens: E6 9D then 'a' (a cut-off "
            "character); 'x' 80 'y' (a stray byte); 'z' F0 9F at the end of the stream; every "
            "byte 80-FF that has a token followed by each of 18 edge bytes; 150 random mixes (seed 421)")
def invalid_bytes(impl):
    step("IncrementalDetokenizer(tokenizer): push([]), then flush()")
    d = impl.IncrementalDetokenizer(tok())
    check_equal((d.push([]), d.flush()), ("", ""), "(push([]), flush()) of a fresh detokenizer")
    cases = [((b"\xe6\x9d", b"a"), "\ufffda"), ((b"x", b"\x80", b"y"), "x\ufffdy"),
             ((b"z", b"\xf0\x9f"), "z\ufffd")]
    for parts, want in cases:
        ids = byte_ids(*parts)
        got = replay(impl, ids, f"bytes {b''.join(parts)!r}")
        check_equal(got, want, f"everything sent for the bytes {b''.join(parts)!r} (bytes "
                               "that cannot become a character are sent as U+FFFD, once that "
                               "is known; flush() turns an unfinished tail into U+FFFD)")
    _check_edge_streams(impl)


# Bytes where UTF-8's rules bite: ASCII, continuation bytes at their ranges' edges, leads that
# restrict their next byte (E0, ED, F0, F4). SmolLM2's vocabulary has no token for the bytes that
# can never start a character (C0, C1, F5-FF), nor for F1, F2 and a few control bytes.
EDGE_BYTES = bytes([0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC2, 0xDF, 0xE0,
                    0xE6, 0xED, 0xEF, 0xF0, 0xF3, 0xF4])
RANDOM_STREAMS = 150  # of 2-10 edge bytes and real characters, a fixed seed: the same every run


def _edge_streams():
    """Every byte 80-FF followed by each edge byte (exhaustive), then random mixes."""
    has_token = {b for b in range(256) if tok().backend.token_to_id(_byte_char(b)) is not None}
    for lead in sorted(has_token & set(range(0x80, 0x100))):
        for nxt in EDGE_BYTES:
            yield bytes([lead, nxt]), 1
    rng = random.Random(421)
    pieces = [bytes([b]) for b in EDGE_BYTES] + [c.encode() for c in "é東🤗"]
    for _ in range(RANDOM_STREAMS):
        yield b"".join(rng.choice(pieces) for _ in range(rng.randint(2, 10))), rng.randint(1, 3)


def _check_edge_streams(impl):
    for data, batch in _edge_streams():
        got = replay(impl, byte_ids(data), f"the bytes {data.hex(' ')}", batch=batch)
        check_equal(got, data.decode("utf-8", errors="replace"),
                    f"everything sent for the bytes {data.hex(' ')}, flush() included")


@test(input="'<|im_start|>ok<|im_end|>' with skip_special_tokens True and False; <|im_end|> "
            "between the two halves of 'é'; F0 9F, <|im_end|>, 'ok' kept; then "
            f"{SPLIT_EXAMPLES} streams drawn by hypothesis (derandomized): texts, byte runs and "
            "special tokens, pushed in batches of drawn sizes, skip_special_tokens True and False")
def special_tokens(impl):
    t = tok()
    end, start = t.eos_token_id, t.backend.token_to_id("<|im_start|>")
    ids = [start] + t.encode("ok") + [end]
    check_equal(replay(impl, ids, "<|im_start|>ok<|im_end|>", skip=True), "ok",
                "the text of <|im_start|> + 'ok' + <|im_end|> with skip_special_tokens=True "
                "(every special token is skipped, not only the end of text)")
    step("IncrementalDetokenizer(tokenizer) (skip_special_tokens left at its default): "
         "push(<|im_start|> + 'ok' + <|im_end|>), flush()")
    d = impl.IncrementalDetokenizer(t)
    check_equal(d.push(ids) + d.flush(), "ok", "IncrementalDetokenizer(tokenizer) (the default "
                "is skip_special_tokens=True) of <|im_start|> + 'ok' + <|im_end|>")
    check_equal(replay(impl, ids, "<|im_start|>ok<|im_end|>", skip=False),
                "<|im_start|>ok<|im_end|>", "the text of <|im_start|> + 'ok' + <|im_end|> with "
                "skip_special_tokens=False")
    split = byte_ids(b"\xc3") + [end] + byte_ids(b"\xa9")
    check_equal(replay(impl, split, "C3, <|im_end|> (skipped: the bytes on either side "
                                    "meet), A9", skip=True), "é",
                "C3, <|im_end|>, A9 with skip_special_tokens=True (the skipped token is not "
                "there: the two bytes meet)")
    kept = byte_ids(b"\xf0\x9f") + [end] + t.encode("ok")
    check_equal(replay(impl, kept, "F0 9F, <|im_end|> kept (skip_special_tokens=False), 'ok': "
                                   "the special token's text comes in its place, after the "
                                   "bytes pending before it", skip=False),
                "\ufffd<|im_end|>ok", "F0 9F, <|im_end|>, 'ok' with skip_special_tokens=False "
                "(the pending F0 9F can no longer become a character: U+FFFD, then the text)")
    for_all(_streams(), lambda case: _check_stream(impl, *case), examples=SPLIT_EXAMPLES,
            what="(token ids, batch sizes, skip_special_tokens)")


def read_events(sock) -> list[bytes]:
    """The judge's SSE reader: 5 bytes per recv, events split at a blank line."""
    buf, events = b"", []
    sock.settimeout(WAIT_S)
    while True:
        try:
            chunk = sock.recv(5)
        except socket.timeout:
            raise Fail(f"no bytes for {WAIT_S:g} s and no end of stream", got=events) from None
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            events.append(event)
    if buf:
        raise Fail("the stream ended inside an event (each ends with a blank line, '\\n\\n')",
                   got=buf)
    return events


@test(input="sse_event('[DONE]'), sse_event('a\\nb'), sse_event('a\\rb'); stream_completion(tok, "
            "'cmpl-7', one batch per token of 'Zürich → 東京 🤗\\nline two', finish_reason="
            "'stop'), sent on a socket pair, read 5 bytes per recv")
def sse_wire(impl):
    step("sse_event('[DONE]')")
    check_equal(impl.sse_event("[DONE]"), b"data: [DONE]\n\n", "sse_event('[DONE]')")
    for raw in ("a\nb", "a\rb"):
        step(f"sse_event({raw!r})")
        try:
            got = impl.sse_event(raw)
        except ValueError as e:
            if "line break" not in str(e).lower():
                raise Fail(f"sse_event({raw!r}) raised ValueError without saying why: name the "
                           "line break", expected="... line break ...", got=str(e)) from None
            continue
        raise Fail(f"sse_event({raw!r}) must raise ValueError: a raw line break (\\n or \\r) "
                   "ends the data line, and the reader takes the rest for another field",
                   got=got)
    text = "Zürich → 東京 🤗\nline two"
    ids = tok().encode(text)
    a, b = socket.socketpair()
    yielded: list[bytes] = []
    taken, at = [0], []  # batches stream_completion took so far; that count at each yield
    raised: list[BaseException] = []  # what the learner's generator raised in the thread

    def batches():
        for i in ids:
            taken[0] += 1
            yield [i]

    def send():
        try:
            for event in impl.stream_completion(tok(), "cmpl-7", batches(), "stop"):
                yielded.append(event)
                at.append(taken[0])
                a.sendall(event)
        except Exception as e:  # reported as the learner's crash below, not as a short stream
            raised.append(e)
        finally:
            a.close()
    step(f"stream_completion(tokenizer, 'cmpl-7', one batch per token of {text!r}, 'stop'), "
         "its events sent on a socket pair as they are yielded")
    t = threading.Thread(target=send, daemon=True)
    t.start()
    try:
        events = read_events(b)
    finally:
        b.close()
        t.join(WAIT_S)
    if raised:
        raise raised[0]
    bad = [e for e in yielded if not e.endswith(b"\n\n") or e.count(b"\n\n") != 1]
    if bad:
        raise Fail("each item stream_completion yields is exactly one event ending in '\\n\\n'",
                   got=bad[0])
    if events[-1:] != [b"data: [DONE]"]:
        raise Fail("the stream must end with the event 'data: [DONE]' (after the event that "
                   "carries the finish_reason)", expected=b"data: [DONE]",
                   got=events[-1] if events else "no event at all")
    choices = [_choice(raw, "cmpl-7", i) for i, raw in enumerate(events[:-1])]
    texts = [c["text"] for c in choices]
    reasons = [c["finish_reason"] for c in choices]
    check_equal("".join(texts), text, "the texts of the events, joined")
    if "\ufffd" in "".join(texts):
        raise Fail("an event holds U+FFFD: a character was sent in pieces", got=texts)
    if reasons and "stop" not in reasons:
        raise Fail("no event carries the finish_reason 'stop': after the last batch, "
                   "stream_completion yields one more event with what flush() gives (here '': "
                   "every character was complete) and the finish_reason, then data: [DONE]",
                   expected="a last data event with finish_reason 'stop'",
                   got=f"{len(reasons)} data events, finish_reasons {sorted(set(map(str, reasons)))}")
    check_equal(reasons[-1], "stop", "finish_reason of the last data event")
    check_equal(set(reasons[:-1]), {None}, "finish_reason of the events before the last")
    empty = [i for i, x in enumerate(texts[:-1]) if not x]
    check_equal(empty, [], "positions of events with empty text before the last (a token that "
                           "completes no character sends no event)")
    _check_streams_as_it_goes(impl, ids, texts, at)


def _choice(raw: bytes, request_id: str, i: int) -> dict:
    """Event i's choices[0], its data checked against the README's chunk, field by field."""
    raw = raw.removesuffix(b"\n\n")
    if not raw.startswith(b"data: ") or b"\n" in raw:
        raise Fail("an event is one line 'data: <json>' (a newline in the text must stay "
                   "inside the JSON string, escaped)", got=raw)
    try:
        body = json.loads(raw[6:].decode("utf-8"))  # strict: a split character fails here
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Fail("an event's data is not valid UTF-8 JSON", got=f"{raw!r}: {e}") from None
    choices = body.get("choices") if isinstance(body, dict) else None
    if not (isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict)):
        raise Fail(f"event {i} of {request_id!r}: 'choices' must be a list of one dict",
                   got=body)
    missing = [k for k in ("index", "text", "finish_reason") if k not in choices[0]]
    if missing:
        raise Fail(f"event {i} of {request_id!r}: choices[0] has no {missing} (every chunk "
                   "carries index, text and finish_reason: null until the last event)",
                   expected='{"index": 0, "text": ..., "finish_reason": ...}', got=choices[0])
    check_equal((body.get("id"), body.get("object"), choices[0]["index"]),
                (request_id, "text_completion", 0), "an event's (id, object, choices[0].index)")
    return choices[0]


def _check_streams_as_it_goes(impl, ids, texts, at):
    """Each event is yielded for the batch that completed its text, before the next batch."""
    want, sent = [], ""
    for j in range(len(ids)):
        if new := oracle(impl, ids[:j + 1])[len(sent):]:
            want.append((j + 1, new))
            sent += new
    check_equal(list(zip(at, texts))[:-1], want,
                "(batches taken from token_batches when the event was yielded, its text) for "
                "each event before the last: one event per batch that completes text, yielded "
                "before the next batch is taken (stream; do not read ahead)")


def _texts_and_reason(events: list[bytes], request_id: str) -> tuple[str, str]:
    """The joined text of one stream's events and its last finish_reason, checked as it goes."""
    check_equal(events[-1:], [b"data: [DONE]\n\n"], f"the last event of {request_id!r}")
    choices = [_choice(e, request_id, i) for i, e in enumerate(events[:-1])]
    return "".join(c["text"] for c in choices), choices[-1]["finish_reason"]


@test(input="two streams at once: 'cmpl-a' with the byte tokens of '東🤗' then <|im_end|>, "
            "finish_reason left at its default, takes each batch only after 'cmpl-b' (those of "
            "'é👩' then <|im_end|>, finish_reason='stop') has yielded one more event; then "
            "'cmpl-c' with no batch at all")
def streams_side_by_side(impl):
    end = tok().eos_token_id
    events = {"cmpl-a": [], "cmpl-b": [], "cmpl-c": []}
    b = impl.stream_completion(tok(), "cmpl-b", [[i] for i in byte_ids("é👩".encode())] + [[end]],
                               "stop")

    def batches_a():  # B moves on while A holds half a character
        for i in byte_ids("東🤗".encode()) + [end]:
            events["cmpl-b"].append(next(b, None))
            yield [i]
    step("stream_completion(tokenizer, 'cmpl-a', the byte tokens of '東🤗' then <|im_end|>), each "
         "batch taken after 'cmpl-b' (those of 'é👩' then <|im_end|>, 'stop') yields one more event")
    events["cmpl-a"] = list(impl.stream_completion(tok(), "cmpl-a", batches_a()))
    events["cmpl-b"] = [e for e in events["cmpl-b"] if e is not None] + list(b)
    step("stream_completion(tokenizer, 'cmpl-c', [], 'stop'): a stream of no batch")
    events["cmpl-c"] = list(impl.stream_completion(tok(), "cmpl-c", [], "stop"))
    for rid, text, reason in (("cmpl-a", "東🤗", "length"), ("cmpl-b", "é👩", "stop"),
                              ("cmpl-c", "", "stop")):
        if len(events[rid]) < 2:
            raise Fail(f"stream {rid!r} must end with an event holding the finish_reason, then "
                       "data: [DONE], even when it had no batch", got=events[rid])
        check_equal(_texts_and_reason(events[rid], rid), (text, reason),
                    f"(the joined text, the finish_reason) of {rid!r}, streamed beside another "
                    "(each stream keeps its own detokenizer; special tokens skipped; "
                    "finish_reason as given, 'length' by default)")
