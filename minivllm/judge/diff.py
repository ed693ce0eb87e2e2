"""Where two large values first differ, in one line, for a failure's expected/got.

A Fail whose expected and got are long (a batch of 1,000 tokens, a dict of 40 requests) would
print two dumps that the learner has to compare by eye. `first_difference` walks both values
together (sequences, bytes, dicts, numpy arrays, Structs and dataclasses) to the first slot that
differs and says where, how, and the lengths; `excerpt` shows a few items around that slot.
"""

from __future__ import annotations

from typing import Any

SUMMARY_CHARS = 120  # values whose repr is longer than this are summarised
WINDOW = 3  # items shown each side of the first difference
ITEM_CHARS = 40  # one item of an excerpt is clipped to this


class Difference:
    """The first difference: its path (`[3].token_ids[17]`), a one-line description, and the
    excerpts of expected and got around it."""

    def __init__(self, path: str, how: str, expected: str, got: str) -> None:
        self.path, self.how, self.expected, self.got = path, how, expected, got

    def line(self) -> str:
        return f"at {self.path or 'the top level'}: {self.how}"


def summarise(expected: Any, got: Any) -> Difference | None:
    """The first difference of two values when either one's repr is long; None when both are
    short, or when no slot differs that this walk can name (the reprs then speak for
    themselves)."""
    if max(len(_repr(expected)), len(_repr(got))) <= SUMMARY_CHARS:
        return None
    if not _alike(expected, got):  # a description against a value ("ValueError" vs frames)
        return None
    try:
        return _walk(expected, got, "")
    except Exception:  # a value whose comparison raises: show the plain reprs
        return None


def _alike(e: Any, g: Any) -> bool:
    """Whether two values are of one kind, so that a slot-by-slot walk means something."""
    kinds = ((bytes, bytearray, memoryview), (list, tuple), (dict,), (str,))
    if any(isinstance(e, k) and isinstance(g, k) for k in kinds):
        return True
    numpy = "numpy" in (type(e).__module__, type(g).__module__)
    return numpy or (type(e) is type(g) and _fields(e) is not None)


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__}>"


