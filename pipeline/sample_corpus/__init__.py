"""Where the bundled sample corpus lives (installed as package data, so it works from a wheel too);
``build_sample`` is the script that rebuilt it from Debian's documentation packages (PROVENANCE.md)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def sample_corpus_path() -> Path:
    """The folder holding the sample corpus (``*.jsonl.zst``, ``licenses/``, ``legacy/``; see PROVENANCE.md).

    ``pipeline`` is a regular (non-zip) package, so the resource is a real folder on disk that ingest can read.
    """
    path = Path(str(resources.files("pipeline.sample_corpus")))
    if not path.is_dir():
        raise FileNotFoundError(f"the sample corpus is missing from the installed package (looked in {path})")
    return path
