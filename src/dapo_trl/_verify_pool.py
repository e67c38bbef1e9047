"""
A small pool of verifier worker processes with a hard per-call deadline.

Why processes: SymPy on an untrusted expression can spend minutes inside one C-level big-integer operation, and
neither a signal (main thread only, which is why TRL turns math-verify's timeouts off in worker threads) nor a thread
can stop it. A process can always be killed, from any thread, so the deadline holds everywhere.

How:
- One *zygote* process is started with `subprocess` (so it works under fork, spawn or forkserver parents, inside
  daemonic processes, and never re-imports the user's `__main__`). It imports SymPy, warms up the LaTeX parser, then
  forks a worker whenever asked: a new worker is ready in milliseconds, so a worker killed on a timeout is replaced
  at once, and the replacement's start counts against the next answer's deadline like any other work.
- The zygote imports only this package's pure modules, not `dapo_trl/__init__` (which may pull in torch).
- Each worker talks to the caller over its own socket, one JSON request and one `0`/`1` line at a time.
- Cleanup: the caller's `atexit` stops the zygote, which kills its workers; if the caller dies hard, the zygote
  sees its control socket close and does the same, and on Linux workers also die with the zygote (`PR_SET_PDEATHSIG`).
  A forked caller child forgets its parent's pool (`os.register_at_fork`) and starts its own when it needs one.
- The first symbolic comparison in a process waits for the zygote to start (~2 s, once; `warm_up()` does it ahead).
  That wait is bounded by `STARTUP_TIMEOUT_S` and not charged to the answer's own deadline.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 60.0
_PACKAGE_DIR = Path(__file__).resolve().parent
_DEFAULT_ENTRY = ("dapo_trl.math_symbolic", "symbolic_equivalent")
# A stub package module pointing at our directory loads dapo_trl's submodules without running dapo_trl/__init__.py.
_BOOT = (
    "import sys, types; pkg = types.ModuleType('dapo_trl'); pkg.__path__ = [sys.argv[1]]; "
    "sys.modules['dapo_trl'] = pkg; from dapo_trl._verify_pool import zygote_main; zygote_main(*sys.argv[2:])"
)


class _Worker:
    def __init__(self, sock: socket.socket, pid: int):
        self.sock, self.pid = sock, pid
        self._buffer = b""

    def ask(self, gold: str, pred: str, deadline: float) -> bool | None:
        try:
            self.sock.sendall(json.dumps({"g": gold, "p": pred}).encode() + b"\n")
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([self.sock], [], [], remaining)[0]:
                    return None
                chunk = self.sock.recv(4096)
                if not chunk:  # the worker died (memory limit, crash)
                    return None
                self._buffer += chunk
        except OSError:
            return None
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line == b"1"


class VerifierPool:
    """Thread-safe pool of worker processes; `compare` returns `None` when the deadline passes."""

    def __init__(self, *, entry: tuple[str, str] = _DEFAULT_ENTRY, python_path: str | None = None):
        self._entry, self._python_path = entry, python_path
        self._cond = threading.Condition()
        self._ctrl_lock = threading.Lock()
        self._zygote: subprocess.Popen | None = None
        self._ctrl: socket.socket | None = None
        self._idle: list[_Worker] = []
        self._size = 0  # idle + busy workers
        self._max = 1
        self._failed_at = -float("inf")
        self._started = False
        self.timeouts = 0

    # ------------------------------------------------------------------------------------------------- zygote
    def _start_zygote(self) -> None:
        if time.monotonic() - self._failed_at < STARTUP_TIMEOUT_S:
            raise OSError("the worker pool failed to start recently; not retrying yet")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        if self._python_path:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [self._python_path, env.get("PYTHONPATH")]))
        args = [str(_PACKAGE_DIR), str(theirs.fileno()), *self._entry]
        self._zygote = subprocess.Popen(
            [sys.executable, "-c", _BOOT, *args], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env
        )
        theirs.close()
        ours.settimeout(STARTUP_TIMEOUT_S)
        try:
            if ours.recv(64) != b"ready":
                raise OSError("the zygote exited during start-up")
        except OSError:
            ours.close()
            self._zygote.kill()
            self._zygote.wait()
            self._zygote = None
            self._failed_at = time.monotonic()
            raise
        self._ctrl = ours
        self._started = True

    def _spawn(self) -> _Worker | None:
        with self._ctrl_lock:
            try:
                if self._zygote is None or self._zygote.poll() is not None:
                    self._start_zygote()
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    self._ctrl.settimeout(10.0)
                    socket.send_fds(self._ctrl, [b"spawn"], [theirs.fileno()])
                    pid = int(self._ctrl.recv(64))
                finally:
                    theirs.close()
            except (OSError, ValueError) as error:
                logger.error("Could not start a math-verifier worker process: %s", error)
                return None
        return _Worker(ours, pid)

    def _kill(self, worker: _Worker) -> None:
        worker.sock.close()
        with self._ctrl_lock:
            try:
                # The zygote is the worker's parent: only it can kill and reap without a pid-reuse race.
                self._ctrl.send(b"kill %d" % worker.pid)
            except (OSError, AttributeError):
                pass

    # --------------------------------------------------------------------------------------------------- pool
    def resize(self, num_workers: int) -> None:
        with self._cond:
            self._max = max(self._max, num_workers)

    def _acquire(self, deadline: float) -> _Worker | None:
        with self._cond:
            while not self._idle and self._size >= self._max:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if self._idle:
                return self._idle.pop()
            self._size += 1
        worker = self._spawn()
        if worker is None:
            self._release(None)
        return worker

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is None:
                self._size -= 1
            else:
                self._idle.append(worker)
            self._cond.notify()

    def compare(self, gold: str, pred: str, timeout_s: float) -> bool | None:
        if not self._started:
            # A one-time cold start is bounded by STARTUP_TIMEOUT_S, not by the answer's budget. Every thread waits
            # here (on the control lock) until it is over, so none starts its clock while another is booting the pool.
            self.start()
        start = time.monotonic()
        worker = self._acquire(start + timeout_s)
        if worker is None:
            return None
        verdict = worker.ask(gold, pred, start + timeout_s)
        if verdict is None:
            self.timeouts += 1
            logger.debug("Math verification missed its %.2f s deadline; replacing the worker.", timeout_s)
            self._kill(worker)
            worker = None
        self._release(worker)
        return verdict

    def start(self) -> None:
        with self._ctrl_lock:
            if time.monotonic() - self._failed_at < STARTUP_TIMEOUT_S:
                return  # failed moments ago (and said so); comparisons count as timeouts until the retry
            if self._zygote is None or self._zygote.poll() is not None:
                try:
                    self._start_zygote()
                except OSError as error:
                    logger.error("Could not start the math-verifier worker pool: %s", error)

    def warm_up(self, num_workers: int) -> None:
        """Starts the zygote and `num_workers` workers now."""
        self.resize(num_workers)
        self.start()
        workers = [w for w in (self._acquire(time.monotonic() + STARTUP_TIMEOUT_S) for _ in range(num_workers)) if w]
        for worker in workers:
            self._release(worker)

    def pids(self) -> list[int]:
        """Process ids of the zygote and the idle workers (for tests that check nothing leaks)."""
        with self._cond:
            return ([self._zygote.pid] if self._zygote else []) + [w.pid for w in self._idle]

    def close(self) -> None:
        with self._cond:
            idle, self._idle, self._size = self._idle, [], 0
        for worker in idle:
            worker.sock.close()
        with self._ctrl_lock:
            if self._ctrl is not None:
                self._ctrl.close()  # the zygote kills its workers and exits when this closes
                self._ctrl = None
            self._started = False
            if self._zygote is not None:
                try:
                    self._zygote.wait(5.0)
                except subprocess.TimeoutExpired:
                    self._zygote.kill()
                    self._zygote.wait()
                self._zygote = None

    def forget(self) -> None:
        """In a forked child: drop the parent's processes without signalling them, closing only our socket copies."""
        for sock in [w.sock for w in self._idle] + ([self._ctrl] if self._ctrl else []):
            sock.close()
        self._idle, self._size, self._ctrl, self._zygote, self._started = [], 0, None, None, False
        self._cond, self._ctrl_lock = threading.Condition(), threading.Lock()


