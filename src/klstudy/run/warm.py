"""Warm workers: the embedded study's jobs fork from a server that has imported torch, TRL and lm-eval once.

Importing them takes about 7 s of a 20-30 s job on a CPU (docs/cost.md). ``klstudy drive --warm`` (``make study``)
starts the server and sets ``KLSTUDY_WARM_SOCKET``; a job's ``python -m klstudy <stage>`` then hands its arguments,
directory, environment and standard streams (SCM_RIGHTS) to the server, which forks a child that runs the stage as a
cold process would, and waits for its exit status. A child dies with its process group when its caller goes (Snakemake
killed it, Ctrl-C). A job runs cold where no server answers, under another interpreter (the vLLM environment's: the
server refuses it), or under ``accelerate launch``/``torchrun`` (``WORLD_SIZE``: each rank stays its launcher's).
Snakemake's ``benchmark`` files then time a job's wall seconds, but their CPU and memory columns see only its caller.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SOCKET_ENV = "KLSTUDY_WARM_SOCKET"
# What a job would otherwise import itself: the training, evaluation, divergence, toy and figure stages' libraries.
PRELOAD = (
    "torch transformers trl accelerate datasets lm_eval lm_eval.models.huggingface pandas klstudy.train.cell "
    "klstudy.train.trainer klstudy.evaluate.harness klstudy.evaluate.divergence klstudy.analysis.toy "
    "klstudy.report.aggregate klstudy.report.figures.paper klstudy.report.figures.training "
    "klstudy.report.figures.forest klstudy.report.figures.toy klstudy.report.figures.atlas"
).split()
_HEADER = struct.Struct("!Q")  # length of the JSON request that follows
_STATUS = struct.Struct("!i")  # the job's exit status
REFUSED = -(2**31)  # the server would not run this job: run it cold


def _interpreter() -> list[str]:
    """What a job must share with the server: the environment (a venv's prefix; symlinks would hide it) and Python."""
    return [sys.prefix, sys.version]


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the connection closed early")
        data += chunk
    return data


# ------------------------------------------------------------------------------------------- the job's side


def delegate(argv: list[str]) -> int | None:
    """Run ``python -m klstudy <argv>`` in the warm server: the job's exit status, or None to run it cold here."""
    path = os.environ.get(SOCKET_ENV)
    if not path or "WORLD_SIZE" in os.environ:
        return None
    request = json.dumps(
        {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "interpreter": _interpreter()}
    ).encode()
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        socket.send_fds(conn, [_HEADER.pack(len(request))], [0, 1, 2])
        conn.sendall(request)
        (status,) = _STATUS.unpack(_recv_exactly(conn, _STATUS.size))
    except (OSError, ConnectionError) as error:
        print(f"klstudy: warm server at {path} did not run the job ({error}); running it cold", file=sys.stderr)
        return None
    return None if status == REFUSED else status


# ------------------------------------------------------------------------------------------- the server's side


def serve(path: str, preload=PRELOAD) -> None:
    """Import ``preload``, then fork one child per job that connects to the Unix socket at ``path``, forever."""
    for module in preload:
        importlib.import_module(module)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps finished children
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".binding")
    server.listen(64)
    os.rename(path + ".binding", path)  # the socket appears only once it accepts connections
    print(f"klstudy warm server {os.getpid()}: {len(sys.modules)} modules imported, serving {path}", flush=True)
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            server.close()
            os._exit(_run_job(conn))
        conn.close()


def _run_job(conn: socket.socket) -> int:
    """In the forked child: take the job's streams, directory and environment, run it, report its exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the job's own subprocesses must be waitable
    header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
    header += _recv_exactly(conn, _HEADER.size - len(header))
    request = json.loads(_recv_exactly(conn, _HEADER.unpack(header)[0]))
    if request["interpreter"] != _interpreter() or len(fds) != 3:
        conn.sendall(_STATUS.pack(REFUSED))
        return 0
    os.setsid()  # its own process group, so that the watchdog can take the job's subprocesses down with it
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.pop(SOCKET_ENV, None)  # a job that starts `python -m klstudy` itself starts it cold
    sys.argv = [sys.argv[0], *request["argv"]]
    _reseed()
    threading.Thread(target=_kill_when_caller_leaves, args=(conn,), daemon=True).start()
    status = _run_stage(request["argv"])
    conn.sendall(_STATUS.pack(status))
    return status


def _reseed() -> None:
    """Fresh Python and NumPy global generators, as a new process has (torch's default seed is a constant anyway)."""
    import random

    import numpy

    random.seed()
    numpy.random.seed()


def _kill_when_caller_leaves(conn: socket.socket) -> None:
    try:
        conn.recv(1)  # returns when the waiting job process exits or is killed
    finally:
        os.killpg(0, signal.SIGKILL)


def _run_stage(argv: list[str]) -> int:
    """``stages.run(argv)`` with a cold interpreter's exit status: 0, SystemExit's code, or 1 after a traceback."""
    import atexit
    import traceback

    from klstudy.run import stages

    try:
        status = stages.run(argv)
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - any failure is the job's, reported as a cold process would
        traceback.print_exc()
        status = 1
    atexit._run_exitfuncs()  # what interpreter shutdown does (os._exit skips it)
    sys.stdout.flush()
    sys.stderr.flush()
    return status


# ------------------------------------------------------------------------------------------- around a command


@contextlib.contextmanager
def server(log: Path, ready_timeout: float = 300.0, env: dict | None = None, preexec_fn=None):
    """A warm server for the block, its output in ``log``: yields ``env`` (default: this process's) with
    ``KLSTUDY_WARM_SOCKET`` set, or without it (jobs run cold) if it does not come up. In a process group of its own,
    so that a Ctrl-C meant for the jobs leaves it serving until the block ends; ``preexec_fn``: drive.die_with_parent.
    """
    folder = tempfile.mkdtemp(prefix="klstudy-warm-")
    path = os.path.join(folder, "socket")
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "klstudy", "warm-serve", "--socket", path],
            stdout=out, stderr=subprocess.STDOUT, process_group=0, preexec_fn=preexec_fn,
        )  # fmt: skip
    env = dict(os.environ if env is None else env)
    start = time.monotonic()
    while not os.path.exists(path) and process.poll() is None and time.monotonic() - start < ready_timeout:
        time.sleep(0.1)
    if os.path.exists(path):
        env[SOCKET_ENV] = path
        print(f"klstudy: warm server ready in {time.monotonic() - start:.1f}s ({log})", file=sys.stderr)
    else:
        print(f"klstudy: warm server did not start (see {log}); every job runs cold", file=sys.stderr)
    try:
        yield env
    finally:
        process.terminate()
        process.wait()
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        os.rmdir(folder)
