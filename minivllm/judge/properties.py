"""Property tests for an exercise whose contract is over inputs (a wire format, a batch layout).

`for_all(strategy, check, examples=..., what=...)` runs `check` on examples that hypothesis
draws from `strategy`, the same ones on every run (derandomized, a fixed number, no deadline, no
example database), so a verdict never changes between runs or machines. On a failure hypothesis
shrinks the example, and the Fail the learner reads names that smallest failing example.
"""

from __future__ import annotations

from typing import Any, Callable

from hypothesis import HealthCheck, Verbosity, given, settings
from hypothesis import strategies as st

from minivllm.judge.api import Fail

__all__ = ["for_all", "st"]


def for_all(strategy: st.SearchStrategy, check: Callable[[Any], None], *, examples: int,
            what: str) -> None:
    """check(example) for `examples` examples of strategy; raise Fail on the smallest that fails.

    check raises Fail (or anything else: the learner's code crashed) for a wrong answer. `what`
    says what an example is ("a batch"), for the message."""
    tried: list[Any] = []

    @settings(derandomize=True, max_examples=examples, deadline=None, database=None,
              verbosity=Verbosity.quiet, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(example):
        tried[:] = [example]  # hypothesis runs the shrunk example last, before it re-raises
        check(example)

    try:
        run()
    except Fail as e:
        shrunk = Fail(e.message, detail=e.detail,
                      input=f"{what} = {tried[0]!r} (the smallest failing one hypothesis found)")
        shrunk.expected, shrunk.got, shrunk.differs = e.expected, e.got, e.differs  # shown
        raise shrunk from None
    except Exception as e:  # the learner's code raised: show the example that makes it
        raise Fail(f"your code raised {type(e).__name__}: {e}", expected="no exception",
                   got=f"{type(e).__name__}: {e}",
                   input=f"{what} = {tried[0]!r} (the smallest failing one hypothesis found)"
                   ) from None

