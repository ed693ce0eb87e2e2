"""minivllm.distributed.weight_transfer: weights handed to an engine by handles, never by bytes.

The engine is a real spawned process holding a real nn.Module; the channel is a real
multiprocessing.Pipe (a Unix socketpair) with file descriptors crossing it as SCM_RIGHTS.
Tests marked `cuda` run only where torch sees a GPU (scripts/gpu_check.sh runs them there).
"""

import gc
import multiprocessing.resource_tracker
import multiprocessing as mp
import os
import threading

import pytest
import torch

from minivllm.distributed.weight_transfer import (MAX_FDS_PER_MESSAGE, WeightMismatchError,
                                                  WeightReceiver, WeightSender,
                                                  WeightTransferError, export_weights)
from minivllm.distributed.weight_transfer_demo import EngineProcess, build_model, checksums

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
