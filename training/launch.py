"""Build and run the launcher command (``torchrun`` or ``deepspeed``) for ``training.train``.

``run_local`` is what ``flows/`` calls: it starts the launcher in its own process group (so a timeout or a
cancelled flow can kill every rank with :func:`kill_process_group`), streams its merged ``[Rank N]`` output line
by line to a callback, and returns the launcher's exit code. Multi-node runs use the same command builder with a
hostfile (deepspeed) or a rendezvous endpoint (torchrun) on every node.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import psutil
import torch

logger = logging.getLogger(__name__)

EXIT_TIMEOUT = 124  # what coreutils' timeout returns
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    launcher: Literal["torchrun", "deepspeed"] = "torchrun"
    nproc_per_node: int = 2
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: a free port on this host
    hostfile: str | None = None  # deepspeed: "host slots=N" lines
    max_restarts: int = 0  # torchrun: restart all ranks this often after a failure (resume from checkpoint)
    rdzv_id: str = "pileworks"
    cpu: bool | None = None  # None: CPU when CUDA is unavailable
    omp_num_threads: int | None = None  # None: cores / ranks per node
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.launcher not in ("torchrun", "deepspeed"):
            raise ValueError(f"launcher must be 'torchrun' or 'deepspeed'; got {self.launcher!r}")
        for name in ("nproc_per_node", "nnodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, nnodes={self.nnodes}); got {self.node_rank}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0; got {self.max_restarts}")
        if self.max_restarts and self.launcher != "torchrun":
            raise ValueError(
                "max_restarts needs launcher='torchrun' (the deepspeed launcher does not restart)"
            )
        if self.nnodes > 1 and self.master_port is None:
            raise ValueError("multi-node runs need an explicit master_port: every node must use the same one")
        if self.hostfile and not Path(self.hostfile).is_file():
            raise ValueError(f"hostfile {self.hostfile} does not exist")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def train_args(
    manifest_uri: str,
    config_path: str | Path | None,
    *,
    allow_dataset_change: bool = False,
    allow_change: Sequence[str] = (),
    overrides: Mapping[str, object] | None = None,
    stop_at_step: int | None = None,
) -> list[str]:
    """The ``training.train`` arguments (after ``-m training.train``)."""
    args = ["--manifest", manifest_uri]
    if config_path:
        args += ["--config", str(config_path)]
    for name, value in (overrides or {}).items():
        args += ["--set", f"{name}={_yaml_scalar(value)}"]
    if allow_dataset_change:
        args.append("--allow-dataset-change")
    for names in allow_change:
        args += ["--allow-change", names]
    if stop_at_step is not None:
        args += ["--stop-at-step", str(stop_at_step)]
    return args


def _yaml_scalar(value: object) -> str:
    """JSON is YAML: strings are quoted so that ``"123"`` or ``"yes"`` stay strings on the other side."""
    return json.dumps(value)


def build_env(spec: LaunchSpec, port: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    cpu = spec.cpu if spec.cpu is not None else not torch.cuda.is_available()
    env["MASTER_ADDR"], env["MASTER_PORT"] = spec.master_addr, str(port)
    if cpu:
        env["DS_ACCELERATOR"] = "cpu"
    threads = spec.omp_num_threads or max(1, (os.cpu_count() or 1) // spec.nproc_per_node)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env.setdefault("PYTHONUNBUFFERED", "1")  # ranks' lines reach the stream as they are logged
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(spec.extra_env)
    return env


def build_command(spec: LaunchSpec, args: Sequence[str], port: int) -> list[str]:
    """The launcher argv running ``python -m training.train <args>`` on every rank of this node."""
    if spec.launcher == "torchrun":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={spec.nproc_per_node}",
            f"--nnodes={spec.nnodes}",
            f"--node-rank={spec.node_rank}",
            f"--max-restarts={spec.max_restarts}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={spec.master_addr}:{port}",
            f"--rdzv-id={spec.rdzv_id}",
            "-m",
            "training.train",
            *args,
        ]
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.launcher.runner",
        f"--master_addr={spec.master_addr}",
        f"--master_port={port}",
        "--no_local_rank",
    ]
    if spec.hostfile:
        cmd += [f"--hostfile={spec.hostfile}"]
    else:
        cmd += [f"--num_nodes={spec.nnodes}", f"--num_gpus={spec.nproc_per_node}"]
    return [*cmd, "--module", "training.train", *args]


def build_launch(
    spec: LaunchSpec, args: Sequence[str], base_env: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    port = spec.master_port or free_port()
    return build_command(spec, args, port), build_env(spec, port, base_env)


def kill_process_group(proc: subprocess.Popen | int, grace_s: float = 10.0) -> None:
    """SIGTERM the launcher's whole process group, then SIGKILL what is left after ``grace_s``: the group and
    every process that descended from the launcher when it was signalled (torchrun starts each rank in a
    session of its own, which the group's signal does not reach, and which outlives a killed torchrun).

    The SIGTERM is the ranks' cue to save (``training.preempt``): torchrun and DeepSpeed's launcher forward it
    to them and wait for them."""
    pid = proc if isinstance(proc, int) else proc.pid
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    tree = launched_tree(pid)
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if isinstance(proc, subprocess.Popen) and proc.poll() is not None:
            break
        time.sleep(0.1)
    kill_now(pgid, tree)


def launched_tree(pid: int) -> list[psutil.Process]:
    """The launcher's descendants (the ranks, their DataLoader workers) as they are now."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def kill_now(pgid: int, tree: list[psutil.Process]) -> None:
    """SIGKILL the launcher's group and ``tree`` (psutil checks that a pid was not reused by another process)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(psutil.Error):
            child.kill()


def start_local(
    cmd: Sequence[str], env: Mapping[str, str], cwd: str | Path | None = None
) -> subprocess.Popen:
    """Start the launcher in a new session (its own process group), stdout and stderr merged, line-buffered."""
    logger.info("launching: %s", " ".join(cmd))
    return subprocess.Popen(
        list(cmd),
        env=dict(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        errors="replace",
        start_new_session=True,
    )


def stream_output(
    proc: subprocess.Popen,
    on_line: Callable[[str], None],
    timeout_s: float | None,
    stop_grace_s: float = 10.0,
) -> int:
    """Feed every output line to ``on_line`` until exit; on timeout stop the job and return 124.

    A timeout, or the caller's stop (an exception here: the command's Ctrl-C or SIGTERM), sends the job SIGTERM
    and gives its ranks ``stop_grace_s`` to save their checkpoint (``training.preempt``), their lines still fed
    to ``on_line``, before what is left is killed; then the stop goes on (the exception is raised again)."""
    timer = None
    timed_out = threading.Event()
    if timeout_s:

        def expire() -> None:
            timed_out.set()
            stop_in_background(proc, stop_grace_s).join()

        timer = threading.Timer(timeout_s, expire)
        timer.daemon = True
        timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            # A terminal that hung up fails the command's writes (EIO) before its SIGHUP arrives: the line is
            # lost, the job is not stopped for it (the signal stops it, where one comes; under nohup none does).
            with contextlib.suppress(OSError):
                on_line(line.rstrip("\n"))
        code = proc.wait()
    except BaseException:
        stop_job(proc, on_line, stop_grace_s)  # a stopped caller must not leave ranks running
        raise
    finally:
        if timer is not None:
            timer.cancel()
    if timed_out.is_set():
        logger.error("training exceeded %.0fs: stopped its process group", timeout_s)
        return EXIT_TIMEOUT
    return code


_stoppers: weakref.WeakKeyDictionary[subprocess.Popen, threading.Thread] = weakref.WeakKeyDictionary()
_stoppers_lock = threading.RLock()  # re-entered by a signal handler landing while the main thread holds it


def stop_in_background(proc: subprocess.Popen, grace_s: float) -> threading.Thread:
    """:func:`kill_process_group` of ``proc`` on a thread, started once per job whoever asks (a timeout, the
    command's signal handler as the stop begins, the caller's stop): the launcher gets one SIGTERM and one
    grace, not one per asker. The thread, to join."""
    with _stoppers_lock:
        stopper = _stoppers.get(proc)
        if stopper is None:
            stopper = threading.Thread(
                target=kill_process_group, args=(proc, grace_s), name="stop-training-job"
            )
            stopper.start()
            _stoppers[proc] = stopper
        return stopper


def stop_job(proc: subprocess.Popen, on_line: Callable[[str], None], grace_s: float) -> None:
    """:func:`stop_in_background`, while this thread goes on feeding the job's lines to ``on_line``
    (the ranks say which checkpoint they saved) until the output ends: the job has exited, or was killed.

    An interrupt meanwhile (the stop's own signal coming after, or again: a hang-up's SIGHUP from the shell, then
    the kernel's) does not cut the wait short, which would leave the ranks unwaited for mid-save (measured: 1
    close of a terminal in 8). A second Ctrl-C kills the job first (``on_second_signal`` in the train flow), and
    its output ends at once."""
    stopper = stop_in_background(proc, grace_s)
    for _ in range(100):  # each pass ends with the job's output, or with an interrupt
        try:
            with contextlib.suppress(OSError, ValueError):  # the pipe closed under us
                assert proc.stdout is not None
                for line in proc.stdout:
                    with contextlib.suppress(Exception):  # the caller is stopping: a logger may be gone
                        on_line(line.rstrip("\n"))
            stopper.join()
            return
        except KeyboardInterrupt:
            continue
    stopper.join()


def run_local(
    manifest_uri: str,
    config_path: str | Path | None,
    nproc: int = 2,
    *,
    launcher: Literal["torchrun", "deepspeed"] = "torchrun",
    max_restarts: int = 0,
    allow_dataset_change: bool = False,
    allow_change: Sequence[str] = (),
    overrides: Mapping[str, object] | None = None,
    stop_at_step: int | None = None,
    on_line: Callable[[str], None] | None = None,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    cpu: bool | None = None,
    cwd: str | Path | None = None,
    on_start: Callable[[subprocess.Popen], None] | None = None,
    stop_grace_s: float = 10.0,
) -> int:
    """Train on this machine with ``nproc`` ranks; returns the launcher's exit code (124 on timeout).

    ``overrides`` set TrainConfig fields (``--set``); ``env`` adds environment variables; ``on_start`` receives
    the Popen (e.g. to keep it for :func:`kill_process_group`); ``on_line`` gets each output line (default: log);
    ``stop_grace_s``: how long the ranks get to save once the job is stopped (:func:`stream_output`).
    """
    spec = LaunchSpec(
        launcher=launcher, nproc_per_node=nproc, max_restarts=max_restarts, cpu=cpu, extra_env=dict(env or {})
    )
    args = train_args(
        manifest_uri,
        config_path,
        allow_dataset_change=allow_dataset_change,
        allow_change=allow_change,
        overrides=overrides,
        stop_at_step=stop_at_step,
    )
    cmd, full_env = build_launch(spec, args)
    proc = start_local(cmd, full_env, cwd)
    if on_start is not None:
        on_start(proc)
    return stream_output(proc, on_line or (lambda line: logger.info("%s", line)), timeout_s, stop_grace_s)
