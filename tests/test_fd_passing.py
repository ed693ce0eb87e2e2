"""demos/fd_passing: a descriptor sent as SCM_RIGHTS names the same file in the child (never timings)."""

from minivllm.demos import fd_passing


def test_the_child_reads_the_same_file_through_the_passed_descriptor():
    rows = fd_passing.measure([4096, 1 << 20], repeats=2)
    assert [r["size"] for r in rows] == [4096, 1 << 20]
    for r in rows:  # measure() checks the byte the child read; here: same inode, both paths timed
        assert r["same_file"], f"the child's descriptor names another file at {r['size']} B"
        assert r["bytes_ms"] > 0 and r["fd_ms"] > 0
