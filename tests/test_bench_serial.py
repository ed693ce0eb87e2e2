"""`minivllm bench serial`: runs, carries every format intact, writes the JSON the design names."""

import json
import subprocess
import sys

from minivllm.bench import serial_batch


def test_seed_batch_matches_the_reference_batch():
    batch = serial_batch.seed_batch()
    assert len(batch) == 256
    assert sum(len(r["token_ids"]) for r in batch) == 8432
    assert sum(len(r["block_ids"]) for r in batch) == 2048


def test_every_format_roundtrips_the_batch():
    batch = serial_batch.seed_batch(seed=5)
    for name, (encode, decode) in serial_batch.codecs(batch).items():
        assert serial_batch.same_batch(decode(encode()), batch), name


def test_flat_format_sends_the_ids_out_of_band():
    encode, _ = serial_batch.codecs(serial_batch.seed_batch())["flat_arrays"]
    frames = encode()
    assert len(frames) == 5  # body + token ids, token offsets, block ids, block offsets
    assert frames[1].nbytes == 8432 * 4


def test_bench_writes_json_with_rows_and_ratios(tmp_path):
    # In a subprocess: spawn's resource tracker then ends with the run instead of outliving it.
    out = tmp_path / "serial.json"
    run = subprocess.run([sys.executable, "-m", "minivllm.cli", "bench", "serial", "--quick",
                          "--json", str(out)], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["bench"] == "serial" and record["machine"]["pyzmq"]
    cases = {r["case"] for r in record["results"]}
    assert {"batch/pickle_dicts", "batch/msgpack_dicts", "batch/struct_lists",
            "batch/flat_arrays", "tensor/memcpy", "tensor/zmq_oob", "tensor/zmq_pickle",
            "tensor/socketpair", "tensor/zmq_oob_into", "tensor/zmq_oob_fresh",
            "tensor/shm_arena", "batch/flat_buffer", "batch32/flat_buffer",
            "batch32/pickle_dicts"} <= cases
    for key in ("msgpack_speedup_vs_pickle", "oob_tensor_vs_socket_ceiling",
                "shm_tensor_vs_memcpy", "oob_fresh_vs_socket_ceiling", "socket_ceiling_vs_memcpy",
                "flat_buffer_vs_pickle_b32", "flat_buffer_vs_pickle_b256"):
        assert record["ratios"][key] > 0
    assert "msgpack_speedup_vs_pickle" in run.stdout
    # quick mode: 2 rounds of the batch formats, so their ratios come with a spread
    assert record["ratios"]["flat_buffer_vs_pickle_b32_spread"] >= 0


def test_chunked_receive_into_a_reused_buffer_carries_the_tensor():
    # The bench's oob_into path, in-process over inproc://: chunks land in order, decode views buf.
    import numpy as np
    import zmq

    from minivllm.bench import _serial_transfer as st
    from minivllm.serial import MsgpackDecoder, MsgpackEncoder

    arr = np.arange(3 * st.CHUNK // 4 + 5, dtype="<i4")  # 3 full chunks and a partial one
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    try:
        pull.bind("inproc://oob-into")
        push.connect("inproc://oob-into")
        frames = st._chunked(MsgpackEncoder().encode(arr))
        assert len(frames) == 5
        push.send_multipart(frames, copy=False)
        buf = np.zeros(arr.nbytes, np.uint8)
        got = st._recv_into(pull, MsgpackDecoder(), buf)
        assert np.array_equal(got, arr) and np.shares_memory(got, buf)
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()
