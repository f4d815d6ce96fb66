"""The arithmetic of an ablation, apart from Prefect: variant specs, the equal token budget, the table.

A variant is ``NAME=k=v[,k=v...]`` (``NAME=--set k=v,...`` reads the same): corpus config overrides on top of
the base's, split at the commas that start a new ``key=`` (so ``clean.url.blocklist=[a,b]`` stays one value).
Every variant trains for the same number of steps, so on the same number of tokens: ``ceil(tokens / tokens per
step)``, tokens per step being the global batch times ``seq_len``. With several seeds, a variant's loss is their
mean and its spread the sample standard deviation (and the min-max range), so a difference smaller than the
spread reads as noise.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.config import check_name, parse_overrides

BASE = "base"
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


def table_rows(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per variant: documents and tokens kept, eval loss (mean over seeds) and perplexity, its spread,
    the difference to the base, and the status (``ok`` or ``failed: <why>``)."""
    base = next((r for r in results if r["variant"] == BASE and r.get("losses")), None)
    base_loss = statistics.fmean(base["losses"]) if base else None
    rows = []
    for r in results:
        losses = list(r.get("losses") or [])
        mean = statistics.fmean(losses) if losses else None
        std = statistics.stdev(losses) if len(losses) > 1 else None
        rows.append(
            {
                "variant": r["variant"],
                "docs": r.get("docs"),
                "tokens": r.get("tokens"),
                "seeds": len(losses),
                "eval_loss": round(mean, 4) if mean is not None else None,
                "eval_ppl": round(math.exp(mean), 2) if mean is not None else None,
                "loss_std": round(std, 4) if std is not None else None,
                "loss_range": [round(min(losses), 4), round(max(losses), 4)] if losses else None,
                "delta_vs_base": round(mean - base_loss, 4)
                if mean is not None and base_loss is not None
                else None,
                "status": r.get("status", "ok"),
            }
        )
    return rows


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The table as aligned text for the terminal."""
    heads = ["variant", "docs", "tokens", "seeds", "eval loss", "ppl", "std", "delta", "status"]
    keys = [
        "variant",
        "docs",
        "tokens",
        "seeds",
        "eval_loss",
        "eval_ppl",
        "loss_std",
        "delta_vs_base",
        "status",
    ]
    cells = [[_cell(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)
