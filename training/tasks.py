"""Downstream task files: multiple choice and completion items read from a user's JSONL (nothing downloaded).

One JSON object a line; the kind of a file is read from its first line and every line must be of that kind.

* **multiple choice**, the layout of llm-foundry's local ICL files and of lm-evaluation-harness JSONL tasks:
  ``{"query": str, "choices": [str, ...], "gold": int}``; ``context`` (or ``question``) may stand for ``query``
  and ``label`` for ``gold``. Choice ``i`` is scored as the continuation ``" " + choices[i]`` of the query
  (lm-evaluation-harness's default ``target_delimiter``).
* **completion** (LAMBADA style): ``{"context": str, "continuation": str}`` (llm-foundry's language-modeling
  layout; the continuation is scored as written, so give its leading space), or ``{"text": str}``: the last
  word is the continuation, split as lm-evaluation-harness's ``lambada`` task splits it (at the last ``" "``).

A task's name is ``NAME`` of a ``NAME=FILE`` spec, else the file's stem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

MC_DELIMITER = " "  # between a query and each choice, as lm-evaluation-harness's target_delimiter default


@dataclass(frozen=True)
class Request:
    """One log-likelihood to compute: ``continuation`` given ``context`` (both text)."""

    context: str
    continuation: str


@dataclass(frozen=True)
class McItem:
    context: str
    choices: tuple[str, ...]
    gold: int

    def requests(self) -> list[Request]:
        return [Request(self.context, MC_DELIMITER + c) for c in self.choices]


@dataclass(frozen=True)
class CompletionItem:
    context: str
    continuation: str

    def requests(self) -> list[Request]:
        return [Request(self.context, self.continuation)]


@dataclass(frozen=True)
class Task:
    name: str
    path: str
    kind: Literal["multiple_choice", "completion"]
    items: tuple[McItem | CompletionItem, ...]


def _first(row: dict[str, Any], names: tuple[str, ...]) -> Any:
    return next((row[n] for n in names if n in row), None)


def _mc_item(row: dict[str, Any], where: str) -> McItem:
    context, choices, gold = _first(row, ("query", "context", "question")), row.get("choices"), None
    gold = _first(row, ("gold", "label"))
    if not isinstance(context, str):
        raise ValueError(f'{where}: a multiple-choice line needs a string "query" (or "context")')
    if (
        not isinstance(choices, list)
        or len(choices) < 2
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise ValueError(f'{where}: "choices" must be a list of at least 2 non-empty strings')
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise ValueError(f'{where}: "gold" must be the index of the right choice (0..{len(choices) - 1})')
    return McItem(context, tuple(choices), gold)


def _completion_item(row: dict[str, Any], where: str) -> CompletionItem:
    if isinstance(row.get("context"), str) and isinstance(row.get("continuation"), str):
        item = CompletionItem(row["context"], row["continuation"])
    elif isinstance(row.get("text"), str) and " " in row["text"].strip():
        context, _, last = row["text"].rpartition(" ")
        item = CompletionItem(context, " " + last)
    else:
        raise ValueError(
            f'{where}: a completion line needs string "context" and "continuation", or a "text" of 2+ words'
        )
    if not item.context or not item.continuation:
        raise ValueError(f"{where}: empty context or continuation")
    return item


def read_task(path: str | Path, name: str | None = None) -> Task:
    """The items of a task file (see the module docstring); ValueError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--task {path}: no such file")
    kind: Literal["multiple_choice", "completion"] | None = None
    items: list[Any] = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{where}: not JSON ({exc})") from exc
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object")
            kind = kind or ("multiple_choice" if "choices" in row else "completion")
            items.append(_mc_item(row, where) if kind == "multiple_choice" else _completion_item(row, where))
    if kind is None:
        raise ValueError(f"--task {path}: the file holds no items")
    return Task(name or path.stem, str(path), kind, tuple(items))


def parse_task_spec(spec: str) -> tuple[str, str]:
    """``NAME=FILE`` or ``FILE`` -> (name, file); the name defaults to the file's stem."""
    name, sep, file = spec.partition("=")
    if sep and name and "/" not in name and not Path(spec).is_file():
        return name.strip(), file
    return Path(spec).stem, spec


def read_tasks(specs: list[str]) -> list[Task]:
    """Every ``--task`` spec read; names must differ."""
    tasks = [read_task(file, name) for name, file in map(parse_task_spec, specs)]
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"--task names must differ (give NAME=FILE); got {names}")
    return tasks
