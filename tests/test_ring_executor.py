"""The demo executor of chapter 05: a worker that dies is named by its rank in the error."""

import numpy as np
import pytest

from minivllm.demos.ring_executor import DemoExecutor


def test_a_killed_worker_is_named_by_its_rank():
    with DemoExecutor(world_size=2) as executor:
        executor.execute(0, np.arange(8, dtype=np.int32))
        executor.procs[1].kill()
        executor.procs[1].join()
        with pytest.raises(TimeoutError, match=r"^worker 1 sent no reply .*dead, exit code -9"):
            executor.execute(1, np.arange(8, dtype=np.int32), timeout=1.0)
