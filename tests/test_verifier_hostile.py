"""
Hostile inputs against the math verifier: no code runs, nothing crashes, and every call returns within its deadline,
whether it is made from the main thread, a worker thread, or a worker process (forked, spawned or daemonic).
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from dapo_trl.verifier import api, extract_answer, extract_gold_answer, score_completion, verify, verify_batch
from dapo_trl.verifier import pool as _verify_pool
from dapo_trl.verifier.pool import VerifierPool

TIMEOUT_S = 1.0
# Scheduling jitter on a loaded 2-core CI machine; the deadline itself is TIMEOUT_S.
BOUND_S = TIMEOUT_S + 1.0


def payloads(marker: str) -> list[str]:
    code = f"__import__('os').system('touch {marker}')"
    return [
        # Attempts to run code: Python, SymPy's parser, LaTeX primitives.
        code,
        f'eval("{code}")',
        f'exec(\'open("{marker}", "w")\')',
        f"\\text{{{code}}}",
        f"\\boxed{{{code}}}",
        f"\\input{{{marker}}}",
        f"\\include{{{marker}}}",
        f"\\immediate\\write18{{touch {marker}}}",
        f"\\def\\x{{{code}}}\\x",
        f"\\newcommand{{\\x}}{{{code}}}",
        f"Symbol('x').__class__.__init__.__globals__['os'].system('touch {marker}')",
        "lambda: __import__('os')",
        f"\\operatorname{{{code}}}(x)",
        f"x = {code}",
        # Values too large to compute.
        "9^{9^{9^{9}}}",
        "9^9^9^9",
        "1000000!",
        "(10^{9})!",
        "((10!)!)!",
        "\\binom{10^{9}}{10^{8}}",
        "\\Gamma(10^{9})",
        "(2^{3})^{(10^{20})}",
        "10^{10^{10}}",
        "2^{10^{6}}",
        "e^{e^{e^{e^{10}}}}",
        "x^{x^{x^{x^{x}}}}",
        "\\sin(10^{100})",
        # Deep nesting, huge and malformed strings.
        "(" * 5000 + "1" + ")" * 5000,
        "{" * 5000 + "1" + "}" * 5000,
        "\\sqrt{" * 3000 + "2" + "}" * 3000,
        "\\frac{1}{" * 2000 + "2" + "}" * 2000,
        "1" * 1_000_000,
        "x" * 1_000_000,
        "\\boxed{" * 100_000,
        "$" * 200_000,
        "Answer: " * 100_000,
        "1\x002",
        "\x00" * 1000,
        "\ud800\udfff\ud800",
        "\\frac{1}{0}",
        "0/0",
        "\\infty - \\infty",
        "\\lim_{x \\to 0} \\frac{1}{x}",
        "\\sum_{n=1}^{\\infty} n",
        "\\int_0^\\infty e^{x^2} dx",
        "+".join(["x"] * 400),
        "\\begin{pmatrix}" + "\\\\".join(["&".join(["x"] * 8)] * 8) + "\\end{pmatrix}",
        "",
        " ",
        "}",
        "\\",
    ]


def run_battery(marker: str, timeout_s: float = TIMEOUT_S, bound_s: float = BOUND_S) -> list[str]:
    """Calls every public entry point on every payload; returns a description of each failure."""
    failures = []
    calls = [
        ("verify(gold, payload)", lambda p: verify("x + 1", p, timeout_s=timeout_s), (bool,)),
        ("verify(payload, gold)", lambda p: verify(p, "1", timeout_s=timeout_s), (bool,)),
        ("score(answer line)", lambda p: score_completion(f"Answer: ${p}$", "2", timeout_s=timeout_s), (bool,)),
        ("score(boxed, gold)", lambda p: score_completion(f"\\boxed{{{p}}}", p, timeout_s=timeout_s), (bool, type(None))),
        ("extract_answer", extract_answer, (str, type(None))),
        ("extract_answer(lenient)", lambda p: extract_answer(p, extraction="lenient"), (str, type(None))),
        ("score(lenient)", lambda p: score_completion(p, "2", timeout_s=timeout_s, extraction="lenient"), (bool,)),
        ("score(dapo rule)", lambda p: score_completion(f"Answer: {p}", "2", rule="dapo"), (bool,)),
        ("extract_gold_answer", extract_gold_answer, (str, type(None))),
    ]  # fmt: skip
    for payload in payloads(marker):
        for name, call, types in calls:
            start = time.monotonic()
            try:
                result = call(payload)
            except Exception as error:  # the test is that nothing raises
                failures.append(f"{name}({payload[:40]!r}) raised {error!r}")
                continue
            elapsed = time.monotonic() - start
            if elapsed > bound_s:
                failures.append(f"{name}({payload[:40]!r}) took {elapsed:.2f} s")
            if not isinstance(result, types):
                failures.append(f"{name}({payload[:40]!r}) returned {result!r}")
    batch = [p for p in payloads(marker) if len(p) < 10_000]
    start = time.monotonic()
    verdicts = verify_batch(["x + 1"] * len(batch), batch, timeout_s=timeout_s, num_workers=2)
    if time.monotonic() - start > bound_s * 3 or any(verdicts):
        failures.append(f"verify_batch took {time.monotonic() - start:.2f} s and returned {verdicts}")
    if os.path.exists(marker):
        failures.append(f"a payload created {marker}")
    return failures


def _battery_in_child(marker: str, queue) -> None:
    api.warm_up(2)  # this process's own pool; its cold start is not part of any answer's deadline
    failures = run_battery(marker)
    failures += [] if verify("\\sqrt{8}", "2\\sqrt{2}") else ["symbolic comparison failed in the child"]
    api.shutdown_workers()
    queue.put(failures)


def _symbolic_in_daemon() -> bool:
    return verify("(x+1)^2", "x^2+2x+1") and not verify("\\sqrt{2}", "1.414")


@pytest.fixture(scope="module", autouse=True)
def _pool():
    api.warm_up(2)
    yield
    api.shutdown_workers()


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "pwned"
    yield str(path)
    assert not path.exists(), "a payload ran code"


def test_main_thread(marker):
    assert run_battery(marker) == []


def test_worker_thread(marker):
    results = []
    thread = threading.Thread(target=lambda: results.append(run_battery(marker)))
    thread.start()
    thread.join(timeout=120)
    assert results == [[]]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_process(marker, method):
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {method} start method here")
    assert verify("\\sqrt{8}", "2\\sqrt{2}")  # the parent's pool is live while the child runs
    parent_pids = _verify_pool.get_pool().pids()
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    process = context.Process(target=_battery_in_child, args=(marker, queue))
    process.start()
    failures = queue.get(timeout=180)
    process.join(timeout=30)
    assert failures == []
    assert process.exitcode == 0
    # A forked child forgets its parent's workers instead of using or killing them.
    assert _verify_pool.get_pool().pids()[:1] == parent_pids[:1]
    assert verify("(x+1)^2", "x^2+2x+1")


def test_daemonic_pool_worker():
    # multiprocessing.Pool workers are daemonic and may not start multiprocessing children; ours are subprocesses.
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_symbolic_in_daemon)


PLANTED = """
import time

