"""The arithmetic of an ablation, apart from Prefect: variant specs, the equal token budget, the table.

A variant is ``NAME=k=v[,k=v...]`` (``NAME=--set k=v,...`` reads the same): corpus config overrides on top of
the base's, split at the commas that start a new ``key=`` (so ``clean.url.blocklist=[a,b]`` stays one value).
Every variant trains for the same number of steps, so on the same number of tokens: ``ceil(tokens / tokens per
step)`` (``--tokens``) or ``--steps`` as given, tokens per step being the global batch times ``seq_len``; the
table says which budget was fixed, and for each variant the tokens and documents its runs saw and the epochs
over its training split (a small variant repeated is another experiment than a large one seen once).

Each metric (eval loss; each task's ``acc``, ``acc_norm``, ``prob``) of a variant is the mean over its seeds with
a 95% t-interval over the seeds and, for task scores, a 95% bootstrap interval over the task's items. Its
difference to the base is paired: run by run on the same seed, a t-interval over the seeds' differences and, for
task scores, a bootstrap over the same items of the seed-averaged difference. A difference is *within noise* when
either interval holds 0 (:mod:`training.intervals`).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.config import check_name, parse_overrides
from training.intervals import Interval, bootstrap_interval, holds_zero, t_interval

BASE = "base"
TASK_METRICS = ("acc", "acc_norm", "prob")
LOSS = "eval_loss"
_NEXT_KEY = re.compile(r",(?=\s*[A-Za-z_][\w.]*=)")


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict[str, Any] = field(default_factory=dict)


def parse_variant(spec: str) -> Variant:
    """``NAME=k=v,k=v`` (or ``NAME=--set k=v,k=v``, or ``NAME=`` for the base config as it is)."""
    name, sep, rest = spec.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"--variant expects NAME=key=value[,key=value]; got {spec!r}")
    check_name(name)  # a folder and a dataset name suffix: the same rule
    if name == BASE:
        raise ValueError(f"--variant {spec!r}: {BASE!r} is the base config's own name; pick another")
    rest = rest.strip().removeprefix("--set").strip()
    items = [item.strip() for item in _NEXT_KEY.split(rest)] if rest else []
    return Variant(name, parse_overrides(items, flag=f"--variant {name}"))


def parse_variants(specs: Sequence[str]) -> list[Variant]:
    variants = [parse_variant(s) for s in specs]
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"--variant names must differ, got {names}")
    return variants


def steps_for_tokens(tokens: int, tokens_per_step: int) -> int:
    """Training steps that see at least ``tokens`` tokens (the same for every variant)."""
    if tokens < 1 or tokens_per_step < 1:
        raise ValueError(
            f"--tokens must be >= 1 and a step must hold tokens; got {tokens}, {tokens_per_step}"
        )
    return max(2, math.ceil(tokens / tokens_per_step))  # warm-up needs a step before the last


def seed_list(seeds: int, first: int) -> list[int]:
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    return [first + i for i in range(seeds)]


def budget_line(budget: str, steps: int, tokens_per_step: int, seeds: Sequence[int]) -> str:
    """What was held equal across runs, in words: ``equal tokens: 20 steps x 2,048 tokens = 40,960 per run``."""
    return (
        f"equal {budget}: every run trains {steps} steps x {tokens_per_step:,} tokens = "
        f"{steps * tokens_per_step:,} tokens; seeds {list(seeds)} (paired with the base's)"
    )


def run_metrics(run: Mapping[str, Any]) -> dict[str, tuple[float, list[float] | None]]:
    """A run's metrics: name -> (value, per-item scores or None): the eval loss and each task's scores."""
    out: dict[str, tuple[float, list[float] | None]] = {LOSS: (float(run["loss"]), None)}
    for task, scores in (run.get("tasks") or {}).items():
        for metric in TASK_METRICS:
            if metric in scores:
                out[f"{task}.{metric}"] = (float(scores[metric]), list(scores["per_item"][metric]))
    return out


def _rounded(interval: Interval | None) -> list[float] | None:
    return [round(interval[0], 4), round(interval[1], 4)] if interval is not None else None


def metric_summary(
    runs: Mapping[int, Mapping[str, Any]], base: Mapping[int, Mapping[str, Any]] | None, name: str
) -> dict[str, Any]:
    """One metric of one variant: mean and intervals over its runs (by seed), the paired difference to the base."""
    values = {seed: run_metrics(r)[name] for seed, r in runs.items()}
    means = [v for v, _ in values.values()]
    items = [p for _, p in values.values() if p is not None]
    out: dict[str, Any] = {
        "mean": round(statistics.fmean(means), 4),
        "ci": _rounded(t_interval(means)),
        "item_ci": _rounded(bootstrap_interval(np.array(items))) if items else None,
        "delta": None,
        "delta_ci": None,
        "delta_item_ci": None,
        "within_noise": None,
    }
    paired = sorted(set(values) & set(base or {}))
    if base is None or not paired:
        return out
    theirs = {seed: run_metrics(base[seed])[name] for seed in paired}
    diffs = [values[s][0] - theirs[s][0] for s in paired]
    delta_ci = t_interval(diffs)
    item_diffs = []
    for seed in paired:
        mine, base_items = values[seed][1], theirs[seed][1]
        if mine is not None and base_items is not None:  # the same items, in the same order
            item_diffs.append(np.subtract(mine, base_items))
    delta_item_ci = bootstrap_interval(np.array(item_diffs)) if item_diffs else None
    verdicts = [v for v in (holds_zero(delta_ci), holds_zero(delta_item_ci)) if v is not None]
    return out | {
        "delta": round(statistics.fmean(diffs), 4),
        "delta_ci": _rounded(delta_ci),
        "delta_item_ci": _rounded(delta_item_ci),
        "within_noise": any(verdicts) if verdicts else None,
    }


def _by_seed(result: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    return {int(r["seed"]): r for r in result.get("runs") or []}


def table_rows(results: Sequence[Mapping[str, Any]], tokens_seen: int | None = None) -> list[dict[str, Any]]:
    """One row per variant: documents and tokens of its training split, the tokens and documents each run saw
    and the epochs that makes, then every metric with its intervals and paired difference to the base (see the
    module docstring), the old flat loss columns, and the status (``ok`` or ``failed: <why>``)."""
    base_result = next((r for r in results if r["variant"] == BASE and r.get("runs")), None)
    base = _by_seed(base_result) if base_result else None
    rows = []
    for r in results:
        runs = _by_seed(r)
        names = list(run_metrics(next(iter(runs.values())))) if runs else []
        metrics = {n: metric_summary(runs, base, n) for n in names}
        losses = [float(run["loss"]) for run in runs.values()]
        loss = metrics.get(LOSS)
        epochs = tokens_seen / r["tokens"] if tokens_seen and r.get("tokens") else None
        rows.append(
            {
                "variant": r["variant"],
                "docs": r.get("docs"),
                "tokens": r.get("tokens"),
                "seeds": len(runs),
                "tokens_seen": tokens_seen if runs else None,
                "epochs": round(epochs, 3) if epochs is not None and runs else None,
                "docs_seen": round(epochs * r["docs"])
                if epochs is not None and runs and r.get("docs")
                else None,
                "eval_loss": loss["mean"] if loss else None,
                "eval_ppl": round(math.exp(loss["mean"]), 2) if loss else None,
                "loss_std": round(statistics.stdev(losses), 4) if len(losses) > 1 else None,
                "loss_range": [round(min(losses), 4), round(max(losses), 4)] if losses else None,
                "delta_vs_base": loss["delta"] if loss else None,
                "metrics": metrics,
                "status": r.get("status", "ok"),
            }
        )
    return rows


def _aligned(heads: list[str], cells: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return lines


def verdict(metric: Mapping[str, Any]) -> str:
    if metric["within_noise"] is None:
        return "-" if metric["delta"] is None or metric["delta"] == 0 else "no interval (1 seed)"
    return "within noise" if metric["within_noise"] else "beyond noise"


def metric_cells(rows: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """One line per variant and metric: mean, intervals, paired difference and the verdict."""
    cells = []
    for r in rows:
        for name, m in (r.get("metrics") or {}).items():
            if r["variant"] == BASE:
                delta = ["-", "-", "-", "-"]
            else:
                delta = [
                    f"{m['delta']:+.4f}" if m["delta"] is not None else "-",
                    _cell(m["delta_ci"]),
                    _cell(m["delta_item_ci"]),
                    verdict(m),
                ]
            cells.append([r["variant"], name, _cell(m["mean"]), _cell(m["ci"]), _cell(m["item_ci"]), *delta])
    return cells


def format_table(rows: Sequence[Mapping[str, Any]], budget: str | None = None) -> str:
    """The tables as aligned text for the terminal: the runs (what each variant trained on), then every metric."""
    run_heads = ["variant", "docs", "tokens", "seeds", "tokens seen", "docs seen", "epochs", "status"]
    run_keys = ["variant", "docs", "tokens", "seeds", "tokens_seen", "docs_seen", "epochs", "status"]
    lines = [budget] if budget else []
    lines += _aligned(run_heads, [[_cell(r.get(k)) for k in run_keys] for r in rows])
    metric_rows = metric_cells(rows)
    if metric_rows:
        heads = ["variant", "metric", "mean", "95% CI seeds", "95% CI items", "delta", "paired CI seeds"]
        heads += ["paired CI items", "vs base"]
        lines += ["", *_aligned(heads, metric_rows)]
        lines.append(
            "CI seeds: t-interval over seeds; CI items: bootstrap over task items; paired: the same seeds and "
            "items as the base; within noise: an interval holds 0"
        )
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, list) and len(value) == 2:
        return f"[{_cell(float(value[0]))}, {_cell(float(value[1]))}]"
    return str(value)
