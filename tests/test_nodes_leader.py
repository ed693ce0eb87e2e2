"""bench/_nodes_leader.py times each round on its own, so that a chapter can say whether a
difference between two runs is larger than the spread of their rounds."""

import json
from types import SimpleNamespace

from minivllm.bench import _nodes_leader


class FakeLLM:
    """Makes max_tokens tokens for every prompt; no engine."""

    def __init__(self, **engine_args):
        self.calls = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def generate(self, prompts, params, use_tqdm=False):
        self.calls += 1
        out = SimpleNamespace(token_ids=list(range(params.max_tokens)))
        return [SimpleNamespace(outputs=[out]) for _ in prompts]


def test_leader_reports_every_round_and_their_total(monkeypatch, capsys):
    monkeypatch.setattr(_nodes_leader, "LLM", FakeLLM)
    _nodes_leader.main({}, batch=4, tokens=5, rounds=3)
    row = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert row["tokens"] == 3 * 4 * 5
    assert len(row["round_tokens_per_s"]) == 3
    assert row["tokens_per_s"] == row["tokens"] / row["seconds"]


def test_leader_defaults_to_one_round(monkeypatch, capsys):
    monkeypatch.setattr(_nodes_leader, "LLM", FakeLLM)
    _nodes_leader.main({}, batch=2, tokens=3)
    row = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert row["tokens"] == 6 and len(row["round_tokens_per_s"]) == 1
