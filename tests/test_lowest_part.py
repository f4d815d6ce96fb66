"""The lowest-versions job's list (tests/lowest_part.py): each entry names a test, and one that does not fails."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import lowest_part


@dataclass
class FakeItem:
    path: Path
    name: str
    markers: list[pytest.MarkDecorator] = field(default_factory=list)

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker)


def test_every_entry_names_a_test_file_or_a_test_in_it() -> None:
    for entry in lowest_part.LOWEST_PART:
        file, _, name = entry.partition("::")
        path = lowest_part.TESTS / file
        assert path.is_file(), entry
        assert not name or f"def {name}(" in path.read_text(), entry


def test_a_file_entry_marks_its_tests_and_a_stale_one_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    path = lowest_part.TESTS / "flows" / "test_prefect_range.py"
    items = [FakeItem(path, "test_one"), FakeItem(path, "test_two[a]")]
    monkeypatch.setattr(lowest_part, "LOWEST_PART", ("flows/test_prefect_range.py::test_two",))
    lowest_part.mark_lowest_part(items)  # type: ignore[arg-type]
    assert [bool(i.markers) for i in items] == [False, True]
    monkeypatch.setattr(lowest_part, "LOWEST_PART", ("flows/test_prefect_range.py::test_renamed",))
    with pytest.raises(pytest.UsageError, match="test_renamed names no test"):
        lowest_part.mark_lowest_part(items)  # type: ignore[arg-type]
    monkeypatch.setattr(lowest_part, "LOWEST_PART", ("flows/test_gone.py",))
    with pytest.raises(pytest.UsageError, match=r"test_gone\.py names no file"):
        lowest_part.mark_lowest_part(items)  # type: ignore[arg-type]


def test_every_test_file_is_collected_by_the_suite() -> None:
    """Every ``test_*.py`` under tests/ is collected by a plain ``pytest`` (what ``make test`` runs): pytest skips
    folders its ``norecursedirs`` names (by default ``build``, which hid tests/flows/build and a lowest-part entry
    from CI), and a skipped folder would drop its tests unseen."""
    import subprocess
    import sys

    root = lowest_part.TESTS.parent
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", ""],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    collected = {line.split("::", 1)[0] for line in listed.stdout.splitlines() if "::" in line}
    files = {
        str(p.relative_to(root)) for p in lowest_part.TESTS.rglob("test_*.py") if "__pycache__" not in p.parts
    }
    assert files - collected == set(), listed.stdout[-2000:] + listed.stderr[-2000:]
