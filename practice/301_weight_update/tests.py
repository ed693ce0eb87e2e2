"""The judge's tests for exercise 301. Each receives the learner's module as `impl`."""

from __future__ import annotations

import torch

from minivllm.judge.api import Fail, check_equal, test


def engine(device: str = "cpu") -> dict[str, torch.Tensor]:
    """A small engine's weights: parameters, as named_parameters() would give them."""
    return {"embed.weight": torch.nn.Parameter(torch.zeros(6, 4, device=device)),
            "layers.0.q_proj.weight": torch.nn.Parameter(torch.zeros(4, 4, device=device)),
            "layers.0.norm": torch.nn.Parameter(torch.ones(4, device=device)),
            "lm_head.weight": torch.nn.Parameter(torch.zeros(6, 4, device=device))}


def trainer(device: str = "cpu", seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(t.shape, generator=gen).to(device) for name, t in engine().items()}


def snapshot(weights):
    return {name: t.detach().clone() for name, t in weights.items()}


def expect_mismatch(impl, target, update, what: str) -> str:
    before = snapshot(target)
    try:
        impl.apply_update(target, update)
    except impl.WeightMismatchError as exc:
        message = str(exc)
    else:
        raise Fail(f"apply_update accepted {what}: it must raise WeightMismatchError",
                   input=what)
    changed = [n for n in target if not torch.equal(target[n], before[n])]
    if changed:
        raise Fail("a rejected update changed the engine's weights: validate every tensor before "
                   "writing any", expected="no tensor changed", got=f"changed: {changed}", input=what)
    return message


def check_in_place(impl, device: str) -> None:
    target, update = engine(device), trainer(device)
    ids = {n: (id(t), t.data_ptr()) for n, t in target.items()}
    names = impl.apply_update(target, update)
    check_equal(names, list(update), "the returned names")
    for n in update:
        if (id(target[n]), target[n].data_ptr()) != ids[n]:
            raise Fail(f"target[{n!r}] is a new tensor: write into the engine's tensor in place "
                       "(copy_), because other code holds it and its memory",
                       expected="the same tensor object and data_ptr", got="a different one")
        if not torch.equal(target[n], update[n]):
            raise Fail(f"target[{n!r}] does not hold the update's values", input="4 tensors")


@test(input="4 matching tensors (an embedding, a projection, a norm, an lm head)")
def copies_in_place(impl):
    check_in_place(impl, "cpu")


@test(input="'layers.0.q_proj.weight' arrives as [4, 2] where the engine has [4, 4]")
def shape_mismatch_is_named(impl):
    update = trainer()
    update["layers.0.q_proj.weight"] = torch.ones(4, 2)
    message = expect_mismatch(impl, engine(), update, "a [4, 2] update for a [4, 4] weight")
    for part in ("layers.0.q_proj.weight", "[4, 4]", "[4, 2]"):
        if part not in message:
            raise Fail(f"the error message must name the tensor and both shapes; {part!r} is missing",
                       got=message)


@test(input="3 tensors fit; the last one, 'lm_head.weight', is [6, 5] instead of [6, 4]")
def all_or_nothing(impl):
    update = trainer()
    update["lm_head.weight"] = torch.ones(6, 5)
    expect_mismatch(impl, engine(), update, "an update whose last tensor misfits")


@test(input="'layers.0.norm' arrives as float64; the engine's is float32")
def dtype_mismatch(impl):
    update = trainer()
    update["layers.0.norm"] = update["layers.0.norm"].double()
    message = expect_mismatch(impl, engine(), update, "a float64 update for a float32 weight")
    if "layers.0.norm" not in message or "float64" not in message:
        raise Fail("the error message must name the tensor and both dtypes", got=message)


@test(input="an update with 'layers.1.q_proj.weight', which the engine does not have")
def unknown_name(impl):
    update = trainer()
    update["layers.1.q_proj.weight"] = torch.ones(4, 4)
    message = expect_mismatch(impl, engine(), update, "an update with an unknown name")
    if "layers.1.q_proj.weight" not in message:
        raise Fail("the error message must name the unknown tensor", got=message)


@test(input="a [4] update for a [2, 4] weight: copy_ would broadcast it without complaint")
def broadcastable_shapes_are_still_a_mismatch(impl):
    target = {"w": torch.zeros(2, 4)}
    message = expect_mismatch(impl, target, {"w": torch.ones(4)}, "a [4] update for a [2, 4] weight")
    if "[2, 4]" not in message or "[4]" not in message:
        raise Fail("the error message must give both shapes", got=message)


@test(input="the same 4 tensors on the GPU", requires=("cuda",))
def cuda_in_place(impl):
    check_in_place(impl, "cuda")
    torch.cuda.synchronize()
