"""Model-based quality: a fastText classifier's score for every document (``clean.classifier``).

The model is any fastText supervised ``.bin`` (one trained with ``pileworks quality train``, or a published one
such as DCLM's), read from a local path, ``file://``, ``s3://``, ``gs://`` or ``az://``; ``label`` names the
class whose probability is the document's ``quality_score`` (kept in its meta and published in every shard's
``docs.parquet``).

A document is scored on the text clean publishes (normalised, boilerplate lines out, redacted): its first
``max_chars`` characters (1,000 by default; null: all), flattened to one line as fastText's ``predict``
requires: every run of whitespace (newlines included) becomes one space (:func:`flatten`). ``pileworks quality train`` normalises its examples with the same clean config and flattens
them the same way, so the model sees in use what it saw in training.

Either ``min_score`` (a document under it is dropped in clean, reason ``classifier_low``) or ``keep_fraction``
(the best-scored fraction of each source is kept: clean scores every part, a global step ranks each source's
scores, then a filter drops the rest under ``classifier_low``; ties are broken by document id, so the count kept
is exact and the same on every run). The model's sha256 is pinned when a build starts (``pin_classifier``) and
is part of the config, so of the unit keys and the dataset id; a worker that finds other bytes at the model's
URI fails the build naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import fasttext

from pipeline.clean.config import ClassifierConfig
from pipeline.storage import S3Options, local_temp_prefix, read_object

FIELD = "clean.classifier.model"


def flatten(text: str, max_chars: int | None = None) -> str:
    """One line for fastText: the first ``max_chars`` characters (None: all), every run of whitespace in them
    (newlines, tabs, Unicode spaces) made one space."""
    return " ".join((text if max_chars is None else text[:max_chars]).split())


class QualityModel:
    """A loaded fastText model and the label whose probability is the score."""

    def __init__(self, data: bytes, label: str, where: str, sha256: str | None = None) -> None:
        self.sha256 = sha256 or hashlib.sha256(data).hexdigest()
        self.model = _load_fasttext(data, where)
        labels = list(self.model.get_labels())
        if label not in labels:
            raise ValueError(f"{where}: the model has no label {label!r} (its labels: {', '.join(labels)})")
        self.label, self.labels = label, labels

    def score(self, texts: Sequence[str], max_chars: int | None = None) -> list[float]:
        """The probability of the label for each text (its first ``max_chars`` characters, flattened)."""
        # The binding's per-line predict (what fastText's Python ``predict`` calls for one string) returns plain
        # (probability, label) pairs: under numpy 2, fasttext-wheel's ``predict`` fails on one string
        # (``np.array(copy=False)``) and returns wrong probabilities for a list (an array built for numpy 1).
        predict = self.model.f.predict
        return [
            _label_prob(predict(flatten(t, max_chars) + "\n", -1, 0.0, "replace"), self.label) for t in texts
        ]


def _label_prob(pairs: Sequence[tuple[float, str]], label: str) -> float:
    # fastText's softmax can return 1.00001 (it adds 1e-5 before the log); a score is a probability
    for prob, name in pairs:
        if name == label:
            return min(1.0, max(0.0, float(prob)))
    return 0.0


def _load_fasttext(data: bytes, where: str) -> Any:
    fd, path = tempfile.mkstemp(prefix=local_temp_prefix("pw-fasttext-"), suffix=".bin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:  # quiet: fasttext-wheel prints a deprecation note on stderr at every load
            with contextlib.redirect_stderr(io.StringIO()):
                return fasttext.load_model(path)
        except (ValueError, RuntimeError, MemoryError) as exc:
            raise ValueError(f"{where} is not a fastText model ({exc})") from exc
    finally:
        os.unlink(path)


_MODELS: dict[tuple[str, str], QualityModel] = {}  # (sha256, label): a process loads each model once


def _model(data: bytes, sha256: str, label: str, where: str) -> QualityModel:
    key = (sha256, label)
    if key not in _MODELS:
        if len(_MODELS) >= 4:
            _MODELS.pop(next(iter(_MODELS)))
        _MODELS[key] = QualityModel(data, label, where, sha256)
    return _MODELS[key]


def load_classifier(cfg: ClassifierConfig, s3: S3Options | None) -> QualityModel:
    """The model of ``cfg`` (loaded once per process and content); refuses bytes other than ``cfg.sha256``."""
    data = read_object(cfg.model, s3, FIELD)
    found = hashlib.sha256(data).hexdigest()  # once per read: the pin check and the cache key
    if cfg.sha256 is not None and found != cfg.sha256:
        raise ValueError(
            f"{FIELD}: {cfg.model} changed (sha256 {found[:12]}..., the build pinned {cfg.sha256[:12]}...); "
            "rerun the build to use the new model"
        )
    return _model(data, found, cfg.fasttext_label, cfg.model)


def pin_classifier(cfg: ClassifierConfig, s3: S3Options | None) -> ClassifierConfig:
    """``cfg`` with the model's sha256, after checking it loads and has the label (a build does this first)."""
    model = load_classifier(cfg, s3)
    return replace(cfg, sha256=model.sha256)