from dapo_trl.verifier.symbolic import symbolic_equivalent


def compare(gold, pred):
    if "slow" in pred:
        time.sleep(120)
    return symbolic_equivalent(gold, pred)
"""


@pytest.fixture(scope="module")
def planted_pool(tmp_path_factory):
    path = tmp_path_factory.mktemp("planted")
    (path / "planted_slow.py").write_text(PLANTED)
    pool = VerifierPool(entry=("planted_slow", "compare"), python_path=str(path))
    yield pool
    pool.close()


@pytest.fixture
def slow_pool(planted_pool, monkeypatch):
    planted_pool.warm_up(1)
    planted_pool.timeouts = 0
    monkeypatch.setattr(_verify_pool, "_POOL", planted_pool)
    return planted_pool


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # an exited process whose parent has not reaped it yet (a zombie) is gone for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _assert_pid_gone(pid: int, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} is still alive")


@pytest.mark.parametrize("where", ["main thread", "worker thread"])
def test_timeout_fires_on_a_planted_slow_comparator(slow_pool, where):
    zygote, *_, worker = slow_pool.pids()  # the idle worker that takes the next call
    results = []

    def call():
        start = time.monotonic()
        results.append((verify("x + 1", "slow + x", timeout_s=TIMEOUT_S), time.monotonic() - start))

    if where == "main thread":
        call()
    else:
        thread = threading.Thread(target=call)
        thread.start()
        thread.join(timeout=60)
    [(verdict, elapsed)] = results
    assert verdict is False
    assert TIMEOUT_S <= elapsed <= BOUND_S, f"returned after {elapsed:.2f} s"
    assert slow_pool.timeouts == 1
    _assert_pid_gone(worker)  # the stuck worker was killed, not left running
    # Its replacement serves the next comparison, within the same bound.
    start = time.monotonic()
    assert verify("\\sqrt{8}", "2\\sqrt{2}", timeout_s=TIMEOUT_S)
    assert time.monotonic() - start <= BOUND_S
    assert slow_pool.pids()[0] == zygote


def test_batch_with_a_slow_row_keeps_the_others(slow_pool):
    golds = ["x + 1", "\\sqrt{8}", "x^2-1", "7"]
    predictions = ["slow + x", "2\\sqrt{2}", "(x-1)(x+1)", "7"]
    start = time.monotonic()
    assert verify_batch(golds, predictions, timeout_s=TIMEOUT_S, num_workers=2) == [False, True, True, True]
    assert time.monotonic() - start <= BOUND_S + TIMEOUT_S


def test_shutdown_leaves_no_processes():
    pool = _verify_pool.get_pool(2)
    pool.warm_up(2)
    pids = pool.pids()
    assert len(pids) == 3  # the zygote and two workers
    api.shutdown_workers()
    for pid in pids:
        _assert_pid_gone(pid)
    assert _verify_pool._POOL is None
    assert verify("\\sqrt{8}", "2\\sqrt{2}")  # and it restarts lazily


def test_pool_outlives_preemption_signals():
    """SLURM signals every process of a job step: the pool must keep scoring while the caller finishes its rollout."""
    pool = _verify_pool.get_pool(1)
    pool.warm_up(1)
    pids = pool.pids()
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGUSR1)
    time.sleep(0.5)
    assert all(_alive(pid) for pid in pids)
    assert pool.pids() == pids and verify("\\sqrt{8}", "2\\sqrt{2}", timeout_s=30)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux-only")
def test_workers_die_with_a_killed_caller(tmp_path):
    """If the training process is SIGKILLed (no atexit), the zygote and the workers still go away."""
    script = tmp_path / "caller.py"
    script.write_text(
        "import sys, time\n"
        "from dapo_trl.verifier import pool as _verify_pool\n"
        "pool = _verify_pool.get_pool(2)\n"
        "pool.warm_up(2)\n"
        "print(*pool.pids(), flush=True)\n"
        "time.sleep(120)\n"
    )
    caller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in caller.stdout.readline().split()]
    assert len(pids) == 3
    caller.kill()
    caller.wait()
    for pid in pids:
        _assert_pid_gone(pid)


# ------------------------------------------------------------------------------------------- undefined values
UNDEFINED = [
    # Zero denominators: both sides are complex infinity, which must not make them equal.
    (r"\frac{1}{0}", r"\frac{2}{0}"),
    ("1/0", "2/0"),
    (r"5 \div 0", r"6 \div 0"),
    (r"\frac{\sqrt{2}}{0}", r"\frac{\sqrt{3}}{0}"),
    (r"\frac{1}{1-1}", r"\frac{5}{2-2}"),
    (r"\frac{1}{\sqrt{2}-\sqrt{2}}", r"\frac{2}{\sqrt{3}-\sqrt{3}}"),
    (r"\frac{x}{x-x}", r"\frac{y}{y-y}"),
    ("12:00", "1:00"),  # a time or ratio, never a division
    # zoo and nan from functions and arithmetic, including the very same undefined expression on both sides.
    (r"\frac{1}{1-1}", r"\frac{1}{1-1}"),
    ("0/0", "0/0"),
    (r"\frac{0}{0}", "1"),
    (r"\log 0", r"\log 0"),
    (r"\ln 0", r"\frac{1}{0}"),
    (r"0^{-1}", r"0^{-1}"),
    (r"\tan\frac{\pi}{2}", r"\tan\frac{\pi}{2}"),
    (r"\cot 0", r"\frac{1}{0}"),
    (r"\infty - \infty", "0"),
    (r"\infty - \infty", r"\infty - \infty"),
    (r"\infty \cdot 0", "0"),
    # oo is a value only on its own.
    (r"\infty + 1", r"\infty"),
    (r"\infty", r"-\infty"),
    (r"\frac{1}{0}", r"\infty"),
    (r"\text{undefined}", r"\frac{1}{0}"),
    (r"(\frac{1}{0}, 2)", r"(\frac{2}{0}, 2)"),
]


@pytest.mark.parametrize("gold, pred", UNDEFINED)
def test_undefined_values_equal_nothing(gold, pred):
    assert verify(gold, pred, timeout_s=TIMEOUT_S) is False
    assert verify(pred, gold, timeout_s=TIMEOUT_S) is False


@pytest.mark.parametrize(
    "gold, pred",
    [(r"\infty", r"\infty"), (r"-\infty", r"-\infty"), (r"(3, \infty)", r"(3,\infty)"), (r"\tan 1", r"\tan 1")],
)
def test_infinity_and_defined_functions_still_compare(gold, pred):
    assert verify(gold, pred, timeout_s=TIMEOUT_S) is True


@pytest.mark.parametrize(
    "gold",
    [
        None,
        "",
        "   ",
        "???",
        "...",
        r"\sqrt",
        r"\frac{1}",
        "2+",
        "x^{}",
        r"\frac{1}{0}",
        "0/0",
        "NaN",
        "nan",
        "-inf",
        "Infinity",
        r"\text{NaN}",
        "x + NaN",
        r"\begin{pmatrix}1\\2",
        r"\begin{pmatrix}1\\2\end{bmatrix}",
        r"\end{pmatrix}",
        ["1", "2"],
        [],
        {"a": 1},
        b"1",
    ],
)
def test_unusable_golds_are_skipped_not_matched_against_the_same_junk(gold):
    assert extract_gold_answer(gold) is None
    text = gold.decode() if isinstance(gold, bytes) else gold if isinstance(gold, str) else str(gold)
    for completion in (f"Answer: {text}", f"\\boxed{{{text}}}", text):
        assert score_completion(completion, gold, timeout_s=TIMEOUT_S) is None
        assert score_completion(completion, gold, timeout_s=TIMEOUT_S, rule="dapo") is None


@pytest.mark.parametrize("gold", [["7"], ("7",), [["7"]], 7, 7.0])
def test_single_value_containers_are_unwrapped(gold):
    assert extract_gold_answer(gold) == "7"
    assert score_completion("Answer: 7", gold) is True
    assert score_completion("Answer: ['7']", gold) is False


# ------------------------------------------------------------------------------------------------ API misuse
@pytest.mark.parametrize(
    "completion, hint",
    [
        (b"Answer: 3", "Decode it"),
        (None, "got NoneType"),
        ({"role": "assistant", "content": "Answer: 3"}, "chat message"),
        (["Answer: 3"], "conversation"),
        (3, "got int"),
    ],
)
def test_a_completion_of_the_wrong_type_is_named(completion, hint):
    with pytest.raises(TypeError, match=rf"score_completion: `completion_text` must be a str.*{hint}"):
        score_completion(completion, "3")
    with pytest.raises(TypeError, match="extract_answer: `text`"):
        extract_answer(completion)
    with pytest.raises(TypeError, match="verify: `predicted`"):
        verify("3", completion)
    with pytest.raises(TypeError, match=r"verify_batch: `predictions\[1\]`"):
        verify_batch(["3", "3"], ["3", completion])


@pytest.mark.parametrize("timeout_s", [float("nan"), -1.0, 0, float("inf"), "3", True, None])
def test_a_bad_deadline_is_refused_by_name_and_later_calls_are_unharmed(timeout_s):
    for call in (
        lambda: verify(r"\sqrt{8}", r"2\sqrt{2}", timeout_s=timeout_s),
        lambda: score_completion(r"Answer: $2\sqrt{2}$", r"\sqrt{8}", timeout_s=timeout_s),
        lambda: verify_batch([r"\sqrt{8}"], [r"2\sqrt{2}"], timeout_s=timeout_s),
        lambda: _verify_pool.get_pool().compare(r"\sqrt{8}", r"2\sqrt{2}", timeout_s),
    ):
        with pytest.raises((ValueError, TypeError), match="timeout_s"):
            call()
    for _ in range(3):  # the pool answers correctly and quickly right after, every time
        start = time.monotonic()
        assert verify(r"\sqrt{8}", r"2\sqrt{2}", timeout_s=TIMEOUT_S) is True
        assert time.monotonic() - start <= BOUND_S


def test_an_error_inside_a_comparison_does_not_cost_the_pool_a_worker(monkeypatch):
    pool = _verify_pool.get_pool(2)
    pool.warm_up(2)
    calls = []

    def failing_ask(self, gold, pred, deadline):
        calls.append(gold)
        raise KeyboardInterrupt  # anything at all, raised while a worker is out of the pool

    with monkeypatch.context() as patch:
        patch.setattr(_verify_pool._Worker, "ask", failing_ask)
        for _ in range(3):
            with pytest.raises(KeyboardInterrupt):
                verify(r"\sqrt{8}", r"2\sqrt{2}", timeout_s=TIMEOUT_S)
    assert len(calls) == 3
    for _ in range(3):
        start = time.monotonic()
        assert verify(r"\sqrt{8}", r"2\sqrt{2}", timeout_s=TIMEOUT_S) is True
        assert time.monotonic() - start <= BOUND_S
    assert pool._size <= pool._max
