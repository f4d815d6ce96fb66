"""A tiny raw corpus (a few JSONL files) and config overrides that make a full ``build_corpus`` run quick.

The flow tests (UI, Dask, reaper) need a real build, not the bundled sample: three small files, split into
several parts so every stage fans out, with a planted exact duplicate and a planted near duplicate so both
dedup steps have something to report.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

# fmt: off
WORDS = [
    "river", "stone", "light", "garden", "window", "paper", "morning", "music", "letter", "market",
    "winter", "harbor", "forest", "engine", "silver", "copper", "orchard", "station", "lantern", "meadow",
    "valley", "bridge", "thunder", "candle", "village", "mirror", "ladder",
]
# fmt: on

# Small enough for a 2-core machine to run the whole flow in well under a minute per build.
TINY_OVERRIDES: dict[str, Any] = {
    "name": "tiny",
    "ingest.target_part_bytes": 6144,
    "clean.boilerplate.min_docs": 3,
    "dedup.near.num_perm": 32,
    "tokenize.vocab_size": 300,
    "shard.target_bytes": 4096,
    "shard.valid_fraction": 0.1,
}


def _doc(rng: random.Random, words: int) -> str:
    sentences = []
    while words > 0:
        n = min(words, rng.randint(6, 12))
        # each sentence opens with "The": English enough for Gopher's stop-word rule (two of the, be, to, ...)
        sentences.append("The " + " ".join(rng.choice(WORDS) for _ in range(n)) + ".")
        words -= n
    return "\n".join(sentences)


def write_tiny_corpus(
    folder: Path, *, files: int = 3, docs_per_file: int = 12, seed: int = 7, ids: bool = False
) -> list[str]:
    """Write ``files`` JSONL files of ``docs_per_file`` documents; returns their paths (as strings).

    ``ids``: every record gets an ``id`` field (``f<file>-d<n>``). With ``ingest.id_field=id`` the document ids,
    and so the train/valid split, no longer depend on the folder the corpus was written to."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(files):
        docs = [_doc(rng, rng.randint(70, 130)) for _ in range(docs_per_file)]
        if f == files - 1:
            docs.append(docs[0])  # exact duplicate within the file
            lines = docs[1].split("\n")
            lines[len(lines) // 2] += " zeppelin"  # one word added: a near duplicate
            docs.append("\n".join(lines))
        path = folder / f"part-{f}.jsonl"
        records = [
            {"text": d, "meta": {"file": f}} | ({"id": f"f{f}-d{n}"} if ids else {})
            for n, d in enumerate(docs)
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        paths.append(str(path))
    return paths
