"""`released_process_group`: gloo's threads are gone before interpreter exit, after a return or a SystemExit.

Each case runs in its own interpreter: a one-process gloo group and a DistributedDataParallel model held, as a trainer
holds it, in a reference cycle that `main()` leaves behind.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from _tiny import live_gloo_threads
    from dapo_trl import released_process_group

    def main(ending):
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        holder = {{"model": torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))}}
        holder["self"] = holder  # a cycle, as a trainer and its callbacks form one
        dist.destroy_process_group()  # what Accelerator.end_training() does: the group is only unregistered
        print(json.dumps({{"after_destroy": live_gloo_threads()}}), flush=True)
        if ending == "exit":
            sys.exit(75)  # a preemption stop
        if ending == "error":
            raise RuntimeError("a failing run")

    ending = sys.argv[1]
    try:
        with released_process_group():
            main(ending)
    finally:
        print(json.dumps({{"at_exit": live_gloo_threads()}}), flush=True)
    """
)


def run(ending: str) -> tuple[int, dict]:
    code = SCRIPT.format(tests=TESTS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", code, ending], capture_output=True, text=True, timeout=120, env=env)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 2, result.stdout + result.stderr
    return result.returncode, {**lines[0], **lines[1]}


@pytest.mark.parametrize(("ending", "code"), [("return", 0), ("exit", 75)])
def test_the_group_is_freed_before_exit_and_the_exit_code_kept(ending, code):
    returncode, threads = run(ending)
    assert threads["after_destroy"], "the premise: a destroyed group's gloo threads live on while the model does"
    assert threads["at_exit"] == [], threads
    assert returncode == code


def test_another_exception_propagates_and_leaves_the_group_alone():
    returncode, threads = run("error")
    assert returncode == 1
    assert threads["at_exit"] == threads["after_destroy"] != []  # no release on a failing run's way out
