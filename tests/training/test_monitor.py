"""``training.monitor``: where a running job's step time goes (``pileworks doctor --during``), and its advice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.monitor import format_report, summarize_run


def write_metrics(run: Path, steps: list[dict], world: int = 2, params: int = 100_000_000) -> None:
    run.mkdir(parents=True, exist_ok=True)
    lines = [
        {
            "kind": "start",
            "world_size": world,
            "params": params,
            "config": {"num_workers": 1, "zero_stage": 3, "micro_batch_size": 4, "precision": "bf16"},
        }
    ]
    lines += [{"kind": "train", "step": i + 1, **s} for i, s in enumerate(steps)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_monitor_advises_loader_workers_when_data_wait_dominates(tmp_path: Path) -> None:
    write_metrics(
        tmp_path,
        [{"step_time_s": 1.0, "data_wait_s": 0.4, "tokens_per_s": 1000.0, "gpu_util": 40.0, "mfu": 0.1}] * 5,
    )
    report = summarize_run(tmp_path)
    assert report.steps == 5 and report.data_wait_share == pytest.approx(0.4)
    assert len(report.advice) == 1 and "raise num_workers (now 1)" in report.advice[0]
    assert "data wait      40% of step time" in format_report(report)


def test_monitor_estimates_comm_share_from_gradient_bytes(tmp_path: Path) -> None:
    # 1e8 bf16 params, 2 ranks, ZeRO-3: 1e8 * 2 B * 2(1/2) * 1.5 = 3e8 B per step; at 1 GB/s = 0.3 s of 0.5 s
    write_metrics(tmp_path, [{"step_time_s": 0.5, "data_wait_s": 0.0, "gpu_util": 50.0, "mfu": 0.2}] * 3)
    unknown = summarize_run(tmp_path)
    assert unknown.comm_share is None and "--busbw" in unknown.comm_source
    assert "GPU utilisation is 50%" in unknown.advice[0]
    report = summarize_run(tmp_path, busbw_gb_s=1.0)
    assert report.comm_share == pytest.approx(0.6) and report.comm_source.startswith("estimated")
    assert any("ZeRO stage 1/2 rather than 3" in tip and "(now 3)" in tip for tip in report.advice)


def test_the_metrics_writer_feeds_tensorboard_and_an_offline_wandb_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``tensorboard: true`` and ``wandb: true`` write, read back with TensorBoard's own reader. wandb runs
    offline (the default); a dead proxy on 127.0.0.1 stops any request it would send."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from training.metrics import MetricsWriter

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.setenv("WANDB_SILENT", "true")
    writer = MetricsWriter(tmp_path, enabled=True, tensorboard=True, wandb=True, run_config={"lr": 0.1})
    writer.log("start", world_size=2, params=100)  # a record, not a series
    for step in (1, 2, 3):
        writer.log("train", step=step, loss=5.0 - step, lr=0.5)
    writer.log("eval", step=3, loss=2.5)
    writer.close()

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["eval/loss", "train/loss", "train/lr"]
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 4.0), (2, 3.0), (3, 2.0)]
    assert [(e.step, e.value) for e in events.Scalars("eval/loss")] == [(3, 2.5)]
    (run,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")  # wandb's own record of the run
    assert run.stat().st_size > 0
    assert [json.loads(line)["kind"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        "start",
        "train",
        "train",
        "train",
        "eval",
    ]