_POOL: VerifierPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool(num_workers: int = 1) -> VerifierPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = VerifierPool()
        _POOL.resize(num_workers)
        return _POOL


def shutdown() -> None:
    """Stops this process's zygote and workers (they restart lazily if needed again)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.close()


def _after_fork_in_child() -> None:
    global _POOL, _POOL_LOCK
    _POOL_LOCK = threading.Lock()
    if _POOL is not None:
        _POOL.forget()
        _POOL = None


atexit.register(shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ------------------------------------------------------------------------------------------ inside the processes
def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG; Linux only
    except (OSError, AttributeError, TypeError):
        pass


def _serve(sock: socket.socket, entry) -> None:
    try:
        import resource

        limit = int(os.environ.get("DAPO_VERIFIER_MEMORY_BYTES", 4 * 1024**3))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass
    reader = sock.makefile("rb")
    for line in reader:
        try:
            request = json.loads(line)
            verdict = bool(entry(request["g"], request["p"]))
        except Exception:  # includes MemoryError and RecursionError: a failed comparison is a wrong answer
            verdict = False
        sock.sendall(b"1\n" if verdict else b"0\n")


def zygote_main(ctrl_fd: str, module: str, function: str) -> None:
    """Entry point of the zygote process (see the module docstring); never returns."""
    import importlib

    sys.stdout = sys.stderr  # nothing a library prints may reach the caller's stdout
    # Ctrl-C and preemption signals are for the caller, which stops us through the socket. SLURM signals every process
    # of a job step and torch's launcher the training process's whole group: a preempted caller still scores the
    # rest of its rollout before it saves, so the pool must outlive the signal. Forked workers inherit this.
    for name in ("SIGINT", "SIGTERM", "SIGUSR1"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    ctrl = socket.socket(fileno=int(ctrl_fd))
    from .math_symbolic import warm_up

    warm_up()
    entry = getattr(importlib.import_module(module), function)
    ctrl.send(b"ready")
    children: set[int] = set()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(ctrl, 64, 1)
        except (OSError, KeyboardInterrupt):
            break
        if not message:  # the caller closed the pool or died
            break
        for pid in list(children):  # reap workers that exited by themselves
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    children.discard(pid)
            except ChildProcessError:
                children.discard(pid)
        if message == b"spawn" and fds:
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    ctrl.close()
                    _die_with_parent()
                    _serve(socket.socket(fileno=fds[0]), entry)
                except BaseException:
                    code = 1
                finally:
                    os._exit(code)
            os.close(fds[0])
            children.add(pid)
            ctrl.send(str(pid).encode())
        elif message.startswith(b"kill ") and int(message[5:]) in children:
            pid = int(message[5:])
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            children.discard(pid)
        else:
            for fd in fds:
                os.close(fd)
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    os._exit(0)
