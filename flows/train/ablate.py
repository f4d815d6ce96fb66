"""``ablate``: which corpus variant makes the better model? Build each variant, train the same small model on
each for the same tokens, seed(s) and tokenizer, evaluate each on the user's text, publish one table.

The base config builds first (its tokenizer pinned); every variant is the base with its overrides plus
``tokenize.tokenizer`` set to the base's published tokenizer, so token ids, and so losses, are comparable, and
the unit cache reuses every unit a variant shares with the base (ingest, clean, ...). Each variant trains the
same preset for ``steps_for_tokens`` steps (or ``--steps``) per seed (seed ``s`` of ``--seeds``), in its own
output folder, then ``evaluate`` reads the ``.jsonl`` evaluation texts with the checkpoint's tokenizer and scores
each ``--task`` file (:mod:`training.downstream`). The table gives each metric with its intervals and each
difference to the base with a paired interval (``ablate_plan``). A variant that fails to build
or to train is marked ``failed: <why>`` in the table and the others still report; what can be known before any
work (a bad variant spec or config, a missing evaluation file) fails at once, naming it.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.build.flow import build_corpus
from flows.runtime import shutdown
from flows.train.ablate_plan import (
    BASE,
    Variant,
    budget_line,
    format_table,
    metric_cells,
    parse_variants,
    seed_list,
    steps_for_tokens,
    table_rows,
)
from flows.train.evaluate import evaluate
from flows.train.flow import resolved_train_config, train
from flows.ui.charts import bar_chart, markdown_image
from pipeline.corpus_config import load_corpus_config
from pipeline.dataset.manifest import load_manifest
from training.config import TrainConfig
from training.tasks import read_tasks


def tokens_per_step(cfg: TrainConfig, nproc: int) -> int:
    """Tokens one optimiser step consumes: the global batch (samples) times ``seq_len``."""
    batch = cfg.global_batch_size or cfg.micro_batch_size * (cfg.grad_accum_steps or 1) * nproc
    return batch * cfg.seq_len


def check_inputs(
    base_config: str | None,
    base_overrides: dict[str, Any],
    variants: list[Variant],
    eval_data: str,
    tasks: list[str] | None = None,
) -> None:
    """Everything knowable before any work: every variant's config loads, the evaluation and task files read."""
    if not eval_data.endswith(".jsonl") or not Path(eval_data).is_file():
        raise ValueError(f"--eval {eval_data}: a .jsonl file of {{'text': ...}} lines is needed")
    read_tasks(tasks or [])
    for v in [Variant(BASE), *variants]:
        try:
            load_corpus_config(base_config, overrides=base_overrides | v.overrides)
        except ValueError as exc:
            raise ValueError(f"variant {v.name}: {exc}") from exc


