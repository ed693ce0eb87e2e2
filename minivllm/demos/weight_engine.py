"""An engine process for chapter 06, `minivllm bench weights` and the tests: a child that owns a
Llama-shaped stack of weights and applies the updates a trainer sends it on a pipe.

Commands on the pipe, one frame each (the engine answers every one):
    b"ipc"        then one WeightSender round          -> the WeightUpdateAck
    b"pickle"     then one frame: pickle of name->tensor  -> b"ok"  (the socket baseline)
    b"checksums"                                       -> msgpack {name: sha1 of the bytes}
    b"ptrs"                                            -> msgpack {name: data_ptr}
    b"stop"                                            -> b"bye", then the process exits
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import pickle
import weakref

import msgspec
import torch
from torch import nn

from minivllm.distributed.weight_transfer import WeightMismatchError, WeightReceiver, WeightSender

READY_TIMEOUT_S = 60.0  # a spawned child imports torch first: seconds on a busy 2-core machine
REPLY_TIMEOUT_S = 120.0  # a pickle of 256 MB on a slow machine
# The engine's work is memory-bound copies. A second OpenMP thread buys little, and on a busy
# 2-core machine a descheduled one stalls every copy (figures/reference_numbers.md).
ENGINE_THREADS = 1
MIB = 1 << 20


class DemoBlock(nn.Module):
    """The weight shapes of one Llama layer, shrunk to two square projections and a norm."""

    def __init__(self, hidden: int):
        super().__init__()
        self.input_layernorm = nn.Parameter(torch.ones(hidden))
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)


class DemoModel(nn.Module):
    def __init__(self, hidden: int, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(DemoBlock(hidden) for _ in range(n_layers))
        self.norm = nn.Parameter(torch.ones(hidden))


def build_model(hidden: int, n_layers: int, seed: int | None = None, device: str = "cpu") -> DemoModel:
    """Zeros when seed is None (an engine before its first update), else seeded random values."""
    with torch.device("meta"):
        model = DemoModel(hidden, n_layers)
    model = model.to_empty(device=device).requires_grad_(False)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    for p in model.parameters():
        if gen is None:
            p.zero_()
        else:
            p.copy_(torch.randn(p.shape, generator=gen))
    return model


def shape_for_mib(mib: float) -> tuple[int, int]:
    """(hidden, n_layers) for a float32 model of about `mib` MiB, 2 hidden^2 floats per layer."""
    hidden = 1024 if mib >= 16 else 256
    per_layer = 2 * hidden * hidden * 4
    return hidden, max(1, round(mib * MIB / per_layer))


def model_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def checksums(model: nn.Module) -> dict[str, str]:
    return {name: hashlib.sha1(p.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
            for name, p in model.named_parameters()}


def engine_main(conn, hidden: int, n_layers: int, device: str = "cpu") -> None:
    """The child's loop (a module-level function: spawn cannot pickle one from __main__)."""
    torch.set_num_threads(ENGINE_THREADS)
    model = build_model(hidden, n_layers, device=device)
    receiver = WeightReceiver(conn)
    conn.send_bytes(b"ready")
    while True:
        cmd = conn.recv_bytes()
        if cmd == b"ipc":
            try:
                receiver.receive_into(model)
            except WeightMismatchError:
                pass  # the ack told the trainer; the engine keeps serving its old weights
        elif cmd == b"pickle":
            state = pickle.loads(conn.recv_bytes())
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(state[name])
            conn.send_bytes(b"ok")
        elif cmd == b"checksums":
            conn.send_bytes(msgspec.msgpack.encode(checksums(model)))
        elif cmd == b"ptrs":
            conn.send_bytes(msgspec.msgpack.encode({n: p.data_ptr() for n, p in model.named_parameters()}))
        elif cmd == b"stop":
            receiver.close()
            conn.send_bytes(b"bye")
            return


class EngineProcess:
    """Parent's handle on an engine child: start it, update its weights, stop it."""

    def __init__(self, hidden: int, n_layers: int, device: str = "cpu"):
        ctx = mp.get_context("spawn")  # CUDA cannot survive fork; spawn is the one safe choice
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=engine_main, args=(child_conn, hidden, n_layers, device),
                                daemon=True, name="weight-engine")
        self.proc.start()
        child_conn.close()
        self._finalizer = weakref.finalize(self, _stop, self.proc, self.conn)
        if not self.conn.poll(READY_TIMEOUT_S) or self.conn.recv_bytes() != b"ready":
            self.close()
            raise RuntimeError(f"the engine process did not start within {READY_TIMEOUT_S:g} s "
                               "(see its traceback above)")
        self.sender = WeightSender(self.conn)

    def update_ipc(self, weights) -> None:
        self.conn.send_bytes(b"ipc")
        self.sender.send(weights)

    def update_pickle(self, weights: dict[str, torch.Tensor]) -> None:
        self.conn.send_bytes(b"pickle")
        self.conn.send_bytes(pickle.dumps(weights, protocol=pickle.HIGHEST_PROTOCOL))
        self._reply()

    def checksums(self) -> dict[str, str]:
        self.conn.send_bytes(b"checksums")
        return msgspec.msgpack.decode(self._reply())

    def data_ptrs(self) -> dict[str, int]:
        self.conn.send_bytes(b"ptrs")
        return msgspec.msgpack.decode(self._reply())

    def _reply(self) -> bytes:
        if not self.conn.poll(REPLY_TIMEOUT_S):
            raise RuntimeError(f"the engine did not answer within {REPLY_TIMEOUT_S:g} s")
        return self.conn.recv_bytes()

    def close(self) -> None:
        if hasattr(self, "sender"):
            self.sender.close()
        self._finalizer()

    def __enter__(self) -> "EngineProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _stop(proc, conn) -> None:
    """Polite stop, then SIGTERM, then SIGKILL."""
    try:
        if proc.is_alive():
            conn.send_bytes(b"stop")
            conn.poll(5.0)
    except (OSError, EOFError):
        pass
    proc.join(5.0)
    if proc.is_alive():
        proc.terminate()
        proc.join(2.0)
    if proc.is_alive():
        proc.kill()
        proc.join()
    conn.close()
