"""The import rules of DESIGN.md, enforced by reading the source (so a wrong import fails CI with the rule)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RULES = {
    "pipeline": (
        {"torch", "deepspeed", "prefect", "prefect_dask", "flows", "training"},
        "pipeline/ is the corpus library: pure Python + numpy/pyarrow/datasketch/tokenizers/boto3, so corpus "
        "workers install no ML framework and no orchestrator",
    ),
    "training": (
        {"prefect", "prefect_dask", "datasketch", "flows"},
        "training/ runs inside deepspeed/torchrun ranks: no orchestrator and no corpus-only dependencies",
    ),
}
TRAINING_MAY_USE_FROM_PIPELINE = {
    "pipeline",
    "pipeline.manifest",
    "pipeline.shards",
    "pipeline.storage",
    "pipeline.config",
    "pipeline.errors",
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def sources(room: str) -> list[Path]:
    return sorted((ROOT / room).rglob("*.py"))


@pytest.mark.parametrize("room", sorted(RULES))
def test_room_import_rules(room: str) -> None:
    forbidden, why = RULES[room]
    violations = []
    for path in sources(room):
        for line, module in imported_modules(path):
            top = module.split(".")[0]
            if top in forbidden:
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
            if room == "training" and top == "pipeline":
                allowed = any(
                    module == m or module.startswith(m + ".")
                    for m in TRAINING_MAY_USE_FROM_PIPELINE - {"pipeline"}
                )
                if not allowed:
                    violations.append(
                        f"{path.relative_to(ROOT)}:{line} imports {module} "
                        "(training may use only pipeline.manifest, pipeline.shards and pipeline.storage)"
                    )
    assert not violations, f"import rule of {room}/ broken ({why}):\n" + "\n".join(violations)


def test_nothing_imports_flows() -> None:
    violations = []
    for room in ("pipeline", "training", "infra"):
        for path in sources(room):
            for line, module in imported_modules(path):
                if module.split(".")[0] == "flows":
                    violations.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not violations, "nothing imports flows/ (it is the Prefect shell on top):\n" + "\n".join(
        violations
    )


def test_rule_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom torch import nn\nif True:\n    import prefect.flows\n")
    modules = [m for _, m in imported_modules(bad)]
    assert modules == ["os", "torch", "prefect.flows"]
