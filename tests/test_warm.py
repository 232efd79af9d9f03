"""Warm workers (warm.py): a job run by the warm server behaves as the same job run cold, and dies with its caller."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from klstudy.run import warm

pytestmark = pytest.mark.workflow  # the end-to-end workflow tier: `make test-workflow` (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A warm server with a short preload (what it preloads changes only how fast a job starts)."""
    folder = tmp_path_factory.mktemp("warm")
    path = str(folder / "socket")
    code = f"from klstudy.run import warm; warm.serve({path!r}, preload=('numpy', 'pandas', 'klstudy.analysis.toy'))"
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(path), "the warm server did not start"
    yield path, process.pid
    process.terminate()
    process.wait()


def klstudy(args, socket_path, out, **env):
    environment = {**os.environ, warm.SOCKET_ENV: socket_path or "", **env}
    with open(out, "w") as stream:
        return subprocess.run(
            [sys.executable, "-m", "klstudy", *args], cwd=ROOT, env=environment, stdout=stream, stderr=subprocess.STDOUT
        ).returncode


def toy_args(tmp_path, setting="apart", trials=20):
    section = yaml.safe_load((ROOT / "config.yaml").read_text())["toy"]
    section.update(trials=trials, sequences=100, baseline="none", lengths=[1, 2, 4])
    return ["toy", "--setting", setting, "--settings", json.dumps(section), "--out", str(tmp_path / f"{setting}.csv")]


def children(pid):
    return psutil.Process(pid).children(recursive=True)


def test_a_warm_job_writes_what_the_cold_job_writes_and_exits_as_it_does(server, tmp_path):
    socket_path, server_pid = server
    (tmp_path / "warm").mkdir()
    (tmp_path / "cold").mkdir()
    assert klstudy(toy_args(tmp_path / "warm"), socket_path, tmp_path / "warm.log") == 0
    assert klstudy(toy_args(tmp_path / "cold"), None, tmp_path / "cold.log") == 0
    assert (tmp_path / "warm/apart.csv").read_bytes() == (tmp_path / "cold/apart.csv").read_bytes()
    log = (tmp_path / "warm.log").read_text()
    assert "toy setting apart: 132 rows" in log, "the job's stdout reaches the caller's file"
    assert "did not run the job" not in (tmp_path / "warm.log").read_text()
    # Failures keep a cold process's exit status and message: an exception (1), an argparse error (2).
    assert klstudy(toy_args(tmp_path, setting="nope"), socket_path, tmp_path / "bad.log") == 1
    assert "KeyError: 'nope'" in (tmp_path / "bad.log").read_text()
    assert klstudy(["no-such-stage"], socket_path, tmp_path / "usage.log") == 2
    assert "invalid choice" in (tmp_path / "usage.log").read_text()


def test_the_job_ran_in_the_server_not_in_the_caller(server, tmp_path):
    socket_path, server_pid = server
    caller = subprocess.Popen(
        [sys.executable, "-m", "klstudy", *toy_args(tmp_path, trials=400)],
        cwd=ROOT,
        env={**os.environ, warm.SOCKET_ENV: socket_path},
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not children(server_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children(server_pid), "the server forked no job"
    assert caller.wait(timeout=120) == 0


def test_a_job_whose_caller_is_killed_dies_with_it(server, tmp_path):
    socket_path, server_pid = server
    caller = subprocess.Popen(
        [sys.executable, "-m", "klstudy", *toy_args(tmp_path, trials=20000)],  # minutes of work if nothing stops it
        cwd=ROOT,
        env={**os.environ, warm.SOCKET_ENV: socket_path},
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not children(server_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children(server_pid), "the server forked no job"
    caller.send_signal(signal.SIGTERM)  # what Snakemake does to a job it cancels
    caller.wait(timeout=10)
    deadline = time.monotonic() + 10
    while children(server_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not children(server_pid), "the job outlived its caller"


def test_without_an_answering_server_the_job_runs_cold(tmp_path):
    log = tmp_path / "cold.log"
    assert klstudy(toy_args(tmp_path), str(tmp_path / "nothing-here"), log) == 0
    assert "running it cold" in log.read_text() and (tmp_path / "apart.csv").is_file()


def test_distributed_ranks_and_other_interpreters_are_not_delegated(server, monkeypatch):
    socket_path, _ = server
    monkeypatch.setenv(warm.SOCKET_ENV, socket_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert warm.delegate(["status"]) is None  # each rank must stay the process its launcher started
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setattr(warm, "_interpreter", lambda: ["/another/venv", sys.version])
    assert warm.delegate(["status"]) is None  # e.g. the vLLM environment's python: the server refuses it


def test_only_stages_go_to_the_warm_server():
    """The warm server knows the stages alone, so the other commands of cli.py run in their own process, served or
    not."""
    from klstudy.run import cli

    assert cli.is_stage(["train", "--settings", "{}"]) and cli.is_stage(["evaluate"])
    for command in ("last-failure", "adopt", "calibrate", "drive", "warm-serve", "pilot-config"):
        assert not cli.is_stage([command]), command
    assert not cli.is_stage([])
