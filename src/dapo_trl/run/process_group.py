"""The end of a distributed run: free the process group while the interpreter is whole.

`torch.distributed.destroy_process_group()` (what `Accelerator.end_training()` calls) only unregisters the group. The
trainer's DistributedDataParallel wrapper still holds its backend, and on CPU that is gloo, whose worker threads
(`pt_gloo_runloop`, `gloo_tcp_loop`) then live as long as the trainer. The trainer sits in reference cycles, so it is
freed during interpreter exit, and there gloo sometimes aborts a process that has finished and saved (SIGABRT,
"terminate called without an active exception"): the launcher reports the run as failed, and a preempted process
loses its exit code 75. Collecting the cycles once the trainer is out of scope frees the backend, and joins its
threads, before exit begins.
"""

import gc
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["release_process_group", "released_process_group"]


def release_process_group() -> None:
    """
    Destroy the process group (if one is initialized) and collect the reference cycles that keep its backend alive.

    Call it once every process has saved and nothing collective follows, after the trainer is out of scope (after
    `main()` returns); [`released_process_group`] does that around `main()`. A trainer still reachable (a module-level
    `trainer = ...`) keeps the backend, and its threads, until interpreter exit. Safe to call in a single process or
    without `torch.distributed`.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


@contextmanager
def released_process_group() -> Iterator[None]:
    """
    Run a script's body, then [`release_process_group`]: when the body returns, and when it stops with `SystemExit`
    (a preemption stop exits 75, Ctrl-C 130), whose exit code is kept. Any other exception propagates untouched, with
    the group left as it is (a failing run may have left it mid-collective).

    Example:

    ```python
    if __name__ == "__main__":
        with released_process_group():
            main()  # builds, trains and saves the DAPOTrainer
    ```
    """
    try:
        yield
    except SystemExit as stop:
        # The traceback's frames hold main()'s locals (the trainer): clear them, or the collection cannot free it.
        traceback.clear_frames(stop.__traceback__)
        release_process_group()
        raise
    release_process_group()
