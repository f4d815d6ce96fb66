"""The quality classifier's scoring cost against the clean stage's, CPU seconds per MB (this one process).

The text: the bundled sample corpus's English documents and licences, repeated to ``--mb`` MB, in documents as
the corpus has them. The model: one trained here by ``pileworks quality train``'s code (documentation vs
licences, fastText's defaults of ``ClassifierTrainConfig``: dim 64, word bigrams, 65,536 buckets). It times
``clean_batch`` as a build runs it (text normalised at ingest, boilerplate off, the quality rules and language
identification on) and, apart, the classifier's ``score`` (flatten to one line + fastText predict) over the texts
clean kept. Run: ``.venv/bin/python tests/bench/bench_classifier.py [--mb 20]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

from pipeline.clean.classifier import load_classifier
from pipeline.clean.classifier_train import ClassifierTrainConfig, train_classifier
from pipeline.clean.config import ClassifierConfig, CleanConfig
from pipeline.clean.normalize import normalize_text
from pipeline.clean.stage import clean_batch
from pipeline.records import Record
from tests.bench.bench_clean import sample_english
from tests.fixtures.quality_texts import documentation_texts, license_texts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=20.0)
    args = ap.parse_args()
    base = sample_english()
    texts, size = [], 0
    while size < args.mb * 1e6:
        for t in base:
            texts.append(t)
            size += len(t.encode())
    cfg = CleanConfig()
    counts: Counter[str] = Counter()
    normalized = [normalize_text(t, cfg, counts) for t in texts]  # a build's ingest does this
    records = [Record(f"d#{i}", t, "x.jsonl", "{}") for i, t in enumerate(normalized)]
    start = time.process_time()
    kept = []
    for i in range(0, len(records), 2048):
        out, _ = clean_batch(records[i : i + 2048], cfg, normalized=True)
        kept += out
    clean_s = time.process_time() - start
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "q.bin"
        train_classifier(documentation_texts(600), license_texts(600), path, ClassifierTrainConfig())
        clf = ClassifierConfig(model=str(path), min_score=0.5)
        model = load_classifier(clf, None)
    kept_texts = [r.text for r in kept]
    mb = size / 1e6
    kept_mb = sum(len(t.encode()) for t in kept_texts) / 1e6
    print(f"{mb:.1f} MB in, {len(texts)} documents; clean kept {len(kept)} ({kept_mb:.1f} MB)")
    print(f"clean_batch (as a build runs it): {clean_s:.2f} CPU s = {clean_s / mb:.4f} s/MB")
    for label, cut in (
        (f"max_chars={clf.max_chars} (default)", clf.max_chars),
        ("max_chars=2000", 2000),
        ("max_chars=null (all)", None),
    ):
        start = time.process_time()
        model.score(kept_texts, cut)
        score_s = time.process_time() - start
        print(
            f"classifier score, {label}: {score_s:.2f} CPU s = {score_s / mb:.4f} s per input MB, "
            f"{score_s / clean_s:.1%} of clean's CPU"
        )


if __name__ == "__main__":
    main()
