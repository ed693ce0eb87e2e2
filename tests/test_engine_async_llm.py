"""AsyncLLM, the front end of the HTTP server: streams, validation, abort on cancel, death."""

import asyncio
import gc
import os
import signal
import time
import weakref

import pytest

from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.config import EngineConfig
from minivllm.engine.exceptions import EngineDeadError
from minivllm.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
LONG = SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True)


def run(tiny_dir, scenario, **engine_args):
    """asyncio.run(scenario(llm)), then the AsyncLLM is shut down, whatever happened."""
    llm = AsyncLLM(EngineConfig(model=tiny_dir, **engine_args))
    try:
        return asyncio.run(scenario(llm))
    finally:
        llm.shutdown()


async def last_output(llm, prompt, params, request_id):
    outs = [o async for o in llm.generate(prompt, params, request_id)]
    assert all(not o.finished for o in outs[:-1]) and outs[-1].finished
    return outs


def test_streams_cumulative_outputs_and_refuses_bad_requests(tiny_dir):
    async def scenario(llm):
        outs = await last_output(llm, "The capital", GREEDY, "a")
        final = outs[-1].outputs[0]
        assert len(final.token_ids) == 6 and final.finish_reason == "length"
        assert final.text == llm.tokenizer.decode(final.token_ids)
        with pytest.raises(ValueError, match="token ids must be in"):
            await last_output(llm, [3, 10**6], GREEDY, "b")
        with pytest.raises(ValueError, match="shorten it"):
            await last_output(llm, list(range(3, 3 + llm.config.max_model_len)), GREEDY, "c")
        running = llm.generate("The capital", LONG, "dup")
        await running.__anext__()
        with pytest.raises(ValueError, match="already running"):
            await last_output(llm, "x", GREEDY, "dup")
        await running.aclose()
        together = await asyncio.gather(*[last_output(llm, "The capital", GREEDY, f"g{i}")
                                          for i in range(4)])
        assert all(o[-1].outputs[0].token_ids == final.token_ids for o in together)
    run(tiny_dir, scenario, data_parallel_size=2)


def test_a_consumer_that_leaves_aborts_its_request(tiny_dir):
    async def scenario(llm):
        stream = llm.generate("The capital", LONG, "left")
        await stream.__anext__()
        await stream.aclose()  # as a server does when the HTTP client disconnects
        task = asyncio.ensure_future(last_output(llm, "héllo", LONG, "cancelled"))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stats = await llm.get_stats()
        assert stats["num_running"] == stats["num_waiting"] == stats["kv_blocks_used"] == 0
        aborted = llm.generate("A paged", LONG, "aborted")
        first = await aborted.__anext__()
        await llm.abort("aborted")
        rest = [o async for o in aborted]
        assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
        assert not first.finished
    run(tiny_dir, scenario)


def test_kill_9_reaches_every_stream_and_every_later_call(tiny_dir):
    async def scenario(llm):
        streams = [asyncio.ensure_future(last_output(llm, "The capital", LONG, f"s{i}"))
                   for i in range(3)]
        while (await llm.get_stats())["num_running"] < 3:
            await asyncio.sleep(0.02)
        killed_at = time.monotonic()
        os.kill(llm.engine_core.engine_manager.pids[0], signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*streams, return_exceptions=True), 10)
        assert time.monotonic() - killed_at < 5.0
        assert all(isinstance(r, EngineDeadError) for r in results), results
        assert llm.errored and isinstance(llm.dead_error, EngineDeadError)
        with pytest.raises(EngineDeadError):
            await last_output(llm, "again", GREEDY, "later")
        with pytest.raises(EngineDeadError):
            await llm.get_stats()
    run(tiny_dir, scenario)


def test_a_dropped_async_llm_stops_its_engine_while_its_loop_runs(tiny_dir):
    """A notebook or a server that replaces its AsyncLLM drops the old one: its engine must
    stop at once, not when the event loop ends (the output handler holds it only weakly)."""
    async def main():
        llm = AsyncLLM(EngineConfig(model=tiny_dir))
        await last_output(llm, "The capital", GREEDY, "a")  # the handler task is running
        handle, handler = llm.engine_core.engine_manager.handles[0], llm.output_handler
        ref = weakref.ref(llm)
        del llm
        gc.collect()
        assert ref() is None, f"something still holds the AsyncLLM: {gc.get_referrers(ref())}"
        code = await asyncio.to_thread(handle.exit_code, 60.0)
        await asyncio.sleep(0)  # the handler's cancellation runs
        return code, handler.cancelled()
    assert asyncio.run(main()) == (0, True)  # asked to stop, not killed; the handler ended
