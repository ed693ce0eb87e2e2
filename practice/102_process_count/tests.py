"""The judge's tests for exercise 102. Each receives the learner's module as `impl`."""

from minivllm.judge.api import Fail, check_equal, step, test


def _count(impl, **sizes):
    """serve_process_count(**sizes), named as the test's current step."""
    step("serve_process_count(" + ", ".join(f"{k}={v}" for k, v in sizes.items()) + ")")
    return impl.serve_process_count(**sizes)


@test(input="tp=4 (vllm serve -tp=4) and tp=2, dp=4 (vllm serve -tp=2 -dp=4)")
def docs_examples(impl):
    check_equal(_count(impl, tp=4, dp=1), 6, "processes of `serve -tp=4` (1 + 1 + 4)")
    check_equal(_count(impl, tp=2, dp=4), 18,
                "processes of `serve -tp=2 -dp=4` (1 launcher + 4 API + 4 cores + 8 workers + 1 coordinator)")


@test(input="tp=1, dp=1; tp=1, dp=2; tp=1, pp=2; tp=1, pp=2, dp=2")
def worker_in_engine_core_at_tp1(impl):
    check_equal(_count(impl, tp=1, dp=1), 2,
                "processes at tp=1 (the worker is inside the engine core: 1 API + 1 core)")
    check_equal(_count(impl, tp=1, dp=2), 1 + 2 + 2 + 1,
                "processes at tp=1, dp=2 (launcher + 2 API + 2 cores + coordinator)")
    check_equal(_count(impl, tp=1, dp=1, pp=2), 1 + 1 + 2,
                "processes at tp=1, pp=2 (tp * pp = 2: two worker processes, not the uni executor)")
    check_equal(_count(impl, tp=1, dp=2, pp=2), 1 + 2 + 2 + 4 + 1,
                "processes at tp=1, pp=2, dp=2 (launcher + 2 API + 2 cores + 4 workers + coordinator)")


@test(input="tp=2, dp=2, pp=2, with api_server_count 1, None and 2")
def api_servers_and_pipeline(impl):
    check_equal(_count(impl, tp=2, dp=2, pp=2, api_server_count=1), 1 + 2 + 8 + 1,
                "processes with one API server")
    check_equal(_count(impl, tp=2, dp=2, pp=2), 1 + 2 + 2 + 8 + 1,
                "processes with the default API server count (= dp, so a launcher too)")
    check_equal(_count(impl, tp=2, dp=2, pp=2, api_server_count=2), 1 + 2 + 2 + 8 + 1,
                "processes with api_server_count=2 given (the same as its default, dp=2)")


@test(input="tp=2, dp=1 with api_server_count 1, 2 and 3")
def launcher_only_with_several_api_servers(impl):
    check_equal(_count(impl, tp=2, dp=1, api_server_count=1), 1 + 1 + 2,
                "processes with one API server (the CLI process serves: no launcher)")
    check_equal(_count(impl, tp=2, dp=1, api_server_count=2), 1 + 2 + 1 + 2,
                "processes with two API servers (the CLI process stays as their launcher)")
    check_equal(_count(impl, tp=2, dp=1, api_server_count=3), 1 + 3 + 1 + 2,
                "processes with three API servers")


BAD_SIZES = [dict(tp=0, dp=1), dict(tp=1, dp=0), dict(tp=2, dp=1, pp=0), dict(tp=-1, dp=1),
             dict(tp=2, dp=-2), dict(tp=1, dp=1, pp=-1), dict(tp=-1, dp=-1), dict(tp=-2, dp=1, pp=-2),
             dict(tp=1, dp=0, api_server_count=1), dict(tp=0, dp=1, api_server_count=2)]


@test(input=", ".join(str(sizes) for sizes in BAD_SIZES))
def rejects_bad_sizes(impl):
    for sizes in BAD_SIZES:
        call = "serve_process_count(" + ", ".join(f"{k}={v}" for k, v in sizes.items()) + ")"
        try:
            got = impl.serve_process_count(**sizes)
        except ValueError:
            continue
        raise Fail(f"{call} must raise ValueError: every size (tp, dp, pp) starts at 1",
                   got=f"returned {got!r}")


HEADLESS = [(dict(tp=2, dp=2, api_server_count=0), 1 + 2 + 4),
            (dict(tp=1, dp=3, api_server_count=0), 1 + 3)]


@test(input="; ".join(str(sizes) for sizes, _ in HEADLESS) + " (headless: no API server)")
def headless_zero_api_servers(impl):
    for sizes, expected in HEADLESS:
        call = "serve_process_count(" + ", ".join(f"{k}={v}" for k, v in sizes.items()) + ")"
        got = _count(impl, **sizes)
        if got == expected:
            continue
        default = _count(impl, **{**sizes, "api_server_count": None})
        if got == default:
            why = ("api_server_count=0 is a count, not 'unset': only None defaults to dp "
                   "(`api_server_count or dp` turns 0 into dp; test `is None`)")
        elif got == expected - 1:
            why = ("with no API server (headless) the CLI process stays alive as the parent of "
                   "the engine cores: count it")
        elif got == expected + 1:
            why = "headless runs no DP coordinator: the head node, which has the API servers, does"
        else:
            why = "headless: the CLI process + the engine cores + their workers, nothing else"
        raise Fail(f"{call}: {why}", expected=expected, got=got, input=call)
