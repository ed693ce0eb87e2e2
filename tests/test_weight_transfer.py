"""minivllm.distributed.weight_transfer: weights handed to an engine by handles, never by bytes.

The engine is a real spawned process holding a real nn.Module; the channel is a real
multiprocessing.Pipe (a Unix socketpair) with file descriptors crossing it as SCM_RIGHTS.
Tests marked `cuda` run only where torch sees a GPU (scripts/gpu_check.sh runs them there).
"""

import gc
import multiprocessing.resource_tracker
import multiprocessing as mp
import os
import signal
import socket
import threading

import msgspec
import pytest
import torch

from minivllm.distributed.weight_transfer import (MAX_FDS_PER_MESSAGE, TensorMeta,
                                                  WeightMismatchError, WeightReceiver,
                                                  WeightSender, WeightTransferError,
                                                  WeightUpdateAck, WeightUpdateRequest,
                                                  export_weights)
from minivllm.demos.weight_engine import EngineProcess, build_model, checksums

# The tracker that spawn starts lives as long as pytest: start it before the leak snapshot.
multiprocessing.resource_tracker.ensure_running()
HIDDEN, LAYERS = 64, 3
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def engine():
    with EngineProcess(HIDDEN, LAYERS) as eng:
        yield eng


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def in_thread_engine(target, rounds=1):
    """A receiver on a thread of this process: for checks that need no second process."""
    a, b = mp.Pipe()
    errors = []

    def serve():
        with WeightReceiver(b) as receiver:
            for _ in range(rounds):
                try:
                    receiver.receive_into(target)
                except Exception as exc:  # reported to the sender by the ack as well
                    errors.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return a, b, thread, errors


def test_round_trip_into_a_module_in_another_process(engine):
    ptrs = engine.data_ptrs()
    trainer = build_model(HIDDEN, LAYERS, seed=1)
    engine.update_ipc(trainer)
    assert engine.checksums() == checksums(trainer)
    with torch.no_grad():  # the trainer steps in place; the next round carries the new values
        for p in trainer.parameters():
            p.add_(1.0)
    engine.update_ipc(trainer)
    assert engine.checksums() == checksums(trainer)
    assert engine.data_ptrs() == ptrs, "the engine's weights must be updated in place"


