"""``train`` and ``prepare_and_train``: the DeepSpeed job as a subprocess under a Prefect flow.

The flow starts the launcher (torchrun/deepspeed) in its own process group, streams every ``[Rank N]`` line into
the flow's log, kills the whole group itself on timeout (a sync task's timeout cannot interrupt blocking code),
fails the run on a non-zero exit, and turns the rank-0 metrics JSONL into artifacts.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows import train_artifacts
from flows.build import build_corpus
from flows.heartbeat import with_heartbeat
from pipeline.errors import TrainingFailed
from training import launch
from training.config import TrainConfig, load_train_config

DEFAULT_TRAIN_CONFIG = (
    Path(importlib.util.find_spec("training").origin or "").parent / "configs" / "tiny.yaml"
)
FLOW_RUN_ENV = "PILEWORKS_FLOW_RUN_ID"


def resolved_train_config(config_path: str | None, overrides: dict[str, Any] | None) -> TrainConfig:
    return load_train_config(config_path or DEFAULT_TRAIN_CONFIG, overrides)


@task(name="deepspeed-job", cache_policy=NO_CACHE)
def run_training_job(
    manifest_uri: str,
    config_path: str | None,
    nproc: int,
    overrides: dict[str, Any],
    timeout_s: float | None,
    allow_dataset_change: bool,
    max_restarts: int,
    flow_run_id: str | None,
) -> int:
    log = get_run_logger()
    tail: list[str] = []

    def on_line(line: str) -> None:
        tail.append(line)
        del tail[:-40]
        log.info("%s", line)

    code = launch.run_local(
        manifest_uri, config_path or str(DEFAULT_TRAIN_CONFIG), nproc, overrides=overrides, on_line=on_line,
        timeout_s=timeout_s, allow_dataset_change=allow_dataset_change, max_restarts=max_restarts,
        env={FLOW_RUN_ENV: flow_run_id or ""},
    )  # fmt: skip
    if code != 0:
        why = "timed out and was killed" if code == launch.EXIT_TIMEOUT else f"exited with code {code}"
        raise TrainingFailed(f"training {why}; last lines:\n" + "\n".join(tail[-15:]))
    return code


@flow(name="train", result_serializer="json")
@with_heartbeat
def train(
    manifest_uri: str,
    config_path: str | None = None,
    nproc: int = 2,
    overrides: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    allow_dataset_change: bool = False,
    max_restarts: int = 0,
) -> dict[str, Any]:
    """Train on a published dataset with ``nproc`` local ranks; returns the final metrics and checkpoint dir."""
    cfg = resolved_train_config(config_path, overrides)
    run_training_job(
        manifest_uri, config_path, nproc, dict(overrides or {}), timeout_s, allow_dataset_change, max_restarts,
        _flow_run_id(),
    )  # fmt: skip
    result = train_artifacts.training_result(cfg.output_dir)
    train_artifacts.publish_training_artifacts(result)
    get_run_logger().info("training done: %s", {k: v for k, v in result.items() if k != "history"})
    return result


@flow(name="prepare_and_train", result_serializer="json")
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
) -> dict[str, Any]:
    """The one-click flow: build (or reuse) the corpus, then train on it."""
    summary = build_corpus(
        config_path=corpus_config, inputs=inputs, output=output, overrides=corpus_overrides
    )
    overrides = dict(train_overrides or {})
    if "output_dir" not in overrides:
        base = resolved_train_config(train_config, overrides).output_dir
        overrides["output_dir"] = f"{base}-{summary['dataset_id'][:12]}"
    result = train(summary["manifest_uri"], train_config, nproc, overrides, timeout_s)
    return {"corpus": summary, "training": result}


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None


logging.getLogger(__name__).addHandler(logging.NullHandler())
