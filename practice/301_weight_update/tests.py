"""The judge's tests for exercise 301. Each receives the learner's module as `impl`."""

from __future__ import annotations

import os

import torch

from minivllm.judge.api import Fail, check_equal, learner_frame, step, test


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
    ids = {n: (id(t), t.data_ptr()) for n, t in target.items()}
    step(f"apply_update(target, update): {what}")
    try:
        impl.apply_update(target, update)
    except impl.WeightMismatchError as exc:
        message = str(exc)
    except (ValueError, TypeError, KeyError, RuntimeError) as exc:
        line = learner_frame(exc.__traceback__, os.path.dirname(impl.__file__))
        raise Fail(f"apply_update raised {type(exc).__name__} for {what}" + (
                   f", in {line}" if line else "") + ": a misfit raises the starter's "
                   "WeightMismatchError (and changes nothing)",
                   expected="WeightMismatchError", got=f"{type(exc).__name__}: {exc}",
                   input=what) from None
    else:
        raise Fail(f"apply_update accepted {what}: it must raise WeightMismatchError",
                   input=what)
    changed = [n for n in target if not torch.equal(target[n], before[n])]
    if changed:
        raise Fail("a rejected update changed the engine's weights: validate every tensor before "
                   "writing any", expected="no tensor changed", got=f"changed: {changed}", input=what)
    rebound = [n for n, t in target.items() if (id(t), t.data_ptr()) != ids[n]]
    if rebound:
        raise Fail("a rejected update left other tensors in target than the engine's: the values "
                   "are back, but target's entries were rebound (or their memory swapped), and "
                   "the code that holds the old tensors sees whatever was written into them",
                   expected="the same tensor objects and data_ptr", got=f"rebound: {rebound}",
                   input=what)
    return message


def check_in_place(impl, device: str) -> None:
    target = engine(device)
    fused = torch.zeros(4, 8, device=device)  # a fused kv weight; the engine holds its halves
    target["layers.0.k_proj.weight"] = fused[:, :4]  # non-contiguous views of it
    target["layers.0.v_proj.weight"] = fused[:, 4:]
    update = dict(reversed(trainer(device).items()))  # another order than the engine's
    update["layers.0.v_proj.weight"] = torch.arange(16.0, device=device).reshape(4, 4)
    update.pop("embed.weight")  # a partial update: embed.weight stays as it is
    ids = {n: (id(t), t.data_ptr()) for n, t in target.items()}
    before = snapshot(target)
    where = f"update {list(update)} (engine's order: {list(target)}), on {device}"
    step(f"apply_update(target, {where})")
    try:
        names = impl.apply_update(target, update)
    except RuntimeError as e:
        raise Fail(f"apply_update raised RuntimeError: {e}. The engine's parameters require grad: "
                   "write them inside torch.no_grad()", input=where) from None
    check_equal(names, list(update), "the returned names (in the update's order)", where)
    for n in target:
        if isinstance(target[n], torch.nn.Parameter) and not target[n].requires_grad:
            raise Fail(f"target[{n!r}] no longer requires grad: write under torch.no_grad() "
                       "and leave the engine's Parameters as they were", input=where)
        if (id(target[n]), target[n].data_ptr()) != ids[n]:
            raise Fail(f"target[{n!r}] is a new tensor: write into the engine's tensor in place "
                       "(copy_), because other code holds it and its memory",
                       expected="the same tensor object and data_ptr", got="a different one",
                       input=where)
        want = update[n] if n in update else before[n]
        if n in update and not target[n].is_contiguous() and not torch.equal(target[n], want):
            raise Fail(f"target[{n!r}], a non-contiguous view of a fused tensor, did not receive "
                       "the update: copy into the view itself (copy_), not into a reshaped copy "
                       "of it", input=where)
        if not torch.equal(target[n], want):
            raise Fail(f"target[{n!r}] does not hold the update's values" if n in update else
                       f"target[{n!r}] changed although the update does not name it", input=where)


@test(input="4 engine tensors (Parameters) and 2 non-contiguous views of a fused kv weight; "
      "a partial update in another order; on CUDA too where there is a GPU")