def _clip(text: str, limit: int = ITEM_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _fields(value: Any) -> list[str] | None:
    """The named fields of a Struct, a dataclass or a plain object; None for anything else."""
    if hasattr(value, "__struct_fields__"):
        return list(value.__struct_fields__)
    if hasattr(value, "__dataclass_fields__"):
        return list(value.__dataclass_fields__)
    return None


def _as_sequence(value: Any) -> Any:
    if isinstance(value, memoryview):
        return value.tolist() if value.ndim != 1 or value.format not in "Bbc" else value.tobytes()
    if isinstance(value, (list, tuple, str, bytes, bytearray, range)):
        return value
    return None


def _walk(e: Any, g: Any, path: str) -> Difference | None:
    if type(e).__module__ == "numpy" or type(g).__module__ == "numpy":
        return _walk_array(e, g, path)
    if isinstance(e, dict) and isinstance(g, dict):
        return _walk_dict(e, g, path)
    names = _fields(e)
    if names is not None and type(e) is type(g):
        for name in names:
            if getattr(e, name) != getattr(g, name):
                return _walk(getattr(e, name), getattr(g, name), f"{path}.{name}")
        return None
    es, gs = _as_sequence(e), _as_sequence(g)
    if es is not None and gs is not None:
        return _walk_sequence(es, gs, path)
    if e == g:
        return None
    return Difference(path, f"expected {_clip(_repr(e))}, got {_clip(_repr(g))}",
                      _clip(_repr(e), SUMMARY_CHARS), _clip(_repr(g), SUMMARY_CHARS))


def _walk_dict(e: dict, g: dict, path: str) -> Difference | None:
    missing = [k for k in e if k not in g]
    extra = [k for k in g if k not in e]
    keys = f"{len(e)} keys expected, {len(g)} got"
    if missing or extra:
        parts = ([f"missing key {_clip(repr(missing[0]))}"] if missing else []) + \
                ([f"unexpected key {_clip(repr(extra[0]))}"] if extra else [])
        return Difference(path, f"{', '.join(parts)} ({keys})",
                          _keys(e, missing[:1] or extra[:1]), _keys(g, extra[:1] or missing[:1]))
    for k in e:
        if e[k] != g[k]:
            return _walk(e[k], g[k], f"{path}[{k!r}]")
    return None


def _keys(d: dict, around: list) -> str:
    keys = list(d)
    shown = keys[:2 * WINDOW + 1]
    return "{" + ", ".join(_clip(repr(k)) + ": ..." for k in shown) + \
           (f", ... ({len(keys)} keys)" if len(keys) > len(shown) else "") + "}"


def _walk_sequence(e: Any, g: Any, path: str) -> Difference | None:
    if type(e) is not type(g) and not (isinstance(e, (bytes, bytearray)) and isinstance(g, (bytes, bytearray))):
        if list(e) == list(g):
            return Difference(path, f"expected a {type(e).__name__}, got a {type(g).__name__} "
                              "with the same items", _clip(_repr(e), SUMMARY_CHARS),
                              _clip(_repr(g), SUMMARY_CHARS))
    n = min(len(e), len(g))
    i = next((i for i in range(n) if e[i] != g[i]), n)
    lengths = f"lengths {len(e)} expected, {len(g)} got"
    if i == n and len(e) == len(g):
        return None
    if i < n and not isinstance(e, (str, bytes, bytearray)):
        inner = _walk(e[i], g[i], f"{path}[{i}]")
        if inner is not None and (_fields(e[i]) is not None or _as_sequence(e[i]) is not None
                                  or isinstance(e[i], dict)):
            return inner
    if i < n:
        one = (lambda s: s[i:i + 1]) if isinstance(e, (str, bytes, bytearray)) else (lambda s: s[i])
        return Difference(f"{path}[{i}]", f"{_clip(repr(one(g)))} where {_clip(repr(one(e)))} "
                          f"was expected ({lengths})", _window(e, i), _window(g, i))
    if len(g) < len(e):
        how = f"got ends after {len(g)} items, {len(e) - len(g)} short"
    else:
        how = f"got has {len(g) - len(e)} items past the expected {len(e)}"
    return Difference(path, f"{how} ({lengths})", _window(e, i), _window(g, i))


def _window(seq: Any, i: int) -> str:
    lo, hi = max(0, i - WINDOW), min(len(seq), i + WINDOW + 1)
    if isinstance(seq, (str, bytes, bytearray)):
        lo, hi = max(0, i - 4 * WINDOW), min(len(seq), i + 4 * WINDOW + 1)
        body = _repr(bytes(seq[lo:hi]) if not isinstance(seq, str) else seq[lo:hi])
    else:
        body = ", ".join(_clip(_repr(x)) for x in seq[lo:hi])
    where = f"items {lo}..{hi - 1} of {len(seq)}" if hi > lo else f"{len(seq)} items"
    return f"{where}: {'... ' if lo else ''}{body}{' ...' if hi < len(seq) else ''}"


def _walk_array(e: Any, g: Any, path: str) -> Difference | None:
    import numpy as np
    ea, ga = np.asarray(e), np.asarray(g)
    if ea.shape != ga.shape or ea.dtype != ga.dtype:
        how = f"shape {ea.shape} dtype {ea.dtype} expected, shape {ga.shape} dtype {ga.dtype} got"
        return Difference(path, how, _clip(_repr(e), SUMMARY_CHARS), _clip(_repr(g), SUMMARY_CHARS))
    ef, gf = ea.reshape(-1), ga.reshape(-1)
    bad = np.flatnonzero(~((ef == gf) | ((ef != ef) & (gf != gf))))
    if not len(bad):
        return None
    i = int(bad[0])
    index = tuple(int(x) for x in np.unravel_index(i, ea.shape)) if ea.ndim else ()
    how = f"element {list(index)} is {ga[index]!r} where {ea[index]!r} was expected " \
          f"({len(bad)} of {ef.size} elements differ)"
    return Difference(f"{path}{list(index) if index else ''}", how,
                      _window(ef.tolist(), i), _window(gf.tolist(), i))
