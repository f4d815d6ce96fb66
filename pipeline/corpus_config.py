"""The corpus build config: one YAML file composed of each stage's own frozen config.

Every stage owns its config dataclass (``pipeline.ingest.config.IngestConfig``,
``pipeline.clean.config.CleanConfig``, ...); this module only composes them and loads them through
:mod:`pipeline.config` (the loader training configs use too), so a typo or a wrong value fails at load with the
file and the dotted field name, and a bad dataset name fails before any compute, not at publish.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.clean.config import CleanConfig
from pipeline.config import build_config, check_name, config_to_dict, load_config
from pipeline.dataset.shards import ShardConfig
from pipeline.decontam import DecontamConfig
from pipeline.dedup.config import ExactDedupConfig, NearDedupConfig
from pipeline.ingest.config import IngestConfig
from pipeline.sample_corpus import sample_corpus_path
from pipeline.sources import SourceConfig, check_sources
from pipeline.storage import STORE_URI_HELP, S3Options
from pipeline.tokenize.stage import TokenizeConfig

DEFAULT_CONFIG = Path(__file__).with_name("configs") / "corpus.yaml"


@dataclass(frozen=True, kw_only=True)
class DedupConfig:
    exact: ExactDedupConfig = field(default_factory=ExactDedupConfig)
    near: NearDedupConfig = field(default_factory=NearDedupConfig)


@dataclass(frozen=True, kw_only=True)
class CorpusConfig:
    """``inputs`` empty means the bundled sample corpus; ``output`` is the store root (a path, file://, s3://,
    gs://, az:// or abfs[s]://)."""

    name: str = "sample"
    inputs: tuple[str, ...] = ()
    # Named sources with weights and overrides (pipeline.sources.SourceConfig); empty: ``inputs`` are one
    # source whose documents are named by their meta.pile_set_name (or "default").
    sources: tuple[SourceConfig, ...] = ()
    output: str = "./pileworks-store"
    s3: S3Options = field(default_factory=S3Options)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    decontam: DecontamConfig = field(default_factory=DecontamConfig)
    tokenize: TokenizeConfig = field(default_factory=TokenizeConfig)
    shard: ShardConfig = field(default_factory=ShardConfig)
    # A tokenizer trained on the first build of a dataset name is reused by its rebuilds (same token ids, so
    # only changed parts are re-tokenized). Set false to retrain on every build.
    pin_tokenizer: bool = True
    # How the UI's manifest artifact links an s3:// manifest: "none" (the URI as text), "presigned" (a GET URL
    # valid 7 days, signed locally with your credentials) or "console" (the object's AWS console page).
    manifest_link: str = "none"

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.manifest_link not in ("none", "presigned", "console"):
            raise ValueError(f"manifest_link must be none, presigned or console, got {self.manifest_link!r}")
        if not self.output:
            raise ValueError(f"output must be {STORE_URI_HELP} URI")
        if self.sources and self.inputs:
            raise ValueError(
                "give inputs (one source) or sources (named, weighted), not both; put the inputs in a source"
            )
        check_sources(self.sources)

    def resolved_inputs(self) -> tuple[str, ...]:
        if self.sources:
            return tuple(i for s in self.sources for i in s.inputs)
        return self.inputs or (str(sample_corpus_path()),)

    def resolved_sources(self) -> tuple[SourceConfig, ...]:
        """The configured sources, or one unnamed source holding ``inputs`` (named by meta)."""
        return self.sources or (SourceConfig(inputs=self.resolved_inputs()),)

    def to_dict(self) -> dict[str, Any]:
        data = config_to_dict(self)
        if (
            self.clean.classifier is None
        ):  # off: out of the dict, so the ids of builds without one stay as they were
            del data["clean"]["classifier"]
        return data

    def fingerprint(self) -> str:
        """Hash of everything that changes the output (the store location does not)."""
        data = self.to_dict()
        data.pop("output", None)
        data.pop("s3", None)
        data["code_version"] = __version__
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def load_corpus_config(
    path: str | Path | None = None,
    *,
    inputs: list[str] | None = None,
    output: str | None = None,
    name: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> CorpusConfig:
    """Load YAML/JSON (the embedded default when ``path`` is None), then dotted overrides, then CLI values."""
    cfg = load_config(CorpusConfig, path, overrides, default=DEFAULT_CONFIG)
    changes: dict[str, Any] = {}
    if inputs:
        changes["inputs"] = tuple(inputs)
        changes["sources"] = ()  # --input: one source, as the help says
    if output:
        changes["output"] = output
    if name:
        changes["name"] = name
    return replace(cfg, **changes) if changes else cfg


def config_from_dict(data: dict[str, Any]) -> CorpusConfig:
    return build_config(CorpusConfig, data)