def copies_in_place(impl):
    check_in_place(impl, "cpu")
    if torch.cuda.is_available():
        check_in_place(impl, "cuda")
        torch.cuda.synchronize()


@test(input="'layers.0.q_proj.weight', the update's first tensor, arrives as [4, 2] where the "
      "engine has [4, 4]")
def shape_mismatch_is_named(impl):
    update = {"layers.0.q_proj.weight": torch.ones(4, 2), **trainer()}
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


@test(input="'layers.0.norm' arrives as float64; the engine's is float32. Then a bfloat16 "
      "update for a float16 weight (the same 2 bytes an element, another format), and an int8 "
      "update for a float32 weight")
def dtype_mismatch(impl):
    update = trainer()
    update["layers.0.norm"] = update["layers.0.norm"].double()
    message = expect_mismatch(impl, engine(), update, "a float64 update for a float32 weight")
    for part in ("layers.0.norm", "float64", "float32"):
        if part not in message:
            raise Fail(f"the error message must name the tensor and both dtypes; {part!r} is "
                       "missing", got=message)
    target = {"w": torch.zeros(2, 4, dtype=torch.float16)}
    expect_mismatch(impl, target, {"w": torch.ones(2, 4, dtype=torch.bfloat16)},
                    "a bfloat16 update for a float16 weight (same element size: compare dtypes)")
    expect_mismatch(impl, {"w": torch.zeros(2, 4)}, {"w": torch.ones(2, 4, dtype=torch.int8)},
                    "an int8 update for a float32 weight (a quantized checkpoint: compare every "
                    "dtype, not only floating ones)")


@test(input="an update with 'layers.1.q_proj.weight', which the engine does not have")
def unknown_name(impl):
    update = trainer()
    update["layers.1.q_proj.weight"] = torch.ones(4, 4)
    message = expect_mismatch(impl, engine(), update, "an update with an unknown name")
    if "layers.1.q_proj.weight" not in message:
        raise Fail("the error message must name the unknown tensor", got=message)


@test(input="a [4] update for a [2, 4] weight (copy_ would broadcast it without complaint); a "
      "transposed [4, 2] update for a [2, 4] weight (same size); a [2, 4, 1] for a [2, 4]")
def broadcastable_shapes_are_still_a_mismatch(impl):
    target = {"w": torch.zeros(2, 4)}
    message = expect_mismatch(impl, target, {"w": torch.ones(4)}, "a [4] update for a [2, 4] weight")
    if "[2, 4]" not in message or "[4]" not in message:
        raise Fail("the error message must give both shapes", got=message)
    for shape in ((4, 2), (2, 4, 1)):
        update = {"w": torch.arange(8.0).reshape(shape)}
        what = f"a {list(shape)} update for a [2, 4] weight (the same 8 elements)"
        message = expect_mismatch(impl, {"w": torch.zeros(2, 4)}, update, what)
        if str(list(shape)) not in message:
            raise Fail("the error message must give both shapes", got=message, input=what)


@test(input="one update with four misfits, in another order than the engine's: an unknown "
      "'layers.9.mlp', 'lm_head.weight' as float16, 'embed.weight' as [4, 6], "
      "'layers.0.q_proj.weight' as [4, 2] (two of the same kind)")
def every_misfit_named(impl):
    update = trainer()
    update = {"layers.9.mlp": torch.ones(2), "lm_head.weight": update["lm_head.weight"].half(),
              "layers.0.norm": update["layers.0.norm"], "embed.weight": torch.ones(4, 6),
              "layers.0.q_proj.weight": torch.ones(4, 2)}
    message = expect_mismatch(impl, engine(), update, "four misfits")
    for part in ("layers.9.mlp", "lm_head.weight", "float16", "embed.weight", "[6, 4]", "[4, 6]",
                 "layers.0.q_proj.weight", "[4, 2]"):
        if part not in message:
            raise Fail(f"the error message must name every misfit tensor with its shapes or "
                       f"dtypes, not only the first; {part!r} is missing", got=message,
                       input="misfits: layers.9.mlp (unknown), lm_head.weight (float16), "
                             "embed.weight ([4, 6]), layers.0.q_proj.weight ([4, 2])")
