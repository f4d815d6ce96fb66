"""The compiled kernels' shared standard (``pipeline/_native.h``): one copy of the UTF-8 and hashing helpers,
our XXH64 equal to the ``xxhash`` package's, a warning-free build whose sdist carries the header, and
buffers of the wrong size or alignment refused with ValueError instead of being read out of bounds."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import numpy as np
import pytest
import xxhash

from pipeline.clean import langid, normalize, quality, stopwords, wordscan
from tests.kernels import needs_lines, needs_walk, needs_wordscan, require

ROOT = Path(__file__).resolve().parents[2]
HEADER = "pipeline/_native.h"
KERNELS = (
    "pipeline/clean/_langid_walk.c",
    "pipeline/clean/_lines.c",
    "pipeline/clean/_wordscan.c",
    "pipeline/tokenize/_bpe.c",
)


def test_the_kernels_include_the_shared_header_and_keep_no_copy_of_it():
    """Each kernel includes pipeline/_native.h; none defines a UTF-8 decoder or the XXH64 primes of its own."""
    for path in KERNELS:
        source = (ROOT / path).read_text()
        included = re.findall(r'#include "([^"]+)"', source)
        assert [os.path.normpath(os.path.join(os.path.dirname(path), i)) for i in included] == [HEADER], path
        assert "0x9E3779B185EBCA87" not in source, path  # XXH64's first prime: native_xxh64 only
        assert "& 0x3F) << 6" not in source, path  # a hand-written UTF-8 decoder: native_decode only
        assert "PyUnicode_AsUTF8AndSize(text" not in source, path  # native_utf8 only


def test_every_kernel_builds_warning_free_with_the_header_in_its_sdist():
    """pyproject.toml: each extension lists the header in `depends` (setuptools then rebuilds on a change and
    ships it in the sdist) and builds with -Wall -Wextra -Werror; each stays optional (no compiler: numpy)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (CI's)
    modules = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["ext-modules"]
    assert sorted(m["sources"][0] for m in modules) == sorted(KERNELS)
    for module in modules:
        assert module["depends"] == [HEADER], module["name"]
        assert {"-Wall", "-Wextra", "-Werror"} <= set(module["extra-compile-args"]), module["name"]
        assert module["optional"] is True, module["name"]


@needs_lines
def test_our_xxh64_is_the_xxhash_packages_on_every_length_and_alignment():
    """``_lines.xxh64`` (native_xxh64, the boilerplate line key) against ``xxhash.xxh64_intdigest`` on random
    bytes of every length 0..300 (the 32-byte stripe loop, then the 8-, 4- and 1-byte tails) at every start
    offset within a word (the reads are unaligned)."""
    kernel = normalize.lines_kernel
    require(kernel, "pipeline.clean._lines")
    assert kernel is not None
    rng = random.Random(64)
    for length in range(301):
        data = rng.randbytes(length + 8)
        for offset in range(8):
            piece = memoryview(data)[offset : offset + length]
            assert kernel.xxh64(piece) == xxhash.xxh64_intdigest(piece), (length, offset)
    text = "é" * 40 + "中" * 30
    assert kernel.xxh64(text.encode()) == normalize.line_hash(text)


@needs_lines
@needs_wordscan
@needs_walk
def test_a_buffer_of_the_wrong_size_or_alignment_is_refused():
    """Each kernel checks the buffers it reads as integers: a length that is not a whole number of items, or
    a start that is not aligned for them, raises ValueError naming the buffer."""
    require(normalize.lines_kernel, "pipeline.clean._lines")
    require(wordscan.scan_kernel, "pipeline.clean._wordscan")
    require(langid.walk_kernel, "pipeline.clean._langid_walk")
    assert normalize.lines_kernel and wordscan.scan_kernel and langid.walk_kernel
    keys = np.arange(4, dtype=np.uint64).tobytes()
    with pytest.raises(ValueError, match="boilerplate"):
        normalize.lines_kernel.remove_lines("a line\nanother", keys[:12], 0)
    with pytest.raises(ValueError, match="boilerplate"):
        normalize.lines_kernel.remove_lines("a line\nanother", memoryview(keys)[1:25], 0)
    words = np.zeros(4, dtype=np.uint64).tobytes()
    sizes = np.array([4], dtype=np.int64).tobytes()
    with pytest.raises(ValueError, match="sizes"):
        wordscan.scan_kernel.screen_ngrams(words, words, sizes[:7], b"\x01", (), ())
    with pytest.raises(ValueError, match="lengths"):
        wordscan.scan_kernel.screen_ngrams(words, memoryview(words + b"\0")[1:], sizes, b"\x01", (), ())
    with pytest.raises(ValueError, match="past the words"):
        wordscan.scan_kernel.screen_ngrams(words, words, np.array([5], np.int64).tobytes(), b"\x01", (), ())
    table = np.zeros(512, dtype=np.int32)
    data = b"text"
    out = bytearray(4 * len(data) + 1)
    args = (table, table, 0, 4, 8, data, np.array([0, len(data)], np.int64))
    with pytest.raises(ValueError, match="out_features"):
        langid.walk_kernel.walk_counts(
            *args, memoryview(out)[1:], np.empty(4, np.int32), np.empty(2, np.int64)
        )
    with pytest.raises(ValueError, match="wrong size"):
        langid.walk_kernel.walk_counts(
            *args, np.empty(3, np.int32), np.empty(4, np.int32), np.empty(2, np.int64)
        )


@needs_lines
@needs_wordscan
def test_the_kernels_read_only_whole_characters_at_a_texts_end(monkeypatch: pytest.MonkeyPatch):
    """Texts that end in a multi-byte character (2, 3 and 4 bytes) right after a word, a space or a bullet:
    the kernels give Python's answers there (make sanitize runs this under AddressSanitizer)."""
    require(normalize.lines_kernel, "pipeline.clean._lines")
    require(wordscan.scan_kernel, "pipeline.clean._wordscan")
    assert normalize.lines_kernel and wordscan.scan_kernel
    lines, scan = normalize.lines_kernel, wordscan.scan_kernel
    ends = ["é", "\u3000", "中", "\U0001f600", "\xa0", "•", "\u2028", "\u212a"]
    texts = [
        t for a in ends for b in ends for t in (a + b, "word" + a + b, "- x " + a + "\n" + b, b + " the " + a)
    ]
    compiled = []
    for text in texts:
        hashes = lines.line_hashes(text, 0)
        assert hashes is not None
        want = sorted({normalize.line_hash(line) for line in text.split("\n")})
        assert np.frombuffer(hashes, np.uint64).tolist() == want, text
        _, _, sizes, _, _, cjk, *_ = scan.scan_words([text], -1, -1, -1, -1)
        plain, wide = (int(np.frombuffer(b, np.int64)[0]) for b in (sizes, cjk))
        assert quality.count_words(text) == (plain + wide, wide), text
        compiled.append(stopwords.count_stop_words(text, ("the", "x", "k"), 10))
    monkeypatch.setattr(wordscan, "scan_kernel", None)
    assert compiled == [stopwords.count_stop_words(t, ("the", "x", "k"), 10) for t in texts]
    assert sum(compiled) > len(texts) // 2
