"""Training results from the rank-0 metrics JSONL, and the Prefect artifacts of a training run."""

from __future__ import annotations

from typing import Any

from training.metrics import read_metrics

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 60) -> str:
    """A one-line chart: the curve resampled to ``width`` points, scaled between its min and max."""
    if not values:
        return ""
    if len(values) > width:
        values = [values[int(i * len(values) / width)] for i in range(width)]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int((v - lo) / span * (len(SPARK) - 1)))] for v in values)


def training_result(output_dir: str) -> dict[str, Any]:
    train = read_metrics(output_dir, "train")
    evals = read_metrics(output_dir, "eval")
    if not train:
        return {"output_dir": output_dir, "steps": 0, "history": [], "eval": evals}
    last = train[-1]
    warm = train[len(train) // 5 :] or train  # skip warm-up steps in the averages
    return {
        "output_dir": output_dir,
        "steps": int(last["step"]),
        "first_loss": float(train[0]["loss"]),
        "final_loss": float(last["loss"]),
        "tokens_per_s": sum(r.get("tokens_per_s", 0.0) for r in warm) / len(warm),
        "data_wait_share": sum(r.get("data_wait_share", 0.0) for r in warm) / len(warm),
        "eval": evals,
        "history": [
            {"step": r["step"], "loss": r["loss"], "tokens_per_s": r.get("tokens_per_s")} for r in train
        ],
    }


def training_markdown(result: dict[str, Any]) -> str:
    history = result.get("history", [])
    losses = [h["loss"] for h in history]
    speeds = [h["tokens_per_s"] or 0.0 for h in history]
    lines = [f"# Training: {result['output_dir']}", ""]
    if not history:
        return "\n".join([*lines, "No training steps were recorded."])
    lines += [
        f"**loss** {losses[0]:.4f} → {losses[-1]:.4f} over {result['steps']} steps",
        "",
        f"`{sparkline(losses)}`",
        "",
        f"**tokens/s** (after warm-up) {result['tokens_per_s']:.0f}; data-wait share {result['data_wait_share']:.1%}",
        "",
        f"`{sparkline(speeds)}`",
        "",
        "| step | loss | tokens/s |",
        "|---:|---:|---:|",
    ]
    stride = max(1, len(history) // 20)
    for h in history[::stride] + ([history[-1]] if (len(history) - 1) % stride else []):
        lines.append(f"| {h['step']} | {h['loss']:.4f} | {h['tokens_per_s'] or 0:.0f} |")
    for e in result.get("eval", [])[-3:]:
        lines.append(f"\nvalid loss at step {e.get('step')}: {e.get('loss', e.get('valid_loss'))}")
    return "\n".join(lines)


def publish_training_artifacts(result: dict[str, Any]) -> None:
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    create_markdown_artifact(training_markdown(result), key="training-curve", description="Loss and tokens/s")
    final = {k: v for k, v in result.items() if k not in ("history", "eval")}
    create_table_artifact([final], key="training-final", description="Final training metrics")
