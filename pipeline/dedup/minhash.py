"""MinHash signatures, vectorized over batches, identical to ``datasketch.MinHash``.

A signature row equals ``datasketch.MinHash(num_perm, seed, hashfunc=hasher.hashfunc, scheme=...)`` updated with
every shingle of :meth:`MinHasher.shingles` -- element by element. The per-shingle ``update`` loop is replaced by
numpy: shingle hashes for a whole batch go into one array and each permutation is a pass of ``a*h+b`` followed by
a segmented minimum (``np.minimum.reduceat``) over the documents' runs of shingles.

Shingles (``shingle="word"``): the text is lower-cased and encoded as UTF-8; ASCII bytes other than ``[0-9a-z_]``
separate tokens (non-ASCII bytes stay inside tokens); a shingle is ``n`` consecutive tokens joined by one space
(a document shorter than ``n`` tokens is one shingle of all of them). ``shingle="char"`` (for CJK, where words are
not space-separated): the lower-cased text without whitespace, ``n`` consecutive code points.

Hashes: ``"sha1"`` is datasketch's default hash (``sha1_hash32``/``sha1_hash64``) of the shingle's UTF-8 bytes:
bit-identical to a plain ``datasketch.MinHash()`` but bound by one sha1 call per shingle. ``"xxh64"`` hashes each
token once (xxh64 of a word, or a 64-bit mix of a code point) and combines the ``n`` token hashes of a shingle with
numpy; :meth:`MinHasher.hashfunc` is the same function over a shingle's bytes, for datasketch.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence

import numpy as np
import xxhash

SCHEMES = ("affine32", "affine64", "legacy")
SHINGLES = ("word", "char")
HASHES = ("sha1", "xxh64")

_MERSENNE = np.uint64((1 << 61) - 1)
_MAX32 = np.uint64((1 << 32) - 1)
_MASK64 = (1 << 64) - 1
_COMBINE_MUL = 0x9E3779B97F4A7C15  # odd: the n-gram polynomial stays order-sensitive and invertible per step
_CHAR_SALT = 0x2545F4914F6CDD1D
# Bytes that separate word tokens: every ASCII byte except [0-9a-z_] (the text is lower-cased first).
_KEEP = set(b"0123456789abcdefghijklmnopqrstuvwxyz_") | set(range(128, 256))
_SEPARATE = bytes(b if b in _KEEP else 0x20 for b in range(256))
# Shingles per numpy pass: bounds the batch's temporary arrays (about 8 bytes x this).
_CHUNK_SHINGLES = 1 << 18


def _fmix32(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def fmix64(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xFF51AFD7ED558CCD)
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


def _fmix64_int(h: int) -> int:
    return int(fmix64(np.array([h], dtype=np.uint64))[0])


def _combine_int(token_hashes: Sequence[int]) -> int:
    """The shingle hash of the fast path: fmix64 of the polynomial of its token hashes (mod 2**64)."""
    acc = 0
    for t in token_hashes:
        acc = (acc * _COMBINE_MUL + t) & _MASK64
    return _fmix64_int(acc)


def _sha1_32(data: bytes) -> int:
    return struct.unpack("<I", hashlib.sha1(data).digest()[:4])[0]


def _sha1_64(data: bytes) -> int:
    return struct.unpack("<Q", hashlib.sha1(data).digest()[:8])[0]


def word_tokens(text: str) -> list[bytes]:
    return text.lower().encode("utf-8", "surrogatepass").translate(_SEPARATE).split()


def char_tokens(text: str) -> str:
    return "".join(text.lower().split())


class MinHasher:
    """Permutations and shingling for one (num_perm, seed, scheme, shingle, ngram, hash) choice."""

    def __init__(
        self,
        *,
        num_perm: int = 128,
        seed: int = 1,
        ngram: int = 5,
        shingle: str = "word",
        hash: str = "xxh64",
        scheme: str = "affine32",
    ) -> None:
        if scheme not in SCHEMES or shingle not in SHINGLES or hash not in HASHES:
            raise ValueError(f"unknown scheme/shingle/hash {scheme!r}/{shingle!r}/{hash!r}")
        if num_perm < 2 or ngram < 1:
            raise ValueError("num_perm must be >= 2 and ngram >= 1")
        self.num_perm, self.seed, self.ngram = num_perm, seed, ngram
        self.shingle, self.hash, self.scheme = shingle, hash, scheme
        self.dtype = np.uint32 if scheme == "affine32" else np.uint64
        self.a, self.b = self._permutations()

    def _permutations(self) -> tuple[np.ndarray, np.ndarray]:
        # Drawn exactly as datasketch.MinHash._init_permutations does (same generator calls, same order).
        gen = np.random.RandomState(self.seed)
        if self.scheme == "legacy":
            pairs = np.array(
                [
                    (gen.randint(1, _MERSENNE, dtype=np.uint64), gen.randint(0, _MERSENNE, dtype=np.uint64))
                    for _ in range(self.num_perm)
                ],
                dtype=np.uint64,
            ).T
            return pairs[0].copy(), pairs[1].copy()
        width = 32 if self.scheme == "affine32" else 64
        dt = self.dtype
        a = gen.randint(0, 1 << (width - 1), self.num_perm, dtype=dt) * dt(2) + dt(1)
        b = gen.randint(0, 1 << width, self.num_perm, dtype=dt)
        return a, b

    @property
    def max_value(self) -> int:
        return (1 << 64) - 1 if self.scheme == "affine64" else (1 << 32) - 1

    # ------------------------------------------------------------ reference (per shingle) path

    def shingles(self, text: str) -> list[bytes]:
        """The document's shingles as bytes (what datasketch's ``update`` is fed), in order, repeats kept."""
        n = self.ngram
        if self.shingle == "word":
            toks = word_tokens(text)
            if not toks:
                return []
            if len(toks) < n:
                return [b" ".join(toks)]
            return [b" ".join(toks[i : i + n]) for i in range(len(toks) - n + 1)]
        chars = char_tokens(text)
        if not chars:
            return []
        if len(chars) < n:
            return [chars.encode("utf-8", "surrogatepass")]
        return [chars[i : i + n].encode("utf-8", "surrogatepass") for i in range(len(chars) - n + 1)]

    @property
    def hashfunc(self) -> Callable[[bytes], int]:
        """The hash of one shingle's bytes, to give ``datasketch.MinHash(hashfunc=...)``."""
        wide = self.scheme == "affine64"
        if self.hash == "sha1":
            return _sha1_64 if wide else _sha1_32
        if self.shingle == "word":

            def token_hashes(data: bytes) -> list[int]:
                return [xxhash.xxh64_intdigest(t) for t in data.split(b" ")]

        else:

            def token_hashes(data: bytes) -> list[int]:
                cps = [ord(c) for c in data.decode("utf-8", "surrogatepass")]
                return [_fmix64_int(c ^ _CHAR_SALT) for c in cps]

        def fast_hash(data: bytes) -> int:
            h = _combine_int(token_hashes(data))
            return h if wide else h >> 32

        return fast_hash

    def datasketch(self, values: np.ndarray):  # -> datasketch.MinHash (imported lazily: optional at run time)
        """A ``datasketch.MinHash`` holding one signature row (for ``jaccard()`` or a ``MinHashLSH``)."""
        from datasketch import MinHash

        return MinHash(
            seed=self.seed,
            hashfunc=self.hashfunc,
            hashvalues=np.asarray(values),
            permutations=(self.a, self.b),
            scheme=self.scheme,
        )

    # ------------------------------------------------------------ vectorized path

    def signatures(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Signatures ``(len(texts), num_perm)`` and each document's shingle count (0: an all-max row)."""
        out = np.full((len(texts), self.num_perm), self.max_value, dtype=self.dtype)
        counts = np.zeros(len(texts), dtype=np.int64)
        start = 0
        while start < len(texts):
            stop, hashes, lens = self._shingle_hashes(texts, start)
            counts[start:stop] = lens
            self._permuted_min(hashes, lens, out[start:stop])
            start = stop
        return out, counts

    def _shingle_hashes(self, texts: Sequence[str], start: int) -> tuple[int, np.ndarray, np.ndarray]:
        """Shingle hashes of texts[start:stop] (stop chosen to bound memory) and shingles per document."""
        parts: list[np.ndarray] = []
        lens: list[int] = []
        total = 0
        stop = start
        while stop < len(texts) and (total < _CHUNK_SHINGLES or stop == start):
            h = self._doc_hashes(texts[stop])
            parts.append(h)
            lens.append(len(h))
            total += len(h)
            stop += 1
        hashes = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
        return stop, hashes, np.array(lens, dtype=np.int64)

    def _doc_hashes(self, text: str) -> np.ndarray:
        """Input hashes (before the permutations) of one document's shingles, as datasketch's hashfunc gives."""
        if self.hash == "sha1":
            return np.fromiter(map(self.hashfunc, self.shingles(text)), dtype=np.uint64)
        if self.shingle == "word":
            toks = word_tokens(text)
            th = np.fromiter(map(xxhash.xxh64_intdigest, toks), dtype=np.uint64, count=len(toks))
        else:
            chars = char_tokens(text)
            cps = np.frombuffer(chars.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
            th = fmix64(cps.astype(np.uint64) ^ np.uint64(_CHAR_SALT))
        return self._combine(th)

    def _combine(self, th: np.ndarray) -> np.ndarray:
        n = min(self.ngram, len(th))
        if n == 0:
            return th
        m = len(th) - n + 1
        mul = np.uint64(_COMBINE_MUL)
        acc = th[:m].copy()
        for j in range(1, n):
            acc *= mul
            acc += th[j : j + m]
        h = fmix64(acc)
        return h if self.scheme == "affine64" else h >> np.uint64(32)

    def _permuted_min(self, hashes: np.ndarray, lens: np.ndarray, out: np.ndarray) -> None:
        """out[d, k] = min over document d's shingles of permutation k of their hash (datasketch's update)."""
        have = lens > 0
        if not have.any():
            return
        starts = np.concatenate(([0], np.cumsum(lens)[:-1]))[have]
        if self.scheme == "affine32":
            hv = _fmix32(hashes.astype(np.uint32))
        elif self.scheme == "affine64":
            hv = fmix64(hashes)
        else:
            hv = hashes
        buf = np.empty_like(hv)
        rows = np.flatnonzero(have)
        for k in range(self.num_perm):
            # uint arithmetic wraps exactly like datasketch's (hv * a + b) on uint32/uint64 arrays.
            np.multiply(hv, self.a[k], out=buf)
            np.add(buf, self.b[k], out=buf)
            if self.scheme == "legacy":
                np.remainder(buf, _MERSENNE, out=buf)
                np.bitwise_and(buf, _MAX32, out=buf)
            out[rows, k] = np.minimum.reduceat(buf, starts)


def estimated_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
    """Fraction of equal signature values, row-wise (datasketch's ``MinHash.jaccard``)."""
    return np.count_nonzero(sig_a == sig_b, axis=-1) / sig_a.shape[-1]


def set_jaccard(a: set[bytes], b: set[bytes]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)
