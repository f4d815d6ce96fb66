"""Language identification: every document gets a language and a score; a source may allow only some.

The model is py3langid's (the maintained fork of langid.py: a naive Bayes over byte n-grams, 97 languages,
its weights shipped inside the PyPI package, so nothing is downloaded at run time). Scores are its normalised
probabilities in [0, 1]. Codes are ISO 639-1 (``en``, ``zh``, ``ja``...), as the model gives them.

Only the first ``sample_chars`` characters are classified: a document's opening is almost always in its
language, and technical text later on (commands, code, untranslated English passages of a partial
translation) pulls long documents towards English. On the bundled sample corpus this is right on 302 of its
310 documents whose language is stated (see ``tests/pipeline/clean/test_langid.py``). Three windows spread over the
document (start, middle, end) were tried: as accurate overall, but Chinese chapters whose later windows are
tables came out as Wu or Cantonese (``wuu``, ``yue``), so the opening it is. Speed: py3langid walks its byte automaton in a Python loop (~1.4 ms per 3,000 characters). The automaton is
Aho-Corasick over byte n-grams, so its state after byte ``i`` depends only on the last ``STATE_DEPTH`` bytes (the
longest trie path); :class:`FastIdentifier` computes every position's state at once, running the automaton
from the root over each position's window as ``STATE_DEPTH - 1`` numpy gathers (the first two bytes in one),
and scores like py3langid: same languages, probabilities within 1e-4 (``tests/pipeline/clean/test_langid.py`` checks both,
and recomputes ``STATE_DEPTH`` from the model). :func:`identify_batch` classifies many documents in one call:
the walk runs over ~32 KB of them at a time and the softmax over all their score rows, each document's rows
summed by the same matrix product as alone, so its score is bitwise that of :func:`identify`. About 105 us per
3,000-character document on this machine (py3langid's own loop: ~1.4 ms); most of what is left is reading each
feature's 142 log-probabilities (~570 bytes) from the 57 MB weight table, and their product.

Where the install found a C compiler, the walk and the counting are compiled (``pipeline/clean/_langid_walk.c``: the
automaton one byte at a time, as py3langid's loop does, in eight interleaved stretches per document, then
each document's distinct features in order with their counts) and the rows and their product stay numpy's
same calls, so every score is bitwise that of the numpy path (tested). On 4,766 documents of the scaling
benchmark's text, scoring takes 0.38 CPU-s instead of 0.51; about 0.3 of it is the rows and their product.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

from pipeline.units.protocol import packed_ranges

walk_kernel: ModuleType | None
try:  # the compiled walk (pipeline/clean/_langid_walk.c), built at install where a C compiler is found
    import pipeline.clean._langid_walk as walk_kernel
except ImportError:  # pragma: no cover - exercised by the tests through monkeypatch
    walk_kernel = None

UNKNOWN = "und"  # ISO 639-2 "undetermined": no letters to go on
_TABLES = ("next_row", "next_feature", "first2", "ptc", "pc")
_TABLES_VERSION = 1  # bump when FastIdentifier's tables change meaning
log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class LangIdConfig:
    """``allow``: the languages kept (empty: all); ``min_score``: documents identified with a lower score
    are dropped (``language_low_score``); the check runs on the first ``sample_chars`` characters."""

    enabled: bool = True
    allow: tuple[str, ...] = ()
    min_score: float = 0.0
    sample_chars: int = 3000

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_score <= 1.0:
            raise ValueError(f"langid.min_score must be in [0, 1], got {self.min_score}")
        if self.sample_chars < 1:
            raise ValueError(f"langid.sample_chars must be >= 1, got {self.sample_chars}")
        unknown = sorted(set(self.allow) - set(languages())) if self.allow else []
        if unknown:
            raise ValueError(
                f"langid.allow: {unknown} are not language codes the model knows; use ISO 639-1 codes "
                f"such as {', '.join(languages()[:8])}..."
            )


WALK_BYTES = 1 << 15  # bytes of documents walked at once: the walk's int32 arrays stay in cache
KERNEL_BYTES = 1 << 20  # bytes of documents the compiled walk takes per call (bounds its output arrays)
STATE_DEPTH = 6  # the deepest state of py3langid's automaton (its longest n-gram feature, in bytes)


@functools.cache
def _identifier() -> LanguageIdentifier:
    """The reference model, loaded once per process (~0.4 s)."""
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


class FastIdentifier:
    """py3langid's ``classify`` (normalised probabilities) with the automaton walk vectorised (see above).

    Three tables make each position's walk five gathers: ``first2`` (the row of the state after two bytes read
    from the start state, for all 65,536 byte pairs), ``next_row`` (the row of the next state, per row entry)
    and ``next_feature`` (the feature of the next state, per row entry). A document is prefixed with
    ``STATE_DEPTH - 1`` bytes that keep the start state where it is, so its first positions walk the same path
    as the others. Counting a document's features sorts them once instead of ``np.unique``'s general path.
    """

    def __init__(self, model: LanguageIdentifier):
        next_state = np.asarray(model.tk_nextmove).astype(np.int32)
        row = np.asarray(model._rowbase, dtype=np.int32)  # the automaton has ~10^5 states, ~10^7 row entries
        feature = np.asarray(model.tk_output).astype(np.int32)
        stay = np.flatnonzero(next_state[row[0] + np.arange(256)] == 0)
        if not stay.size or STATE_DEPTH < 3:
            raise RuntimeError(
                "py3langid's automaton has no byte that keeps its start state; update FastIdentifier"
            )
        self.pad = bytes([int(stay[0])]) * (STATE_DEPTH - 1)
        self.next_row, self.next_feature = row[next_state], feature[next_state]
        byte = np.arange(256, dtype=np.int32)
        self.first2 = self.next_row[(self.next_row[row[0] + byte][:, None] + byte[None, :]).ravel()]
        # the per-feature log-probabilities are widened once from float16 to float32 (exact), which matmul would
        # otherwise do again for every document's rows: that conversion was over half of classify's time.
        self.ptc, self.pc = np.asarray(model.nb_ptc, dtype=np.float32), np.asarray(model.nb_pc)
        self.classes, self.aliases = list(model.nb_classes), [tuple(pair) for pair in model._alias_pairs]
        self.labels = tuple(sorted(model.labels))

    def save(self, folder: Path) -> None:
        """Write the tables into ``folder`` (``.npy`` files and ``meta.json``), atomically: they are written into
        a temporary sibling that is then renamed, so a reader sees all of them or no folder. If another
        process renamed its copy first, this one is dropped."""
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            for name in _TABLES:
                np.save(tmp / f"{name}.npy", getattr(self, name))
            meta = {
                "pad": self.pad.hex(),
                "classes": self.classes,
                "aliases": self.aliases,
                "labels": self.labels,
            }
            (tmp / "meta.json").write_text(json.dumps(meta))
            tmp.rename(folder)
        except OSError:
            if not folder.is_dir():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, folder: Path) -> FastIdentifier:
        """The tables :meth:`save` wrote, memory-mapped: nothing to build, and the processes of one machine
        share their pages."""
        meta = json.loads((folder / "meta.json").read_text())
        fast = cls.__new__(cls)
        for name in _TABLES:
            setattr(fast, name, np.load(folder / f"{name}.npy", mmap_mode="r"))
        fast.pad, fast.classes = bytes.fromhex(meta["pad"]), list(meta["classes"])
        fast.aliases, fast.labels = [tuple(pair) for pair in meta["aliases"]], tuple(meta["labels"])
        fits = len(fast.pad) == STATE_DEPTH - 1 and fast.first2.shape == (1 << 16,)
        fits = fits and fast.next_row.shape == fast.next_feature.shape
        fits = fits and fast.ptc.ndim == 2 and fast.ptc.shape[1] == len(fast.pc) == len(fast.classes)
        if not fits:
            raise ValueError(f"{folder}: the cached language-ID tables do not fit together")
        return fast

    def features(self, data: bytes) -> np.ndarray:
        """The feature the automaton emits after each byte of ``data`` (py3langid's ``tk_output`` of its state
        there; -1 for none)."""
        return self._walk(self.pad + data)

    def _walk(self, buf: bytes) -> np.ndarray:
        """The feature emitted after each byte of ``buf`` but its first ``STATE_DEPTH - 1``, each position's
        state computed from the root over the bytes up to it."""
        depth = STATE_DEPTH
        m = len(buf) - (depth - 1)
        arr = np.frombuffer(buf, dtype=np.uint8).astype(np.int32)
        # ``take`` rather than fancy indexing: the indices are in range by construction, and take's loop is
        # over twice as fast on these int32 gathers
        row = self.first2.take((arr[:m] << 8) | arr[1 : m + 1])
        for k in range(2, depth - 1):
            row += arr[k : k + m]
            row = self.next_row.take(row)
        row += arr[depth - 1 :]
        return self.next_feature.take(row)

    def classify(self, text: str) -> tuple[str, float]:
        return self.classify_batch([text])[0]

    def classify_batch(self, texts: list[str]) -> list[tuple[str, float]]:
        """``classify`` of each text. The automaton walks ~32 KB of documents at a time (each after its
        start-state prefix), and the softmax runs over the whole batch's score rows at once; each document's
        own rows are summed by the same matrix product as one at a time, so the scores are bitwise those of
        classifying it alone."""
        datas = []
        for text in texts:
            if text.isupper():
                text = text.lower()
            datas.append(unicodedata.normalize("NFC", text).encode("utf-8", "surrogatepass"))
        scores = np.zeros((len(datas), len(self.pc)), dtype=np.float32)
        if walk_kernel is not None:
            self._score_compiled(walk_kernel, datas, scores)
        else:
            self._score_numpy(datas, scores)
        scale = np.array([1.0 / math.sqrt(len(d) or 1) for d in datas], dtype=np.float32)
        scores *= scale[:, None]
        scores = np.exp(scores - scores.max(axis=1, keepdims=True))
        scores /= scores.sum(axis=1, keepdims=True)
        for i, j in self.aliases:
            scores[:, i] += scores[:, j]
            scores[:, j] = 0.0
        best = scores.argmax(axis=1)
        return [(str(self.classes[b]), float(scores[k, b])) for k, b in enumerate(best.tolist())]

    def _score_numpy(self, datas: list[bytes], scores: np.ndarray) -> None:
        for lo, hi in packed_ranges([len(d) + len(self.pad) for d in datas], WALK_BYTES) if datas else ():
            feats, pos = self._walk(self.pad + self.pad.join(datas[lo:hi])), 0
            for i in range(lo, hi):
                self._score(feats[pos : pos + len(datas[i])], scores[i])
                pos += len(datas[i]) + len(self.pad)

    def _score_compiled(self, kernel: ModuleType, datas: list[bytes], scores: np.ndarray) -> None:
        """``_score_numpy`` with the walk and the counting compiled (``walk_counts``: the automaton one byte at
        a time from the start state, then each document's distinct features in increasing order with their
        counts, which is what ``_score`` derives); the rows and their product are the same numpy calls, so the
        scores are bitwise the same."""
        root = int(self.first2[(self.pad[0] << 8) | self.pad[0]])  # the pad byte keeps the start state
        for lo, hi in packed_ranges([len(d) for d in datas], KERNEL_BYTES) if datas else ():
            data = b"".join(datas[lo:hi])
            offsets = np.zeros(hi - lo + 1, dtype=np.int64)
            np.cumsum([len(d) for d in datas[lo:hi]], out=offsets[1:])
            found = np.empty(len(data), dtype=np.int32)
            counts = np.empty(len(data), dtype=np.int32)
            at = np.empty(hi - lo + 1, dtype=np.int64)
            tables = (self.next_row, self.next_feature, root, STATE_DEPTH, len(self.ptc))
            kernel.walk_counts(*tables, data, offsets, found, counts, at)
            for i, a, b in zip(range(lo, hi), at[:-1].tolist(), at[1:].tolist(), strict=True):
                if a == b:
                    continue
                np.matmul(
                    np.log1p(counts[a:b].astype(np.float32)), self.ptc.take(found[a:b], axis=0), out=scores[i]
                )
                scores[i] += self.pc

    def _score(self, feats: np.ndarray, out: np.ndarray) -> None:
        """Into ``out`` (zeros): log(1 + count) of each emitted feature times its log-probabilities, plus the
        priors (nothing when no feature is emitted)."""
        found = np.sort(feats)
        found = found[np.searchsorted(found, 0) :]  # the positions that emit a feature
        if not found.size:
            return
        first = np.empty(found.size, dtype=bool)  # distinct features (sorted) and their counts, as np.unique
        first[0] = True
        np.not_equal(found[1:], found[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        counts = np.diff(starts, append=found.size)
        np.matmul(np.log1p(counts.astype(np.float32)), self.ptc.take(found[starts], axis=0), out=out)
        out += self.pc


def cache_folder() -> Path | None:
    """Where the language-ID tables are cached: ``$PILEWORKS_CACHE_DIR`` (``off``: nowhere), else
    ``$XDG_CACHE_HOME/pileworks`` or ``~/.cache/pileworks``; one folder per model file and table format."""
    root = os.environ.get("PILEWORKS_CACHE_DIR")
    if root == "off":
        return None
    base = (
        Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pileworks"
    )
    digest = hashlib.sha256(f"tables-v{_TABLES_VERSION}-depth{STATE_DEPTH}".encode())
    digest.update((MODEL_DIR / MODEL_FILE).read_bytes())
    return base / f"langid-{digest.hexdigest()[:16]}"


@functools.cache
def _fast() -> FastIdentifier:
    """The identifier of this process: its tables memory-mapped from the cache folder, or built from py3langid's
    model (decompressing it and deriving the tables takes ~1.1 CPU-s, in every worker process) and then
    cached there. A cache that cannot be read or written is rebuilt or skipped, never an error."""
    folder = cache_folder()
    if folder is not None and folder.is_dir():
        try:
            return FastIdentifier.load(folder)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("language-ID cache %s unreadable (%s); building the tables", folder, exc)
    fast = FastIdentifier(_identifier())
    if folder is not None:
        try:
            fast.save(folder)
        except OSError as exc:
            log.warning("language-ID tables not cached in %s: %s", folder, exc)
    return fast


@functools.cache
def languages() -> tuple[str, ...]:
    """Every code the model can answer, sorted."""
    return _fast().labels


def identify(text: str, sample_chars: int = 3000) -> tuple[str, float]:
    """(ISO 639-1 code, probability) of ``text``; ``("und", 0.0)`` for text with no letters."""
    return identify_batch([text], sample_chars)[0]


def identify_batch(texts: list[str], sample_chars: int = 3000) -> list[tuple[str, float]]:
    """:func:`identify` of each text, classified together (:meth:`FastIdentifier.classify_batch`)."""
    samples = [text[:sample_chars] for text in texts]
    known = [i for i, sample in enumerate(samples) if any(c.isalpha() for c in sample)]
    found: list[tuple[str, float]] = [(UNKNOWN, 0.0)] * len(texts)
    for i, (lang, score) in zip(known, _fast().classify_batch([samples[i] for i in known]), strict=True):
        found[i] = (lang, round(score, 4))
    return found


def language_verdict(lang: str, score: float, cfg: LangIdConfig) -> str | None:
    """The drop reason for a document of ``lang`` identified with ``score``, or None to keep it."""
    if cfg.allow and lang not in cfg.allow:
        return "language_not_allowed"
    if score < cfg.min_score:
        return "language_low_score"
    return None


def with_language(meta: dict[str, Any], lang: str, score: float) -> dict[str, Any]:
    """``meta`` with the provenance fields ``language`` and ``language_score`` set."""
    return {**meta, "language": lang, "language_score": score}