def test_a_mismatch_names_the_tensor_and_both_shapes_and_changes_nothing(engine):
    good = build_model(HIDDEN, LAYERS, seed=2)
    engine.update_ipc(good)
    before = engine.checksums()
    bad = build_model(HIDDEN, LAYERS, seed=3)  # every tensor differs from `good` ...
    bad.layers[2].o_proj.weight = torch.nn.Parameter(torch.zeros(HIDDEN, HIDDEN // 2))  # ... and one misfits
    with pytest.raises(WeightMismatchError) as err:
        engine.update_ipc(bad)
    message = str(err.value)
    assert "layers.2.o_proj.weight" in message
    assert f"[{HIDDEN}, {HIDDEN}]" in message and f"[{HIDDEN}, {HIDDEN // 2}]" in message
    assert engine.checksums() == before, "tensors listed before the misfit must not be written"
    engine.update_ipc(build_model(HIDDEN, LAYERS, seed=4))  # the engine still serves updates


def test_dtype_and_unknown_names_are_rejected_before_any_write():
    target = {"a": torch.zeros(4), "b": torch.zeros(2, 2)}
    a, b, thread, errors = in_thread_engine(target)
    with WeightSender(a) as sender:
        with pytest.raises(WeightMismatchError) as err:
            sender.send({"a": torch.ones(4), "b": torch.ones(2, 2, dtype=torch.float64),
                         "c": torch.ones(1)})
    thread.join(5)
    assert "engine dtype torch.float32, update dtype torch.float64" in str(err.value)
    assert "'c': the engine has no such weight" in str(err.value)
    assert torch.equal(target["a"], torch.zeros(4)), "'a' fits, but the round as a whole did not"
    assert len(errors) == 1 and isinstance(errors[0], WeightMismatchError)
    a.close(), b.close()


def test_views_of_one_storage_cross_as_one_descriptor():
    flat = torch.arange(24, dtype=torch.float32)
    weights = {"w": flat[:12].view(3, 4), "wt": flat[:12].view(3, 4).t(), "tail": flat[12:]}
    request, fds, keep = export_weights(weights)
    assert len(fds) == 1 and request.cpu_storage_sizes == [24 * 4]
    target = {"w": torch.zeros(3, 4), "wt": torch.zeros(4, 3), "tail": torch.zeros(12)}
    a, b, thread, _ = in_thread_engine(target)
    sender = WeightSender(a)
    sender.send(weights)
    thread.join(5)
    for name in weights:
        assert torch.equal(target[name], weights[name]), name
    sender.close(), a.close(), b.close()


def test_more_tensors_than_one_message_can_carry_descriptors_for():
    gc.collect()  # earlier tests' garbage would close its descriptors in the middle of ours
    fds_before = open_fds()
    n = MAX_FDS_PER_MESSAGE * 2 + 7
    weights = {f"t{i}": torch.full((3,), float(i)) for i in range(n)}
    target = {name: torch.zeros(3) for name in weights}
    a, b, thread, errors = in_thread_engine(target)
    with WeightSender(a) as sender:
        sender.send(weights)
    thread.join(10)
    assert not errors and all(torch.equal(target[k], weights[k]) for k in weights)
    # Each shared storage holds a descriptor (torch's file_descriptor strategy) until it is freed.
    del weights, target
    a.close(), b.close()
    gc.collect()
    assert open_fds() == fds_before, "a received descriptor or a mapping outlived its use"


def test_second_round_reuses_the_engines_mapping():
    weights = {"w": torch.ones(1000)}
    target = {"w": torch.zeros(1000)}
    a, b, thread, _ = in_thread_engine(target, rounds=2)
    sender = WeightSender(a)
    sender.send(weights)
    weights["w"].mul_(3)
    sender.send(weights)
    thread.join(5)
    assert torch.equal(target["w"], torch.full((1000,), 3.0))
    sender.close(), a.close(), b.close()


def test_an_engine_that_never_answers_times_out_with_a_clear_error():
    a, b = mp.Pipe()
    sender = WeightSender(a, ack_timeout_s=0.3)
    with pytest.raises(WeightTransferError, match="did not acknowledge round 1"):
        sender.send({"w": torch.ones(8)})
    sender.close(), a.close(), b.close()


def test_a_one_way_pipe_is_refused():
    r, w = mp.Pipe(duplex=False)
    with pytest.raises(ValueError, match="Pipe"):
        WeightSender(w)
    r.close(), w.close()


def test_export_takes_parameters_and_buffers_and_one_device():
    model = build_model(8, 1, seed=0)
    model.register_buffer("rope_cache", torch.ones(4))
    request, fds, _ = export_weights(model)
    assert {m.name for m in request.tensors} >= {"norm", "rope_cache", "layers.0.q_proj.weight"}
    with pytest.raises(ValueError, match="one device"):
        export_weights({"a": torch.ones(1), "b": torch.ones(1, device="meta")})


@cuda
def test_cuda_round_trip_through_ipc_handles():
    trainer = build_model(HIDDEN, LAYERS, seed=5, device="cuda")
    with EngineProcess(HIDDEN, LAYERS, device="cuda") as eng:
        ptrs = eng.data_ptrs()
        eng.update_ipc(trainer)
        assert eng.checksums() == checksums(trainer)
        with torch.no_grad():
            for p in trainer.parameters():
                p.mul_(2)  # the lifetime rule: writing is safe only after the ack
        eng.update_ipc(trainer)
        assert eng.checksums() == checksums(trainer)
        assert eng.data_ptrs() == ptrs


@cuda
def test_cuda_mismatch_is_rejected_and_changes_nothing():
    with EngineProcess(HIDDEN, LAYERS, device="cuda") as eng:
        eng.update_ipc(build_model(HIDDEN, LAYERS, seed=6, device="cuda"))
        before = eng.checksums()
        bad = build_model(HIDDEN, LAYERS, seed=7, device="cuda")
        bad.norm = torch.nn.Parameter(torch.zeros(HIDDEN + 1, device="cuda"))
        with pytest.raises(WeightMismatchError, match=r"'norm': engine shape \[64\], update shape \[65\]"):
            eng.update_ipc(bad)
        assert eng.checksums() == before


@cuda
def test_cuda_export_records_an_interprocess_event():
    request, fds, keep = export_weights({"w": torch.ones(16, device="cuda")})
    assert request.device == "cuda" and not fds and request.event_handle
    assert isinstance(keep[-1], torch.cuda.Event)


# --- peers that die, and requests that lie --------------------------------------------------
FORK = mp.get_context("fork")


def request_then_die(conn, n_storages):
    """A trainer that sends a request announcing descriptors, then dies before sending them."""
    metas = [TensorMeta(f"t{i}", "float32", [4], [1], 0, i) for i in range(n_storages)]
    conn.send_bytes(msgspec.msgpack.encode(
        WeightUpdateRequest(1, "cpu", metas, cpu_storage_sizes=[16] * n_storages)))
    os.kill(os.getpid(), signal.SIGKILL)


def call_in_thread(fn, timeout=10.0):
    """fn() on a thread; returns what it raised. A thread still running after timeout fails."""
    outcome = []

    def run():
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"{fn} still running after {timeout} s"
    return outcome[0]


def test_a_trainer_that_dies_before_its_descriptors_is_a_transfer_error():
    a, b = mp.Pipe()
    trainer = FORK.Process(target=request_then_die, args=(a, 2))
    trainer.start()
    a.close()  # the dead trainer held the only other copy
    trainer.join()
    with WeightReceiver(b) as receiver:
        error = call_in_thread(receiver.recv)  # was: a loop at full CPU, forever
    assert isinstance(error, WeightTransferError) and "trainer" in str(error), error
    b.close()


def test_every_peer_death_is_a_transfer_error():
    a, b = mp.Pipe()
    receiver = WeightReceiver(b)
    a.close()  # the trainer is gone before its request
    assert isinstance(call_in_thread(receiver.recv), WeightTransferError)
    assert isinstance(call_in_thread(lambda: receiver.ack(1)), WeightTransferError)
    receiver.close(), b.close()
    a, b = mp.Pipe()
    sender = WeightSender(a)
    b.close()  # the engine is gone before the round
    assert isinstance(call_in_thread(lambda: sender.send({"w": torch.ones(4)})),
                      WeightTransferError)
    sender.close(), a.close()


def engine_reads_then_dies(conn):
    conn.recv_bytes()
    os.kill(os.getpid(), signal.SIGKILL)


def test_an_engine_that_dies_mid_round_is_a_transfer_error():
    a, b = mp.Pipe()
    engine = FORK.Process(target=engine_reads_then_dies, args=(b,))
    engine.start()
    b.close()
    with WeightSender(a) as sender:
        error = call_in_thread(lambda: sender.send({"w": torch.ones(4)}))
    engine.join()
    assert isinstance(error, WeightTransferError) and "engine" in str(error), error
    a.close()


# Each lie: (what the request claims, the words the error must contain). The trainer's one
# real storage holds 4 float32 (16 bytes); the engine's target is a float32 [4].
LIES = {
    "storage larger than the segment": (dict(size=64 << 20), "16 bytes"),
    "zero stride": (dict(stride=[0]), "stride"),
    "negative stride": (dict(stride=[-1]), "stride"),
    "stride rank": (dict(stride=[1, 1]), "stride"),
    "offset past the end": (dict(offset=1), "past"),
    "negative offset": (dict(offset=-1), "offset"),
    "storage index": (dict(storage=1), "storage 1"),
    "negative storage index": (dict(storage=-1), "storage -1"),
    "storage smaller than the view": (dict(size=8), "past"),
}


@pytest.mark.parametrize("lie", list(LIES))
def test_a_request_that_lies_about_its_layout_is_rejected_before_any_write(lie):
    claim, words = LIES[lie]
    source = torch.arange(4, dtype=torch.float32)
    source.share_memory_()
    fd, _ = source.untyped_storage()._share_fd_cpu_()
    meta = TensorMeta("w", "float32", [4], claim.get("stride", [1]), claim.get("offset", 0),
                      claim.get("storage", 0))
    request = WeightUpdateRequest(1, "cpu", [meta], cpu_storage_sizes=[claim.get("size", 16)])
    target = {"w": torch.full((4,), -1.0)}
    a, b = mp.Pipe()
    with WeightReceiver(b) as receiver:
        a.send_bytes(msgspec.msgpack.encode(request))
        with socket.socket(fileno=os.dup(a.fileno())) as sock:
            socket.send_fds(sock, [b"F"], [fd])
        error = call_in_thread(lambda: receiver.receive_into(target))
    ack = msgspec.msgpack.decode(a.recv_bytes(), type=WeightUpdateAck)
    assert isinstance(error, WeightTransferError) and words in str(error), (lie, error)
    assert ack.error and words in ack.error, "the trainer learns why"
    assert torch.equal(target["w"], torch.full((4,), -1.0)), "nothing may be written"
    assert os.fstat(fd).st_size == 16, "the trainer's segment must not grow"
    a.close(), b.close()
