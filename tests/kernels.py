"""Markers for the tests of the compiled kernels (optional C extensions built by ``pip install``).

Where the install found no C compiler the kernels are missing and their tests are skipped (the numpy and Python
paths do the work there, and are tested on their own). CI's machine has a compiler, so with ``CI`` set nothing is
skipped: a kernel that failed to build fails its tests instead (:func:`require`).
"""

from __future__ import annotations

import os

import pytest

from pipeline.clean import langid, normalize, wordscan
from pipeline.tokenize import bpe_train

ON_CI = bool(os.environ.get("CI"))


def _needs(kernel: object, name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        kernel is None and not ON_CI, reason=f"{name} was not built (no C compiler at install)"
    )


needs_walk = _needs(langid.walk_kernel, "pipeline.clean._langid_walk")
needs_lines = _needs(normalize.lines_kernel, "pipeline.clean._lines")
needs_wordscan = _needs(wordscan.scan_kernel, "pipeline.clean._wordscan")
needs_bpe = _needs(bpe_train.bpe_kernel, "pipeline.tokenize._bpe")


def require(kernel: object, name: str) -> None:
    """Inside a test marked with its ``needs_*``: on CI, a kernel that was not built is a failure."""
    assert kernel is not None, f"{name} was not built (pip install needs gcc)"
