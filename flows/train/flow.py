"""``train`` and ``prepare_and_train``: the DeepSpeed job as a subprocess under a Prefect flow.

The flow starts the launcher (torchrun/deepspeed) in its own process group, streams every ``[Rank N]`` line into
the flow's log, kills the whole group itself on timeout (a sync task's timeout cannot interrupt blocking code),
fails the run on a non-zero exit, and turns the rank-0 metrics JSONL into artifacts.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.build.flow import build_corpus
from flows.runtime import shutdown
from flows.runtime.heartbeat import with_heartbeat
from flows.runtime.runners import with_task_runner
from flows.train.live import TrainingWatch
from flows.ui import run_names, train_artifacts
from flows.ui.progress import display
from pipeline.corpus_config import load_corpus_config
from pipeline.errors import TrainingFailed
from training import launch
from training.config import TrainConfig, load_train_config
from training.ranklog import LOG_TIME_ENV

DEFAULT_TRAIN_CONFIG = Path(launch.__file__).parent / "configs" / "tiny.yaml"
FLOW_RUN_ENV = "PILEWORKS_FLOW_RUN_ID"
STOP_MARGIN_S = 3.0  # on top of stop_grace_s: the launcher's own exit after its ranks', then the command's


RANK_LINE = re.compile(r"^\[Rank (\d+)\] (?:\S+ \S+ )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): (.*)$")
EXCEPTION_LINE = re.compile(r"^\[Rank (\d+)\] ([A-Za-z_][\w.]*): (.*)$")  # a traceback's last line
STEP_LINE = re.compile(r"^\[Rank 0\] .*\bstep (\d+)/(\d+) loss ([\d.]+).*\| (\d+) tok/s")


def first_rank_error(lines: list[str]) -> str | None:
    """The first failing rank's own error, e.g. ``rank 1: no dataset at file:///x``.

    An ERROR record is the rank's message; when it only says ``training failed`` (an unexpected exception), the
    exception line at the end of that rank's traceback is used instead.
    """
    for i, line in enumerate(lines):
        m = RANK_LINE.match(line)
        if not m or m.group(2) not in ("ERROR", "CRITICAL"):
            continue
        rank, message = m.group(1), m.group(4)
        if message == "training failed":
            for later in lines[i + 1 :]:
                e = EXCEPTION_LINE.match(later)
                if e and e.group(1) == rank and not RANK_LINE.match(later):
                    message = f"{e.group(2)}: {e.group(3)}"
        return f"rank {rank}: {message}"
    return None


def _failed(message: str, detail: str) -> TrainingFailed:
    """The failure (one line, for the CLI); ``detail`` keeps the job's last lines for ``-v``."""
    exc = TrainingFailed(message)
    exc.detail = detail  # type: ignore[attr-defined]
    return exc


def _show_progress(line: str) -> None:
    m = STEP_LINE.match(line)
    if m:
        step, total, loss, tps = m.groups()
        display.stage("training", total=int(total), completed=int(step), detail=f"loss {loss}  {tps} tok/s")


def resolved_train_config(config_path: str | None, overrides: dict[str, Any] | None) -> TrainConfig:
    return load_train_config(config_path or DEFAULT_TRAIN_CONFIG, overrides)


def model_label(cfg: TrainConfig) -> str:
    """The preset, or the folder name of the model training starts from (``pythia-160m``)."""
    return cfg.init_from.rstrip("/").rsplit("/", 1)[-1] if cfg.init_from else cfg.preset


