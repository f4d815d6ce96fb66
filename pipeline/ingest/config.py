"""Ingest's config and plan types: formats by suffix, :class:`IngestConfig`, and the fingerprinted inputs and
part plans the stage passes between its steps (small, frozen, JSON-serialisable)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

from pipeline.ingest.html import HtmlConfig

FORMATS = (
    "txt",
    "txt.gz",
    "txt.zst",
    "jsonl",
    "jsonl.gz",
    "jsonl.zst",
    "parquet",
    "warc",
    "warc.gz",
    "wet",
    "wet.gz",
    "arc",
    "arc.gz",
)
WEB_FORMATS = ("warc", "warc.gz", "wet", "wet.gz", "arc", "arc.gz")
DEFAULT_EXTENSIONS: Mapping[str, str] = MappingProxyType(
    {
        ".txt": "txt",
        ".txt.gz": "txt.gz",
        ".txt.zst": "txt.zst",
        ".jsonl": "jsonl",
        ".ndjson": "jsonl",
        ".jsonl.gz": "jsonl.gz",
        ".json.gz": "jsonl.gz",
        ".jsonl.zst": "jsonl.zst",
        ".json.zst": "jsonl.zst",
        ".parquet": "parquet",
        ".warc": "warc",
        ".warc.gz": "warc.gz",
        ".wet": "wet",
        ".wet.gz": "wet.gz",
        ".arc": "arc",
        ".arc.gz": "arc.gz",
    }
)
# Planning weighs pieces by the text they will produce (that is what a part holds in memory), estimating
# compressed inputs (gz, zst, parquet) at 4x their size, a typical ratio for text, without opening them.
COMPRESSION_ESTIMATE = 4


@dataclass(frozen=True, kw_only=True)
class IngestConfig:
    """How raw objects become documents. ``extensions`` maps a file-name suffix to one of :data:`FORMATS`."""

    txt_mode: str = "file"  # "file": one document per file; "paragraph": blank-line separated blocks
    text_field: str = "text"
    meta_field: str = "meta"
    id_field: str | None = None  # take record ids from this field instead of "<uri>#<position>"
    target_part_bytes: int = 32 * 1024 * 1024
    max_doc_bytes: int = 10 * 1024 * 1024
    min_detect_confidence: float = 0.8
    # A chunk of otherwise valid UTF-8 with invalid bytes: "replace" them with U+FFFD (keeping every valid
    # character, counted as repaired_invalid_utf8) or "quarantine" the whole line/paragraph (invalid_utf8).
    invalid_utf8: str = "replace"
    extensions: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_EXTENSIONS))
    # WARC/WET: a record whose block is larger is quarantined (record_too_large) without being read into memory
    # (Common Crawl truncates payloads at 1 MiB; a 200 MB record is an archived video or a broken crawl).
    max_record_bytes: int = 32 * 1024 * 1024
    html: HtmlConfig = field(default_factory=HtmlConfig)  # how a WARC's HTML payloads become text
    # The jsonl/parquet field holding a document's URL (copied to its meta's "url", which the URL rules of
    # clean and docs.parquet read); None: none. WARC/WET records take theirs from WARC-Target-URI.
    url_field: str | None = "url"

    def __post_init__(self) -> None:
        if self.txt_mode not in ("file", "paragraph"):
            raise ValueError(f"ingest.txt_mode must be 'file' or 'paragraph', got {self.txt_mode!r}")
        if self.invalid_utf8 not in ("replace", "quarantine"):
            raise ValueError(
                f"ingest.invalid_utf8 must be 'replace' or 'quarantine', got {self.invalid_utf8!r}"
            )
        for name in ("text_field", "meta_field"):
            if not getattr(self, name):
                raise ValueError(f"ingest.{name} must be a non-empty field name")
        if self.id_field is not None and not self.id_field:
            raise ValueError("ingest.id_field must be a field name or None")
        if self.target_part_bytes < 1:
            raise ValueError(f"ingest.target_part_bytes must be >= 1, got {self.target_part_bytes}")
        if self.max_record_bytes < 1:
            raise ValueError(f"ingest.max_record_bytes must be >= 1, got {self.max_record_bytes}")
        if not isinstance(self.html, HtmlConfig):
            raise ValueError("ingest.html must be a section (extractor, options)")
        if self.url_field is not None and not self.url_field:
            raise ValueError("ingest.url_field must be a field name or None")
        if self.max_doc_bytes < 1:
            raise ValueError(f"ingest.max_doc_bytes must be >= 1, got {self.max_doc_bytes}")
        if not 0.0 <= self.min_detect_confidence <= 1.0:
            raise ValueError(
                f"ingest.min_detect_confidence must be in [0, 1], got {self.min_detect_confidence}"
            )
        bad = {
            ext: fmt for ext, fmt in self.extensions.items() if fmt not in FORMATS or not ext.startswith(".")
        }
        if bad:
            raise ValueError(f"ingest.extensions: {bad} must map '.suffix' to one of {FORMATS}")


@dataclass(frozen=True, kw_only=True)
class InputFile:
    """One raw object and its fingerprint (recorded in the manifest; a rebuild redoes what changed).

    ``name``: its path under the build's input root (:func:`pipeline.ingest.stage.input_root`), what document ids
    and unit keys hold instead of the URI, so the same files elsewhere give the same ids; ``digest``: the
    ``xxh3-128`` of its bytes (:mod:`pipeline.ingest.digests`), what unit keys hold instead of its ETag/mtime."""

    uri: str
    size: int
    etag: str
    mtime: float
    name: str = ""
    digest: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class Piece:
    """A whole object, bytes ``[start, end)`` of one (txt/jsonl) or row groups ``[start, end)`` (parquet).
    ``uri`` is where it is read; ``name`` (its object's path under the input root) is what its ids hold."""

    uri: str
    fmt: str
    size: int
    start: int = 0
    end: int | None = None  # None: to the end of the object
    weight: int = 0  # bytes this piece accounts for in planning
    entry: int = 0  # the index of the configured source (``CorpusConfig.sources``) the object belongs to
    name: str = ""  # "": a plan made before names, whose ids hold the URI

    def located_json(self) -> dict[str, Any]:
        """The piece without where it lies (its URI): what a unit key holds."""
        return {k: v for k, v in asdict(self).items() if k != "uri"}


@dataclass(frozen=True, kw_only=True)
class PartPlan:
    index: int
    pieces: tuple[Piece, ...]

    @property
    def bytes(self) -> int:
        return sum(p.weight for p in self.pieces)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "pieces": [asdict(p) for p in self.pieces]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartPlan:
        return cls(index=int(data["index"]), pieces=tuple(Piece(**p) for p in data["pieces"]))
