"""`minivllm bench serve --base-url`: the same client and metrics against a server it did not
start, here a real `minivllm serve` on the tiny model. Structure and counts, never timings."""

import json

import pytest

from minivllm.bench import serve
from minivllm.bench._openai_client import RequestResult
from minivllm.bench.serve_metrics import parse_goodput, summarize
from minivllm.entrypoints.openai.server_process import ServerProcess

LATENCIES = [f"{m}_{s}_ms" for m in ("ttft", "tpot", "itl")
             for s in ("mean", "p50", "p90", "p99")]


def test_base_url_load_tests_a_running_server(tiny_dir, tmp_path, capsys):
    out = tmp_path / "serve.json"
    with ServerProcess([tiny_dir, "--served-model-name", "tiny"]) as server:
        assert serve.main(["--backend", "openai", "--base-url", server.url, "--model", tiny_dir,
                           "--max-concurrency", "1", "3", "--num-prompts", "5",
                           "--num-warmups", "2", "--server-pid", str(server.pid),
                           "--goodput", "ttft:600000", "e2el:600000", "--json", str(out)]) == 0
        printed = capsys.readouterr().out
        # a wrong model name: every request fails, counted and said, not measured
        assert serve.main(["--base-url", server.url, "--model", tiny_dir, "--num-prompts", "2",
                           "--max-concurrency", "2", "--num-warmups", "0",
                           "--served-model-name", "nope", "--json", str(tmp_path / "bad.json")
                           ]) == 0
    bad = json.loads((tmp_path / "bad.json").read_text())["results"][0]
    assert bad["requests"] == 0 and bad["errors"] == 2 and bad["out_tok_per_s"] == 0
    assert "a request failed" in capsys.readouterr().err
    record = json.loads(out.read_text())
    assert [r["concurrency"] for r in record["results"]] == [1, 3]
    for row in record["results"]:
        assert row["engine"] == f"openai@127.0.0.1:{server.port}"
        # no error: the requests carried the name /v1/models gave ("tiny"), which serve checks
        assert row["requests"] == 5 and row["errors"] == 0, row
        assert row["out_tok_per_s"] > 0 and row["cpu_ms_per_tok"] > 0 and row["server_rss_mib"] > 0
        for key in LATENCIES:  # 16 tokens a request (quick mode): every latency was measured
            assert row[key] > 0, (key, row)
        assert row["ttft_p50_ms"] <= row["ttft_p90_ms"] <= row["ttft_p99_ms"]
        assert row["good_requests"] == 5  # 10-minute objectives: every request met them
        assert row["others_cores"] >= 0  # the LoadMeter's view, the server's CPU taken out
    for column in ["out_tok_per_s", "goodput_req_per_s", *LATENCIES]:
        assert column in printed
    assert record["ratios"] == {}  # no in-process engine to compare with


def test_base_url_without_a_server_says_what_to_do(tmp_path, tiny_dir):
    from minivllm.entrypoints.openai.server_process import free_port
    with pytest.raises(SystemExit, match="no OpenAI-compatible server answers at"):
        serve.main(["--base-url", f"http://127.0.0.1:{free_port()}", "--model", tiny_dir])
    with pytest.raises(SystemExit, match="http://HOST:PORT"):
        serve.main(["--base-url", "https://example.invalid", "--model", tiny_dir])


def _result(ttft: float, itl: list[float]) -> RequestResult:
    r = RequestResult(ttft=ttft, itl=itl, output_tokens=1 + len(itl))
    r.e2e = ttft + sum(itl)
    return r


def test_percentiles_and_goodput_follow_vllms_definitions():
    # 10 requests: TTFT 0.1 .. 1.0 s; the last two streams stall once for 2 s
    results = [_result(0.1 * i, [0.05] * 9 + ([2.0] if i > 8 else [0.05])) for i in range(1, 11)]
    row = summarize("x", 4, results, wall=2.0, cpu_s=None, percentiles=(50, 90, 99),
                    goodput=parse_goodput(["ttft:500", "tpot:100"]))
    assert row["ttft_p50_ms"] == pytest.approx(500) and row["ttft_p90_ms"] == pytest.approx(900)
    assert row["itl_p50_ms"] == pytest.approx(50) and row["itl_p99_ms"] == pytest.approx(2000)
    # TTFT <= 500 ms: requests 1-5; each TPOT is 50 ms but the stalled ones' (245 ms) are not
    assert row["good_requests"] == 5 and row["goodput_req_per_s"] == pytest.approx(2.5)
    assert "good_requests" not in summarize("x", 4, results, 2.0, None)  # no objectives


@pytest.mark.parametrize("pairs, says", [(["itl:5"], "unknown metric"), (["ttft"], "KEY:VALUE"),
                                         (["ttft:-1"], "non-negative")])
def test_goodput_refuses_what_vllm_refuses(pairs, says):
    with pytest.raises(ValueError, match=says):
        parse_goodput(pairs)


def test_the_in_process_side_takes_the_servers_flags(tiny_dir):
    """serve_vs_inproc compares like with like: --server-args reach the in-process engine too."""
    args = serve.make_parser().parse_args(["--kv-cache-dtype", "float16", "--server-args",
                                           "--target-itl-ms 105 --max-num-batched-tokens 64"])
    server_args, config = serve.local_configs(args, str(tiny_dir))
    assert server_args == ["--kv-cache-dtype", "float16", "--target-itl-ms", "105",
                           "--max-num-batched-tokens", "64"]
    assert (config.model, config.target_itl_ms) == (str(tiny_dir), 105.0)
    assert config.max_num_batched_tokens == 64 and str(config.kv_cache_dtype).endswith("float16")
