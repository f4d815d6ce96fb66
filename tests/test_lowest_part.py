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