@task(name="deepspeed-job", task_run_name="deepspeed job: {nproc} ranks", cache_policy=NO_CACHE)
def run_training_job(
    manifest_uri: str,
    config_path: str | None,
    nproc: int,
    overrides: dict[str, Any],
    timeout_s: float | None,
    allow_dataset_change: bool,
    max_restarts: int,
    flow_run_id: str | None,
    allow_change: list[str] | None = None,
) -> int:
    shutdown.reclaim_signals()  # the command's SIGTERM handler, not Prefect's: the stop below knows it stops
    log = get_run_logger()
    tail: list[str] = []
    cfg = resolved_train_config(config_path, overrides)
    watch = TrainingWatch(cfg.output_dir, cfg.max_steps)

    def on_line(line: str) -> None:
        tail.append(line)
        del tail[:-400]
        # The ranks' own lines reach the terminal; the launcher's (torchrun's failure banner) only the run's log.
        log.info("%s", line, extra={} if line.startswith("[Rank ") else {"terminal": False})
        _show_progress(line)
        watch.on_line(line)

    job: list[subprocess.Popen] = []

    def on_start(proc: subprocess.Popen) -> None:  # Ctrl-C twice: the ranks are not waited for
        job.append(proc)
        shutdown.on_second_signal(
            "training job", lambda: launch.kill_now(os.getpgid(proc.pid), launch.launched_tree(proc.pid))
        )

    def stop_job() -> None:  # as the stop begins, wherever its interrupt lands
        if job:
            launch.stop_in_background(job[0], cfg.stop_grace_s)

    display.stage(f"launching {nproc} rank(s)")
    try:
        # A stop (SIGTERM, Ctrl-C, SIGHUP) gives the ranks stop_grace_s to save (training.preempt), the watchdog
        # too; the job is sent SIGTERM as the stop begins.
        with (
            shutdown.more_time("training job", cfg.stop_grace_s + STOP_MARGIN_S),
            shutdown.when_stopping("training job", stop_job),
        ):
            code = launch.run_local(
                manifest_uri,
                config_path or str(DEFAULT_TRAIN_CONFIG),
                nproc,
                overrides=overrides,
                on_line=on_line,
                timeout_s=timeout_s,
                allow_dataset_change=allow_dataset_change,
                max_restarts=max_restarts,
                env={FLOW_RUN_ENV: flow_run_id or "", LOG_TIME_ENV: "0"},  # the flow's line has the time
                allow_change=list(allow_change or []),
                on_start=on_start,
                stop_grace_s=cfg.stop_grace_s,
            )
            if shutdown.STOPPING.is_set() and job:  # the stop ended the job; its interrupt has not come (yet)
                launch.stop_in_background(job[0], cfg.stop_grace_s).join()  # what is left of the job, killed
                raise KeyboardInterrupt
    except BaseException:
        if shutdown.STOPPING.is_set():
            watch.poll()  # the ranks' stop record, if they saved in time
            shutdown.say_how_to_go_on(how_to_resume(watch))
        raise
    display.stage("after training: artifacts")
    watch.poll()  # the last evaluation, checkpoint and the end record
    if code != 0:
        detail = "\n".join(tail[-40:])
        if watch.stopped_at is not None and code != launch.EXIT_TIMEOUT:
            # the job was signalled, not the command (its launcher by hand, a Slurm step's processes)
            raise _failed(f"training was stopped by a SIGTERM to its job: {how_to_resume(watch)}", detail)
        if code == launch.EXIT_TIMEOUT:
            saved = "" if watch.stopped_at is None else f" (the ranks saved step {watch.stopped_at} first)"
            raise _failed(
                f"training timed out after {timeout_s:.0f} s and was stopped{saved}; raise --timeout and rerun "
                "to resume",
                detail,
            )
        cause = (
            first_rank_error(tail)
            or f"the launcher exited with code {code} before any rank reported an error"
        )
        raise _failed(f"training failed on {cause}", detail)
    return code


def how_to_resume(watch: TrainingWatch) -> str:
    """What a stopped training job left, and how to go on from it."""
    if watch.stopped_at is not None:
        return f"the ranks saved a checkpoint at step {watch.stopped_at}; rerun the same command to resume from it"
    return "the ranks did not save in time; rerun the same command to resume from their last checkpoint"


