"""LoadMeter.title: a plot made while the load check says BUSY says so in its title."""

from minivllm.bench import load as load_mod
from minivllm.bench.load import LoadMeter


def meter(others_cores: float) -> LoadMeter:
    m = LoadMeter()
    m.wall_s, m.own_cpu_s, m.load_before, m.load_after = 1.0, 0.5, 3.0, 3.0
    m.busy_cores = 0.5 + others_cores
    return m


def test_a_busy_run_is_marked_in_the_title_and_a_quiet_one_is_not():
    busy, quiet = meter(load_mod.QUIET_OTHERS_CORES + 1.0), meter(0.0)
    assert "BUSY" in busy.describe() and "BUSY" in busy.title("spin vs block")
    assert busy.title("spin vs block").startswith("spin vs block\nBUSY (other programs used 1.5 cores)")
    assert "BUSY" not in quiet.describe() and quiet.title("spin vs block") == "spin vs block"