def _train_overrides(
    base: dict[str, Any], cfg: TrainConfig, steps: int, seed: int, out: str
) -> dict[str, Any]:
    return base | {
        "seed": seed,
        "max_steps": steps,
        "warmup_steps": min(cfg.warmup_steps, steps - 1),
        "checkpoint_interval": steps,  # one checkpoint, at the end: what evaluate reads
        "eval_interval": steps,
        "log_interval": max(1, min(cfg.log_interval, steps // 4)),
        "output_dir": out,
    }


def _build(
    name: str, config: str | None, overrides: dict[str, Any], cfg: TrainConfig, **where: Any
) -> dict[str, Any]:
    summary = build_corpus(config_path=config, overrides=overrides, **where)
    manifest, _ = load_manifest(summary["manifest_uri"], cfg.s3)
    train_split = manifest.splits.get("train", {})
    return {
        "variant": name,
        "manifest_uri": summary["manifest_uri"],
        "docs": train_split.get("docs", 0),  # the training split's: what the epochs are counted over
        "tokens": train_split.get("tokens", 0),
        "runs": [],
        "status": "ok",
    }


def _failed(row: dict[str, Any], stage: str, exc: BaseException) -> dict[str, Any]:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    get_run_logger().warning("variant %s failed to %s: %s", row["variant"], stage, first)
    return row | {"status": f"failed to {stage}: {first}"}


def artifact_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table artifact: one row per variant and metric (the runs' columns repeated), flat values."""
    out = []
    for r in rows:
        run = {k: r[k] for k in ("variant", "docs", "tokens", "seeds", "tokens_seen", "docs_seen", "epochs")}
        for name, m in (r.get("metrics") or {"-": {}}).items():
            out.append(run | {"metric": name} | {k: m.get(k) for k in ("mean", "ci", "item_ci", "delta")})
            out[-1] |= {k: m.get(k) for k in ("delta_ci", "delta_item_ci", "within_noise")}
            out[-1]["status"] = r["status"]
    return out


def publish_table(rows: list[dict[str, Any]], budget: str) -> str:
    """The table artifact and a markdown artifact with both tables and the eval loss chart; returns the
    markdown."""
    create_table_artifact(artifact_rows(rows), key="ablation", description=f"Ablation: {budget}")
    lines = [
        "# Ablation",
        "",
        budget,
        "",
        "| variant | docs | tokens | seeds | tokens seen | docs seen | epochs | status |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        cells = [r[k] for k in ("variant", "docs", "tokens", "seeds", "tokens_seen", "docs_seen", "epochs")]
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in [*cells, r["status"]]) + " |")
    lines += [
        "",
        "| variant | metric | mean | 95% CI seeds | 95% CI items | delta | paired CI seeds | paired CI items "
        "| vs base |",
        "|---|---|---:|---|---|---:|---|---|---|",
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in metric_cells(rows)]
    done = [r for r in rows if r["eval_loss"] is not None]
    if done:
        svg = bar_chart(
            [r["variant"] for r in done],
            {"eval loss": [r["eval_loss"] for r in done]},
            title="Eval loss per variant (lower is better)",
            value_label="eval loss",
            value_format=lambda v: f"{v:.3f}",
        )
        lines += ["", markdown_image(svg, "eval loss per variant")]
    markdown = "\n".join(lines) + "\n"
    create_markdown_artifact(markdown, key="ablation-chart", description="Ablation: metrics per variant")
    return markdown


def _run_name() -> str:
    from prefect.runtime import flow_run

    params = flow_run.parameters
    return f"ablate {params.get('tokens') or params.get('steps')} {'tokens' if params.get('tokens') else 'steps'}"


def _run_once(
    row: dict[str, Any], seed: int, out: str, eval_data: str, tasks: list[str] | None, **train_args: Any
) -> None:
    train(row["manifest_uri"], **train_args)
    result = evaluate(f"{out}/checkpoints", eval_data, tasks=tasks)
    row["runs"].append({"seed": seed, "loss": float(result["loss"]), "tasks": result.get("tasks", {})})


@flow(name="ablate", flow_run_name=_run_name, persist_result=False)
def ablate(
    eval_data: str,
    tokens: int | None,
    variants: list[str],
    base_config: str | None = None,
    base_overrides: dict[str, Any] | None = None,
    inputs: list[str] | None = None,
    output: str | None = None,
    seeds: int = 3,
    first_seed: int = 1234,
    train_config: str | None = None,
    train_overrides: dict[str, Any] | None = None,
    nproc: int = 1,
    workdir: str = "runs/ablate",
    timeout_s: float | None = None,
    tasks: list[str] | None = None,
    steps: int | None = None,
) -> dict[str, Any]:
    """Build the base and each variant, train and evaluate each, publish and return the table.

    The budget: ``tokens`` per run (equal tokens) or ``steps`` per run (equal steps), exactly one of them."""
    parsed, base_over = parse_variants(variants), dict(base_overrides or {}) | {"pin_tokenizer": True}
    check_inputs(base_config, base_over, parsed, eval_data, tasks)
    cfg = resolved_train_config(train_config, train_overrides)
    per_step = tokens_per_step(cfg, nproc)
    n_steps, budget = budget_steps(tokens, steps, per_step)
    seed_values = seed_list(seeds, first_seed)
    run_dir = Path(workdir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    results = build_variants(base_config, base_over, parsed, {"inputs": inputs, "output": output}, cfg)
    try:
        for row in (r for r in results if r["status"] == "ok"):
            for seed in seed_values:
                out = str(run_dir / row["variant"] / f"seed-{seed}")
                over = _train_overrides(dict(train_overrides or {}), cfg, n_steps, seed, out)
                try:
                    _run_once(
                        row,
                        seed,
                        out,
                        eval_data,
                        tasks,
                        config_path=train_config,
                        nproc=nproc,
                        overrides=over,
                        timeout_s=timeout_s,
                    )
                except Exception as exc:  # one variant's failure is its row's status; the others still report
                    row.update(_failed(row, "train", exc) | {"runs": []})
                    break
    except BaseException:
        if shutdown.STOPPING.is_set():  # each run's folder is new: a rerun trains its runs again
            shutdown.say_how_to_go_on(
                "rerun the same command to resume from the completed units (its training runs start again)"
            )
        raise
    rows = table_rows(results, tokens_seen=n_steps * per_step)
    said = budget_line(budget, n_steps, per_step, seed_values)
    markdown = publish_table(rows, said)
    get_run_logger().info("ablation:\n%s", format_table(rows, said))
    return {
        "rows": rows,
        "budget": budget,
        "budget_line": said,
        "steps": n_steps,
        "tokens_per_step": per_step,
        "seeds": seed_values,
        "run_dir": str(run_dir),
        "markdown": markdown,
    }


def budget_steps(tokens: int | None, steps: int | None, per_step: int) -> tuple[int, str]:
    """(steps per run, "tokens" or "steps"): from a token budget, or the steps as given."""
    if (tokens is None) == (steps is None):
        raise ValueError("give the budget per run as --tokens N or as --steps N (one of them)")
    if steps is not None:
        if steps < 2:
            raise ValueError(f"--steps must be >= 2 (warm-up needs a step before the last); got {steps}")
        return steps, "steps"
    assert tokens is not None
    return steps_for_tokens(tokens, per_step), "tokens"


def build_variants(
    config: str | None,
    base_over: dict[str, Any],
    variants: list[Variant],
    where: dict[str, Any],
    cfg: TrainConfig,
) -> list[dict[str, Any]]:
    """The base build, then each variant's with the base's tokenizer; a variant that fails is a failed row (the
    base's failure ends the run: there is nothing to compare with)."""
    base = _build(BASE, config, base_over, cfg, **where)
    manifest, _ = load_manifest(base["manifest_uri"], cfg.s3)
    tokenizer = f"{base['manifest_uri'].rsplit('/', 1)[0]}/{manifest.tokenizer.key}"
    results = [base]
    for v in variants:
        over = base_over | v.overrides | {"tokenize.tokenizer": tokenizer}
        try:
            results.append(_build(v.name, config, over, cfg, **where))
        except Exception as exc:  # reported in the table, not raised
            results.append(_failed({"variant": v.name, "runs": []}, "build", exc))
    return results
