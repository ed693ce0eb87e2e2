"""The judge's summary of large expected/got values (minivllm.judge.diff): one line says where
they first differ, and the excerpts stay short, whatever the size of the values."""

import dataclasses

import numpy as np

from minivllm.judge.api import Fail
from minivllm.judge.diff import SUMMARY_CHARS, summarise
from minivllm.judge.report import format_failure


def test_short_values_are_not_summarised():
    assert summarise([1, 2, 3], [1, 2, 4]) is None
    fail = Fail("wrong", expected=[1, 2, 3], got=[1, 2, 4])
    assert fail.differs is None and fail.got == "[1, 2, 4]"


def test_list_names_the_first_index_and_the_lengths():
    expected = list(range(1000))
    got = expected[:17] + [5] + expected[18:]
    d = summarise(expected, got)
    assert d.path == "[17]"
    assert "5 where 17 was expected" in d.how and "lengths 1000 expected, 1000 got" in d.how
    assert "items 14..20 of 1000" in d.expected and len(d.expected) < 2 * SUMMARY_CHARS


def test_a_shorter_list_says_how_many_are_missing():
    d = summarise(list(range(500)), list(range(480)))
    assert "got ends after 480 items, 20 short" in d.how


def test_nested_values_give_the_path():
    @dataclasses.dataclass
    class Req:
        req_id: str
        token_ids: list

    expected = {f"r{i}": Req(f"r{i}", list(range(50))) for i in range(10)}
    got = {k: Req(v.req_id, list(v.token_ids)) for k, v in expected.items()}
    got["r3"].token_ids[40] = -1
    d = summarise(expected, got)
    assert d.path == "['r3'].token_ids[40]" and "-1 where 40 was expected" in d.how


def test_missing_key():
    expected = {f"k{i}": i for i in range(40)}
    got = dict(expected)
    del got["k7"]
    assert "missing key 'k7' (40 keys expected, 39 got)" in summarise(expected, got).how


def test_bytes_and_arrays():
    d = summarise(bytes(1000), bytes(300) + b"\x01" + bytes(699))
    assert d.path == "[300]" and "b'\\x01'" in d.how
    a = np.arange(1000.0).reshape(10, 100)
    b = a.copy()
    b[3, 7] = -1
    d = summarise(a, b)
    assert d.path == "[3, 7]" and "(1 of 1000 elements differ)" in d.how
    assert "shape (10, 99)" in summarise(a, a[:, :99]).how


def test_fail_shows_one_line_and_short_excerpts():
    fail = Fail("token ids are wrong", expected=list(range(2000)), got=list(range(1999)) + [0])
    shown = format_failure({"name": "t", "status": "fail", "message": fail.message,
                            "expected": fail.expected, "got": fail.got, "differs": fail.differs})
    assert "differs:  at [1999]: 0 where 1999 was expected (lengths 2000 expected, 2000 got)" in shown
    assert len(shown) < 600


def test_a_description_against_a_value_is_not_walked():
    assert summarise("ValueError", [bytes(200)]) is None
    assert summarise(list(range(100)), tuple(range(100))) is not None
