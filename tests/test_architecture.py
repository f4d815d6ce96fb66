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
    "pipeline.configload",
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
                        "(training may use only pipeline.manifest, pipeline.shards, pipeline.storage and pipeline.configload)"
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


# ---------------------------------------------------------------- one store configuration on every path
# Where an S3Options may be made: the config dataclasses' defaults (the s3: sections) and the one resolver.
MAY_MAKE_S3_OPTIONS = {
    "pipeline/storage/options.py",  # resolve_s3_options
    "flows/corpus_config.py",  # CorpusConfig.s3 default
    "training/config.py",  # TrainConfig.s3 default
}
# Functions that reach a store: each call must hand over the store configuration (positional or s3=).
NEEDS_S3 = {
    "open_store": 2, "load_manifest": 2, "load_tokenizer": 2, "list_inputs": 2, "ingest_part": 3,
    "run_ingest_part": 5, "run_train_tokenizer": 6, "trace_step": None, "plan_parts": None,
}  # fmt: skip


def _calls(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def store_config_violations(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        for call in _calls(path):
            name = _name(call)
            where = f"{rel}:{call.lineno}"
            if name in ("S3Options", "S3Store") and rel not in MAY_MAKE_S3_OPTIONS | {
                "pipeline/storage/s3.py"
            }:
                found.append(f"{where} makes {name}(...): take the resolved s3 settings instead")
            if name in NEEDS_S3:
                positional = NEEDS_S3[name]
                has_kw = any(k.arg == "s3" for k in call.keywords)
                if not has_kw and (positional is None or len(call.args) < positional):
                    found.append(f"{where} calls {name} without the s3 settings")
    return found


def test_every_store_is_opened_with_the_resolved_store_configuration() -> None:
    """No code path can fall back to boto3's defaults (AWS) while the user configured an endpoint."""
    paths = [p for room in ("pipeline", "training", "flows") for p in sources(room)]
    violations = store_config_violations(paths)
    assert not violations, "\n".join(violations)


def test_store_config_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "open_store(uri)\nopen_store(uri, s3)\nload_manifest(u, s3=o)\nx = S3Options(endpoint_url=None)\n"
        "near.plan_parts(inputs, 5, cfg=c)\n"
    )
    found = store_config_violations([bad])
    assert [f.split(" ", 1)[1] for f in found] == [
        "calls open_store without the s3 settings",
        "makes S3Options(...): take the resolved s3 settings instead",
        "calls plan_parts without the s3 settings",
    ]
