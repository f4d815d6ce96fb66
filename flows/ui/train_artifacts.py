"""Training results from the rank-0 metrics JSONL, and the Prefect artifacts of a training run.

The ``training-curve`` artifact is a page of SVG charts (:mod:`flows.ui.charts`): train and valid loss, tokens/s,
data-wait share and learning rate against the step, with the headline numbers rounded and where the TensorBoard
and wandb logs are.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flows.ui import charts, readable
from training.metrics import read_metrics, read_records


def training_result(output_dir: str) -> dict[str, Any]:
    train = read_metrics(output_dir, "train")
    evals = read_metrics(output_dir, "eval")
    logs = log_locations(output_dir)
    restarts = [
        {"attempt": int(r.get("attempt") or 0), "resumed_from": r["resumed_from"]}
        for r in read_records(output_dir, "start")
        if r.get("resumed_from") is not None
    ]
    if not train:
        return {
            "output_dir": output_dir,
            "steps": 0,
            "history": [],
            "eval": evals,
            "logs": logs,
            "restarts": restarts,
        }
    last = train[-1]
    warm = train[len(train) // 5 :] or train  # skip warm-up steps in the averages
    return {
        "output_dir": output_dir,
        "steps": int(last["step"]),
        "first_loss": float(train[0]["loss"]),
        "final_loss": float(last["loss"]),
        "final_valid_loss": float(evals[-1]["loss"]) if evals else None,
        "tokens_per_s": sum(r.get("tokens_per_s", 0.0) for r in warm) / len(warm),
        "data_wait_share": sum(r.get("data_wait_share", 0.0) for r in warm) / len(warm),
        "eval": evals,
        "logs": logs,
        "restarts": restarts,
        "history": [
            {k: r.get(k) for k in ("step", "loss", "lr", "tokens_per_s", "data_wait_share")} for r in train
        ],
    }


def log_locations(output_dir: str) -> dict[str, tuple[str, str]]:
    """Where the run's logs are and how to open them: the JSONL always, TensorBoard and wandb when written."""
    out = Path(output_dir)
    found = {"metrics (JSONL)": (str(out / "metrics.jsonl"), "pileworks doctor --during " + str(out))}
    if (out / "tensorboard").exists():
        found["TensorBoard"] = (str(out / "tensorboard"), f"tensorboard --logdir {out / 'tensorboard'}")
    if (out / "wandb").exists():
        found["wandb"] = (str(out / "wandb"), f"wandb sync {out / 'wandb'}/offline-run-* (offline runs)")
    return found


def _series(history: list[dict[str, Any]], key: str, scale: float = 1.0) -> list[tuple[float, float]]:
    return [(h["step"], h[key] * scale) for h in history if isinstance(h.get(key), (int, float))]


def training_charts(
    history: list[dict[str, Any]], evals: list[dict[str, Any]], restarts: Sequence[dict[str, Any]] = ()
) -> list[str]:
    """The four charts as markdown images (those whose metric was logged); restarts marked where they resumed."""
    marks = [(r["resumed_from"], f"restart {r['attempt']}" if r["attempt"] else "resumed") for r in restarts]
    loss = [charts.Series("train loss", _series(history, "loss"))]
    if evals:
        loss.append(charts.Series("valid loss", _series(evals, "loss"), markers=True))
    out = [
        charts.markdown_image(
            charts.line_chart(
                loss,
                title="Loss",
                x_label="step",
                y_label="loss (nats/token)",
                y_format=readable.sig,
                marks=marks,
            ),
            "loss chart: train and valid loss against step",
        )
    ]
    for key, title, y_label, scale, fmt in (
        ("tokens_per_s", "Throughput", "tokens/s", 1.0, readable.si),
        ("data_wait_share", "Data wait", "% of step time", 100.0, readable.sig),
        ("lr", "Learning rate", "lr", 1.0, readable.sig),
    ):
        points = _series(history, key, scale)
        if points:
            svg = charts.line_chart(
                [charts.Series(title, points)],
                title=title,
                x_label="step",
                y_label=y_label,
                y_format=fmt,
                marks=marks,
            )
            out.append(charts.markdown_image(svg, f"{title.lower()} chart: {y_label} against step"))
    return out


def training_markdown(result: dict[str, Any]) -> str:
    history = result.get("history", [])
    lines = ["# Training", "", f"Output folder: `{result['output_dir']}`", ""]
    if not history:
        return "\n".join([*lines, "No training steps were recorded."])
    valid = result.get("final_valid_loss")
    lines += [
        f"- **loss** {readable.sig(result['first_loss'], 4)} → {readable.sig(result['final_loss'], 4)} "
        f"over {readable.count(result['steps'])} steps"
        + (f"; valid loss {readable.sig(valid, 4)}" if valid is not None else ""),
        f"- **throughput** {readable.si(result['tokens_per_s'])} tokens/s after warm-up; "
        f"data wait {readable.pct(result['data_wait_share'])} of step time",
        *[
            f"- **{'restart ' + str(r['attempt']) if r['attempt'] else 'resumed'}**: from the checkpoint of step "
            f"{r['resumed_from']}"
            for r in result.get("restarts", [])
        ],
        "",
        *[
            f"{chart}\n"
            for chart in training_charts(history, result.get("eval", []), result.get("restarts", []))
        ],
        "## Logs",
        "",
        *[
            f"- **{name}**: `{path}`; open with `{how}`"
            for name, (path, how) in result.get("logs", {}).items()
        ],
    ]
    return "\n".join(lines)


def final_row(result: dict[str, Any]) -> dict[str, str]:
    """The training-final table: one row, every number rounded and with its unit."""
    return {
        "steps": readable.count(result["steps"]),
        "first loss": readable.sig(result.get("first_loss"), 4),
        "final loss": readable.sig(result.get("final_loss"), 4),
        "valid loss": readable.sig(result.get("final_valid_loss"), 4),
        "tokens/s": readable.si(result.get("tokens_per_s")),
        "data wait": readable.pct(result.get("data_wait_share")),
        "restarts": readable.count(len(result.get("restarts", []))),
        "output": result["output_dir"],
    }


def publish_training_artifacts(result: dict[str, Any]) -> None:
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    create_markdown_artifact(
        training_markdown(result),
        key="training-curve",
        description="Loss, valid loss, tokens/s, data wait and learning rate against step",
    )
    create_table_artifact([final_row(result)], key="training-final", description="Final training metrics")