def train_run_name() -> str:
    """``train tiny on sample@46dab3b9``: the preset and the dataset (name and id prefix) of the run."""
    from prefect.runtime import flow_run

    p = flow_run.parameters or {}
    try:
        preset = model_label(resolved_train_config(p.get("config_path"), p.get("overrides")))
    except (ValueError, OSError):  # the flow itself reports a bad config, with its message
        preset = "model"
    return f"train {preset} on {run_names.dataset_label(str(p.get('manifest_uri', '?')))}"


def prepare_run_name() -> str:
    """``build and train tiny``; renamed with the dataset id once the build has published it."""
    from prefect.runtime import flow_run

    p = flow_run.parameters or {}
    try:
        preset = model_label(resolved_train_config(p.get("train_config"), p.get("train_overrides")))
    except (ValueError, OSError):
        preset = "model"
    return f"build and train {preset}"


@flow(name="train", flow_run_name=train_run_name, persist_result=False)
@with_heartbeat
def train(
    manifest_uri: str,
    config_path: str | None = None,
    nproc: int = 2,
    overrides: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    allow_dataset_change: bool = False,
    max_restarts: int = 0,
    allow_change: list[str] | None = None,
) -> dict[str, Any]:
    """Train on a published dataset with ``nproc`` local ranks; returns the final metrics and checkpoint dir.

    ``allow_change``: checkpoint fields a resume may find changed (``--allow-change``, see training.resume)."""
    cfg = resolved_train_config(config_path, overrides)
    run_training_job(
        manifest_uri,
        config_path,
        nproc,
        dict(overrides or {}),
        timeout_s,
        allow_dataset_change,
        max_restarts,
        _flow_run_id(),
        allow_change,
    )
    result = train_artifacts.training_result(cfg.output_dir)
    train_artifacts.publish_training_artifacts(result)
    get_run_logger().info(
        "training done: %s steps, loss %s -> %s; checkpoints in %s",
        result.get("steps"),
        _fmt(result.get("first_loss")),
        _fmt(result.get("final_loss")),
        cfg.output_dir,
    )
    return result


@flow(name="prepare_and_train", flow_run_name=prepare_run_name, persist_result=False)
@with_heartbeat
def prepare_and_train(
    corpus_config: str | None = None,
    train_config: str | None = None,
    inputs: list[str] | None = None,
    output: str | None = None,
    nproc: int = 2,
    train_overrides: dict[str, Any] | None = None,
    corpus_overrides: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    max_restarts: int = 0,
    name: str | None = None,
    task_runner: str = "local",
    workers: int | None = None,
) -> dict[str, Any]:
    """The one-click flow: build (or reuse) the corpus on ``task_runner``'s workers, then train on it."""
    summary = with_task_runner(build_corpus, task_runner, workers)(
        config_path=corpus_config, inputs=inputs, output=output, name=name, overrides=corpus_overrides
    )
    overrides = dict(train_overrides or {})
    # One s3: configuration for both halves: the corpus config's, under any s3.* the training overrides set.
    corpus_s3 = load_corpus_config(corpus_config, overrides=corpus_overrides).s3
    for key, value in corpus_s3.to_dict().items():
        overrides.setdefault(f"s3.{key}", value)
    if "output_dir" not in overrides:
        base = resolved_train_config(train_config, overrides).output_dir
        overrides["output_dir"] = f"{base}-{summary['dataset_id'][:12]}"
    result = train(
        summary["manifest_uri"], train_config, nproc, overrides, timeout_s, max_restarts=max_restarts
    )
    run_names.rename_flow_run(
        f"build {summary['name']} {summary['dataset_id'][:8]} and train "
        f"{model_label(resolved_train_config(train_config, overrides))}"
    )
    return {"corpus": summary, "training": result}


def _fmt(loss: float | None) -> str:
    return f"{loss:.3f}" if isinstance(loss, float) else "-"


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None


logging.getLogger(__name__).addHandler(logging.NullHandler())
