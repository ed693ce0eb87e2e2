"""`judge.py 213 --in-engine`: the reference solution's ring carries a TP=3 engine's traffic and
gives the reference ring's output; a known-wrong variant that breaks the engine is reported as
such, with what went wrong."""

from minivllm.judge import exercise, in_engine


def test_solution_passes_in_the_engine(capsys):
    assert in_engine.grade(str(exercise.find("213").solution))
    assert "PASS" in capsys.readouterr().out


def test_a_reader_that_wraps_one_chunk_late_is_reported(tmp_path, capsys):
    ex = exercise.find("213")
    variant = next(v for v in ex.variants() if v.name.startswith("off-by-one slot index"))
    path = tmp_path / "ring_buffer.py"
    path.write_text(variant.apply(ex.solution.read_text()))
    assert not in_engine.grade(str(path))
    out = capsys.readouterr().out
    assert "FAIL" in out and ("the engine failed" in out or "differed" in out), out
