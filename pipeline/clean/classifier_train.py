"""Train a fastText quality classifier on examples the user gives (``pileworks quality train``).

Positives (``hq``: a reference set, e.g. the user's documentation or a curated subset) against negatives
(``lq``: e.g. a random sample of the corpus, ``negative_sample``). Every text is normalised as clean normalises
it (``normalize_text`` with the corpus's clean config) and flattened to one line as clean flattens it before
scoring (:func:`pipeline.clean.classifier.flatten`, the first ``max_chars`` characters as ``clean.classifier.max_chars``
scores), so the model is trained on what it will score. A
deterministic held-out split (by a hash of the text) measures precision, recall (at score 0.5) and ROC AUC; the
metrics are saved beside the model (``<model>.metrics.json``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fasttext
import numpy as np

from pipeline.clean.classifier import QualityModel, flatten
from pipeline.clean.config import LABEL_PREFIX, CleanConfig
from pipeline.clean.normalize import normalize_text
from pipeline.storage import local_temp_prefix


@dataclass(frozen=True, kw_only=True)
class ClassifierTrainConfig:
    """fastText's supervised settings (small and deterministic: one thread, a fixed seed) and the split."""

    label: str = "hq"  # the positives' label (the one ``clean.classifier.label`` reads)
    negative_label: str = "lq"
    epoch: int = 25
    lr: float = 0.2
    word_ngrams: int = 2
    dim: int = 64
    min_count: int = 1
    bucket: int = 65_536  # hashed n-gram rows: the model is about bucket x dim x 4 bytes (16 MiB)
    holdout_fraction: float = 0.1
    negative_sample: int | None = None  # draw this many negatives (deterministically) from the inputs given
    # train on what clean.classifier.max_chars scores: each text's first characters
    max_chars: int | None = 1000
    seed: int = 0
    clean: CleanConfig = field(default_factory=CleanConfig)  # the normalisation clean applies

    def __post_init__(self) -> None:
        for name in ("label", "negative_label"):
            value = getattr(self, name)
            if not value or any(c.isspace() for c in value) or value.startswith(LABEL_PREFIX):
                raise ValueError(f"{name} must be one word without spaces or {LABEL_PREFIX}, got {value!r}")
        if self.label == self.negative_label:
            raise ValueError(f"label and negative_label must differ, both are {self.label!r}")
        for name in ("epoch", "dim", "min_count", "word_ngrams", "bucket"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.lr <= 10.0:
            raise ValueError(f"lr must be in (0, 10], got {self.lr}")
        if not 0.0 <= self.holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction must be in [0, 1), got {self.holdout_fraction}")
        if self.max_chars is not None and self.max_chars < 1:
            raise ValueError(f"max_chars must be >= 1 or None, got {self.max_chars}")
        if self.negative_sample is not None and self.negative_sample < 1:
            raise ValueError(f"negative_sample must be >= 1, got {self.negative_sample}")


def prepare(texts: Sequence[str], clean: CleanConfig, max_chars: int | None = None) -> list[str]:
    """Normalised as clean does, cut to ``max_chars`` and flattened to one line as scoring does; blank texts
    left out."""
    counts: Counter[str] = Counter()
    return [line for t in texts if (line := flatten(normalize_text(t, clean, counts), max_chars))]


def _rank_key(text: str, seed: int) -> bytes:
    return hashlib.blake2b(
        text.encode("utf-8", "surrogatepass"), digest_size=8, salt=seed.to_bytes(8, "little")
    ).digest()


def sample_texts(texts: Sequence[str], n: int, seed: int) -> list[str]:
    """``n`` of ``texts`` chosen by a seeded hash of each text: the same choice for the same texts in any order."""
    return sorted(texts, key=lambda t: _rank_key(t, seed))[:n]


def is_held_out(text: str, fraction: float, seed: int) -> bool:
    return int.from_bytes(_rank_key(text, seed + 1), "little") % 1_000_000 < round(fraction * 1_000_000)


def roc_auc(scores: Sequence[float], positive: Sequence[bool]) -> float | None:
    """ROC AUC (the Mann-Whitney statistic, ties counted half); None without both classes."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(s, kind="stable")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_s = s[order]
    first = np.searchsorted(sorted_s, sorted_s, side="left")
    last = np.searchsorted(sorted_s, sorted_s, side="right")
    ranks[order] = (first + last + 1) / 2.0  # average 1-based rank of each tie group
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def heldout_metrics(
    scores: Sequence[float], positive: Sequence[bool], threshold: float = 0.5
) -> dict[str, Any]:
    s, y = np.asarray(scores) >= threshold, np.asarray(positive, dtype=bool)
    tp, fp, fn = int((s & y).sum()), int((s & ~y).sum()), int((~s & y).sum())
    auc = roc_auc(scores, positive)
    return {
        "heldout_positive": int(y.sum()),
        "heldout_negative": int((~y).sum()),
        "threshold": threshold,
        "precision": round(tp / (tp + fp), 6) if tp + fp else None,
        "recall": round(tp / (tp + fn), 6) if tp + fn else None,
        "auc": round(auc, 6) if auc is not None else None,
    }


def train_classifier(
    positive: Sequence[str], negative: Sequence[str], out: str | Path, cfg: ClassifierTrainConfig
) -> dict[str, Any]:
    """Train on ``positive`` vs ``negative`` texts, write the model to ``out`` and its metrics beside it
    (``<out>.metrics.json``); returns the metrics."""
    pos, neg = prepare(positive, cfg.clean, cfg.max_chars), prepare(negative, cfg.clean, cfg.max_chars)
    if cfg.negative_sample is not None:
        neg = sample_texts(neg, cfg.negative_sample, cfg.seed)
    for name, texts in (("positive", pos), ("negative", neg)):
        if not texts:
            raise ValueError(f"the {name} examples hold no text: a classifier needs both classes")
    rows = [(t, True) for t in pos] + [(t, False) for t in neg]
    train = [r for r in rows if not is_held_out(r[0], cfg.holdout_fraction, cfg.seed)]
    held = [r for r in rows if is_held_out(r[0], cfg.holdout_fraction, cfg.seed)]
    if len({y for _, y in train}) < 2:
        raise ValueError("after the held-out split one class has no training text; give more examples")
    model = _fit(train, cfg)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model.save_model(str(out))
    scorer = QualityModel(out.read_bytes(), LABEL_PREFIX + cfg.label, str(out))
    metrics = {
        "model": str(out),
        "sha256": scorer.sha256,
        "label": cfg.label,
        "train_positive": sum(y for _, y in train),
        "train_negative": sum(not y for _, y in train),
        **heldout_metrics(scorer.score([t for t, _ in held]), [y for _, y in held]),
    }
    Path(f"{out}.metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def _fit(rows: Sequence[tuple[str, bool]], cfg: ClassifierTrainConfig) -> Any:
    ordered = sorted(rows, key=lambda r: _rank_key(r[0], cfg.seed + 2))  # shuffled, the same on every run
    fd, path = tempfile.mkstemp(prefix=local_temp_prefix("pw-fasttext-") + "train-", suffix=".txt")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for text, pos in ordered:
                f.write(f"{LABEL_PREFIX}{cfg.label if pos else cfg.negative_label} {text}\n")
        return _fit_once(path, cfg)
    finally:
        os.unlink(path)


def _fit_once(path: str, cfg: ClassifierTrainConfig) -> Any:
    return fasttext.train_supervised(
        input=path,
        epoch=cfg.epoch,
        lr=cfg.lr,
        wordNgrams=cfg.word_ngrams,
        dim=cfg.dim,
        minCount=cfg.min_count,
        bucket=cfg.bucket,
        seed=cfg.seed,
        thread=1,  # one thread: the same model on every run
        verbose=0,
    )
