"""The import rules of DESIGN.md, enforced by reading the source (so a wrong import fails CI with the rule).

1. Floors: ``flows/`` over ``training/`` over ``pipeline/``, every import downward, each floor without the
   libraries it must not need.
2. No import circle between modules, anywhere in the graph (a check over the whole import graph, counting imports
   inside functions and under ``TYPE_CHECKING`` too: a circle hidden that way is still a circle).
3. No function-local import of a project module, except the few in :data:`ALLOWED_LOCAL_IMPORTS`, each for an
   optional dependency or start-up time (never to get round a circle: move the shared piece down instead).
4. flows/ is rooms (runtime and ui at the bottom, build, train, cli on top), each importing only downward.
5. Other libraries through their public interfaces: no assignment to (or setattr on) an attribute of prefect,
   docket, dask or distributed.
6. A private name (``_x``) stays in its module: none is imported or read across modules.
7. Another library's internals (a private name or module, Prefect's server and CLI, an undocumented binding
   object) are read only where :data:`LIBRARY_INTERNALS` names the place, with the reason and the versions it was
   checked against.
Every rule is also shown failing on a planted violation.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("pipeline", "training", "flows")

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
TRAINING_MAY_USE_FROM_PIPELINE = (
    "pipeline.dataset.manifest",
    "pipeline.dataset.shards",
    "pipeline.storage",
    "pipeline.config",
    "pipeline.errors",
)

# (importing file, imported module prefix) -> why the import sits inside a function.
ALLOWED_LOCAL_IMPORTS: dict[tuple[str, str], str] = {
    (
        "flows/cli/",
        "flows",
    ): "start-up time: `pileworks --help` imports every command module; the flows import prefect",
    (
        "flows/cli/",
        "training",
    ): "start-up time: training modules import torch (seconds) which most commands never use",
    ("flows/cli/", "pipeline"): "start-up time: the stage modules import pyarrow, tokenizers, ftfy",
    ("flows/build/", "pipeline.clean"): (
        "start-up time: the clean rules (ftfy, the word-scan kernel: 0.3 CPU-s) load where clean runs, not in "
        "a rebuild that finds its dataset published"
    ),
    ("flows/build/unchanged.py", "flows.runtime.recorded_run"): (
        "start-up time: Prefect's client (0.65 s of one core), which the build's head start, importing this "
        "module, must not wait for (tests/flows/cli/test_build.py checks the order)"
    ),
    ("flows/ui/build_artifacts.py", "pipeline.storage.s3"): "optional dependency: boto3, for S3 links only",
    (
        "pipeline/storage/__init__.py",
        "pipeline.storage.s3",
    ): "start-up time: boto3 (0.2 CPU-s), s3:// stores only",
    (
        "pipeline/storage/__init__.py",
        "pipeline.storage.gcs",
    ): "optional dependency: google-cloud-storage, gs:// only",
    (
        "pipeline/storage/__init__.py",
        "pipeline.storage.azure",
    ): "optional dependency: azure-storage-blob, az:// only",
    ("training/preflight/dist.py", "training.config"): (
        "start-up time: training.config imports the model (torch); the other doctor checks run without torch"
    ),
}


@dataclass(frozen=True)
class Import:
    line: int
    module: str  # absolute, resolved to a submodule when ``from package import submodule``
    local: bool  # inside a function


# ---------------------------------------------------------------- reading the source


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _walk(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield child, inside
        yield from _walk(child, inside)


def imports_of(path: Path, root: Path = ROOT, known: set[str] | None = None) -> list[Import]:
    """Every import of ``path`` with its line; ``from pkg import sub`` names ``pkg.sub`` when that is a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    importer = module_name(path, root)
    found = []
    for node, local in _walk(tree):
        if isinstance(node, ast.Import):
            found.extend(Import(node.lineno, alias.name, local) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, importer, path.name == "__init__.py")
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(node.lineno, sub if known and sub in known else base, local))
    return found


def sources(room: str, root: Path = ROOT) -> list[Path]:
    return sorted((root / room).rglob("*.py"))


def import_graph(root: Path = ROOT, rooms: tuple[str, ...] = PROJECT) -> dict[str, dict[str, int]]:
    """module -> {imported project module: first line}, over every file of the rooms."""
    files = {module_name(p, root): p for room in rooms for p in sources(room, root)}
    known = set(files)
    graph: dict[str, dict[str, int]] = {m: {} for m in files}
    for name, path in files.items():
        for imp in imports_of(path, root, known):
            if imp.module in known and imp.module != name:
                graph[name].setdefault(imp.module, imp.line)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    cycles.append(sorted(members))
    return sorted(cycles)


def describe_cycle(graph: dict[str, dict[str, int]], members: list[str]) -> str:
    inside = set(members)
    edges = [
        f"  {a} -> {b} (line {line})" for a in members for b, line in sorted(graph[a].items()) if b in inside
    ]
    return "import circle between " + ", ".join(members) + ":\n" + "\n".join(edges)


def local_import_violations(root: Path = ROOT, rooms: tuple[str, ...] = PROJECT) -> list[str]:
    known = {module_name(p, root) for room in rooms for p in sources(room, root)}
    out = []
    for room in rooms:
        for path in sources(room, root):
            rel = path.relative_to(root).as_posix()
            for imp in imports_of(path, root, known):
                if not imp.local or imp.module.split(".")[0] not in rooms or _allowed(rel, imp.module):
                    continue
                out.append(f"{rel}:{imp.line} imports {imp.module} inside a function")
    return out


def _allowed(rel: str, module: str) -> bool:
    return any(
        rel.startswith(where) and (module == prefix or module.startswith(prefix + "."))
        for where, prefix in ALLOWED_LOCAL_IMPORTS
    )


# ---------------------------------------------------------------- the rules


@pytest.mark.parametrize("room", sorted(RULES))
def test_room_import_rules(room: str) -> None:
    forbidden, why = RULES[room]
    violations = []
    for path in sources(room):
        for imp in imports_of(path):
            top = imp.module.split(".")[0]
            rel = path.relative_to(ROOT)
            if top in forbidden:
                violations.append(f"{rel}:{imp.line} imports {imp.module}")
            if (
                room == "training"
                and top == "pipeline"
                and not any(
                    imp.module == m or imp.module.startswith(m + ".") for m in TRAINING_MAY_USE_FROM_PIPELINE
                )
            ):
                violations.append(
                    f"{rel}:{imp.line} imports {imp.module} "
                    f"(training may use only {', '.join(TRAINING_MAY_USE_FROM_PIPELINE)})"
                )
    assert not violations, f"import rule of {room}/ broken ({why}):\n" + "\n".join(violations)


def test_nothing_imports_flows() -> None:
    violations = []
    for room in ("pipeline", "training", "infra"):
        for path in sources(room):
            for imp in imports_of(path):
                if imp.module.split(".")[0] == "flows":
                    violations.append(f"{path.relative_to(ROOT)}:{imp.line} imports {imp.module}")
    assert not violations, "nothing imports flows/ (it is the Prefect shell on top):\n" + "\n".join(
        violations
    )


# The rooms of flows/ (DESIGN.md): presentation and plumbing at the bottom, the flows over them, the CLI on top.
FLOWS_ROOMS: dict[str, set[str]] = {  # room -> the rooms of flows/ it must not import
    "flows.runtime": {"flows.ui", "flows.build", "flows.train", "flows.cli"},
    "flows.ui": {"flows.runtime", "flows.build", "flows.train", "flows.cli"},
    "flows.build": {"flows.train", "flows.cli"},
    "flows.train": {"flows.cli"},
}


def flows_room_violations(root: Path = ROOT) -> list[str]:
    found = []
    for room, forbidden in FLOWS_ROOMS.items():
        for path in sources(room.replace(".", "/"), root):
            for imp in imports_of(path, root):
                if any(imp.module == f or imp.module.startswith(f + ".") for f in forbidden):
                    found.append(f"{path.relative_to(root)}:{imp.line} ({room}) imports {imp.module}")
    return found


def test_flows_rooms_import_downward() -> None:
    assert [p.name for p in (ROOT / "flows").glob("*.py")] == ["__init__.py"], (
        "flows/ holds rooms, not modules"
    )
    violations = flows_room_violations()
    assert not violations, (
        "flows/ rooms: runtime and ui below build, build below train, cli on top:\n" + "\n".join(violations)
    )


def test_flows_room_checker_catches_a_violation(tmp_path: Path) -> None:
    _plant(
        tmp_path,
        {"flows/ui/a.py": "from flows.build.flow import x\n", "flows/build/b.py": "import flows.ui.a\n"},
    )
    assert flows_room_violations(tmp_path) == ["flows/ui/a.py:1 (flows.ui) imports flows.build.flow"]


# The rooms of pipeline/ (DESIGN.md), in the pipeline's order: storage and units at the bottom, then the stages as a
# document meets them, the dataset contract last. A room imports the rooms before it, never one after it; any room
# may import the shared modules at pipeline/'s top (errors, config, records, sources) and any room's config module
# (a source's settings name the clean rules it overrides). The shared modules import only storage, units and
# config modules; corpus_config, the assembly of every room's config, sits above them all. Imports under
# ``if TYPE_CHECKING:`` are type hints, not layering, and are not counted here (the circle rule counts them).
PIPELINE_ROOMS = ("storage", "units", "ingest", "clean", "dedup", "decontam", "tokenize", "dataset")
PIPELINE_SHARED = ("errors", "config", "records", "sources")
PIPELINE_TOP = ("corpus_config",)


def _runtime_imports(path: Path, root: Path) -> list[Import]:
    """The imports of ``path`` outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hinted: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                hinted.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return [imp for imp in imports_of(path, root) if imp.line not in hinted]


def _pipeline_place(module: str) -> str | None:
    """The room (or shared/top module) of a pipeline module; None outside pipeline/."""
    parts = module.split(".")
    if parts[0] != "pipeline":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def package_docstring_gaps(root: Path = ROOT) -> list[str]:
    """Packages of pipeline/ whose docstring is missing or short, or does not name (as ````name````) each of its
    modules; pipeline/'s own names its rooms (````room/````) and its top modules."""
    gaps = []
    for init in sorted((root / "pipeline").rglob("__init__.py")):
        package = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        if len(doc) <= 40:
            gaps.append(f"{package.relative_to(root)}: no docstring saying its one concern")
            continue
        names = [f"``{p.stem}``" for p in sorted(package.glob("*.py")) if p.name != "__init__.py"]
        if package == root / "pipeline":
            names += [f"``{p.parent.name}/``" for p in sorted(package.glob("*/__init__.py"))]
            names.remove("``sample_corpus/``")  # data, not a room
        gaps += [
            f"{package.relative_to(root)}: the docstring does not name {n}" for n in names if n not in doc
        ]
    return gaps


def test_package_docstring_checker_finds_a_planted_gap(tmp_path: Path) -> None:
    _plant(
        tmp_path,
        {
            "pipeline/__init__.py": '"""The corpus library: ``records``, ``config`` and the room ``clean/``, nothing more."""',
            "pipeline/records.py": "",
            "pipeline/config.py": "",
            "pipeline/sample_corpus/__init__.py": '"""Where the bundled sample corpus lives, data only, no room."""',
            "pipeline/clean/__init__.py": '"""The clean stage: ``stage`` runs it, ``quality`` holds the rules."""',
            "pipeline/clean/stage.py": "",
            "pipeline/clean/quality.py": "",
            "pipeline/clean/langid.py": "",
            "pipeline/dedup/__init__.py": '"""Dedup."""',
            "pipeline/tokenize/__init__.py": "",
        },
    )
    assert package_docstring_gaps(tmp_path) == [
        "pipeline: the docstring does not name ``dedup/``",
        "pipeline: the docstring does not name ``tokenize/``",
        "pipeline/clean: the docstring does not name ``langid``",
        "pipeline/dedup: no docstring saying its one concern",
        "pipeline/tokenize: no docstring saying its one concern",
    ]


def pipeline_room_violations(root: Path = ROOT) -> list[str]:
    found = []
    for path in sources("pipeline", root):
        here = _pipeline_place(module_name(path, root))
        for imp in _runtime_imports(path, root):
            there = _pipeline_place(imp.module)
            if there is None or there == here or there == "__init__" or here in PIPELINE_TOP:
                continue
            config_module = there in PIPELINE_ROOMS and imp.module == f"pipeline.{there}.config"
            if here in PIPELINE_ROOMS:
                ok = (
                    there in PIPELINE_SHARED
                    or config_module
                    or (there in PIPELINE_ROOMS and PIPELINE_ROOMS.index(there) < PIPELINE_ROOMS.index(here))
                )
            else:  # a shared module (or the package's __init__)
                ok = there in PIPELINE_SHARED or there in ("storage", "units") or config_module
            if not ok:
                found.append(f"{path.relative_to(root)}:{imp.line} ({here}) imports {imp.module}")
    return found


def test_pipeline_rooms_read_in_the_pipeline_s_order_and_import_downward() -> None:
    top = sorted(p.name for p in (ROOT / "pipeline").glob("*.py"))
    assert len(top) <= 6 and top == sorted(
        f"{m}.py" for m in ("__init__", *PIPELINE_SHARED, *PIPELINE_TOP)
    ), f"pipeline/'s top holds only what every room uses: {top}"
    rooms = sorted(p.parent.name for p in (ROOT / "pipeline").glob("*/__init__.py"))
    assert rooms == sorted([*PIPELINE_ROOMS, "sample_corpus"]), rooms  # and the bundled corpus, data only
    gaps = package_docstring_gaps()
    assert not gaps, "a package's docstring says its one concern and names its modules:\n" + "\n".join(gaps)
    violations = pipeline_room_violations()
    assert not violations, (
        "pipeline/ rooms import only the rooms before them (" + " < ".join(PIPELINE_ROOMS) + "), the shared "
        "modules and config modules:\n" + "\n".join(violations)
    )


def test_pipeline_room_checker_catches_a_violation(tmp_path: Path) -> None:
    _plant(
        tmp_path,
        {
            "pipeline/__init__.py": "",
            "pipeline/records.py": "from pipeline.units.protocol import x\nfrom pipeline.ingest.stage import y\n",
            "pipeline/units/protocol.py": "from pipeline.dataset.manifest import m\n",
            "pipeline/clean/stage.py": (
                "from typing import TYPE_CHECKING\nfrom pipeline.ingest.stage import a\n"
                "from pipeline.dedup.config import b\nfrom pipeline.tokenize.stage import c\n"
                "if TYPE_CHECKING:\n    from pipeline.dataset.shards import ShardInfo\n"
            ),
        },
    )
    assert pipeline_room_violations(tmp_path) == [
        "pipeline/clean/stage.py:4 (clean) imports pipeline.tokenize.stage",
        "pipeline/records.py:2 (records) imports pipeline.ingest.stage",
        "pipeline/units/protocol.py:1 (units) imports pipeline.dataset.manifest",
    ]


def test_a_private_name_is_not_read_across_pipeline_rooms(tmp_path: Path) -> None:
    """Rule 6 over the new rooms: a private name of one room is read in no other."""
    bad = tmp_path / "pipeline" / "dataset" / "publish.py"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "from pipeline.units.cache import _entry\nfrom pipeline.tokenize import stage\nx = stage._bpe\n"
    )
    assert [f.split(" ", 1)[1] for f in private_import_violations([bad], tmp_path)] == [
        "imports pipeline.units.cache._entry",
        "uses stage._bpe",
    ]


def test_errors_module_is_dependency_free() -> None:
    """pipeline.errors is imported by every floor and the CLI: it may import nothing (not even the project)."""
    assert [imp.module for imp in imports_of(ROOT / "pipeline" / "errors.py")] == ["__future__"]


def test_no_import_circles() -> None:
    graph = import_graph()
    assert len(graph) > 80 and sum(map(len, graph.values())) > 150  # the graph really is the project's
    cycles = import_cycles(graph)
    assert not cycles, "\n\n".join(describe_cycle(graph, c) for c in cycles) + (
        "\n\nmove the shared piece down (a config or contract module) instead of importing back up"
    )


def test_no_function_local_imports_of_project_modules() -> None:
    violations = local_import_violations()
    assert not violations, (
        "a function-local import of a project module hides an import circle or a misplaced piece; import it at "
        "the top (or add it to ALLOWED_LOCAL_IMPORTS with the reason: an optional dependency or start-up time):\n"
        + "\n".join(violations)
    )


def test_every_allowed_local_import_is_still_used() -> None:
    """An allow-list entry nothing needs any more would silently allow the next one."""
    known = {module_name(p) for room in PROJECT for p in sources(room)}
    used = set()
    for room in PROJECT:
        for path in sources(room):
            rel = path.relative_to(ROOT).as_posix()
            for imp in imports_of(path, ROOT, known):
                if imp.local:
                    used |= {
                        (where, prefix)
                        for where, prefix in ALLOWED_LOCAL_IMPORTS
                        if rel.startswith(where)
                        and (imp.module == prefix or imp.module.startswith(prefix + "."))
                    }
    assert set(ALLOWED_LOCAL_IMPORTS) == used, (
        f"unused allow-list entries: {set(ALLOWED_LOCAL_IMPORTS) - used}"
    )


# ---------------------------------------------------------------- the checkers catch what they must


def test_rule_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom torch import nn\nif True:\n    import prefect.flows\n")
    modules = [imp.module for imp in imports_of(bad, tmp_path)]
    assert modules == ["os", "torch", "prefect.flows"]


def _plant(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_planted_circle_is_found_even_behind_local_and_type_checking_imports(tmp_path: Path) -> None:
    _plant(
        tmp_path,
        {
            "pipeline/__init__.py": "",
            "pipeline/stage/__init__.py": "",
            "pipeline/stage/config.py": "import json\n",
            # stage -> boilerplate at the top; boilerplate -> stage inside a function (the dodge the issue names)
            "pipeline/stage/run.py": "from pipeline.stage import boilerplate\nfrom .config import *\n",
            "pipeline/stage/boilerplate.py": "def f():\n    from pipeline.stage.run import g\n",
            # a three-module circle through TYPE_CHECKING and a relative import
            "pipeline/near.py": "from pipeline.clusters import run\n",
            "pipeline/clusters.py": "from pipeline import audit\n",
            "pipeline/audit.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .near import Config\n",
            "pipeline/clean.py": "from pipeline.stage.config import X\n",  # downward only: no circle
        },
    )
    graph = import_graph(tmp_path, ("pipeline",))
    assert graph["pipeline.stage.run"] == {"pipeline.stage.boilerplate": 1, "pipeline.stage.config": 2}
    assert import_cycles(graph) == [
        ["pipeline.audit", "pipeline.clusters", "pipeline.near"],
        ["pipeline.stage.boilerplate", "pipeline.stage.run"],
    ]
    message = describe_cycle(graph, ["pipeline.stage.boilerplate", "pipeline.stage.run"])
    assert "pipeline.stage.boilerplate -> pipeline.stage.run (line 2)" in message
    assert local_import_violations(tmp_path, ("pipeline",)) == [
        "pipeline/stage/boilerplate.py:2 imports pipeline.stage.run inside a function"
    ]


def test_no_circle_is_reported_for_a_layered_graph() -> None:
    graph = {"a": {"b": 1, "c": 1}, "b": {"c": 2}, "c": {}, "d": {"d": 1}}
    assert import_cycles(graph) == []


# ---------------------------------------------------------------- one store configuration on every path
# Where an S3Options may be made: the config dataclasses' defaults (the s3: sections) and the one resolver.
MAY_MAKE_S3_OPTIONS = {
    "pipeline/storage/options.py",  # resolve_s3_options
    "pipeline/corpus_config.py",  # CorpusConfig.s3 default
    "training/config.py",  # TrainConfig.s3 default
}
# Functions that reach a store: each call must hand over the store configuration (positional or s3=).
NEEDS_S3 = {
    "open_store": 2,
    "load_manifest": 2,
    "load_tokenizer": 2,
    "list_inputs": 2,
    "ingest_part": 3,
    "run_ingest_part": 5,
    "run_train_tokenizer": 6,
    "trace_step": None,
    "plan_parts": None,
}


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


# ---------------------------------------------------------------- other libraries used through their public interfaces

FOREIGN = ("prefect", "prefect_dask", "docket", "dask", "distributed")


def _foreign_names(tree: ast.AST) -> set[str]:
    """Names bound in a module to another library's modules or objects (``import prefect.x``,
    ``from docket.worker import Worker``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").split(".")[0] in FOREIGN
            and not node.level
        ):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {
                (a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in FOREIGN
            }
    return names


def foreign_patch_violations(paths: list[Path]) -> list[str]:
    """Assignments to (or ``setattr`` on) an attribute of another library's module, class or object: replacing
    its code from ours, which a release of that library can break silently."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        foreign = _foreign_names(tree)
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
                targets = node.args[:1]
            for target in targets:
                base = target
                while isinstance(base, ast.Attribute):
                    base = base.value
                if base is not target and isinstance(base, ast.Name) and base.id in foreign:
                    found.append(f"{path.name}:{node.lineno} assigns to an attribute of {base.id}")
                elif isinstance(node, ast.Call) and isinstance(base, ast.Name) and base.id in foreign:
                    found.append(f"{path.name}:{node.lineno} setattr on {base.id}")
    return found


def test_no_patches_of_other_libraries() -> None:
    paths = [p for room in PROJECT for p in sources(room)]
    violations = foreign_patch_violations(paths)
    assert not violations, "\n".join(violations)


def test_foreign_patch_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import prefect.client.orchestration as o\nfrom docket.worker import Worker\nimport distributed.scheduler\n"
        "from prefect.context import SettingsContext\n"
        "o.ssl = None\nWorker.__init__ = f\ndistributed.scheduler.heartbeat_interval = g\n"
        "setattr(SettingsContext, 'serialize', h)\nself.workers = 2\nmine.x = 1\n"
    )
    assert [f.split(" ", 1)[1] for f in foreign_patch_violations([bad])] == [
        "assigns to an attribute of o",
        "assigns to an attribute of Worker",
        "assigns to an attribute of distributed",
        "setattr on SettingsContext",
    ]


# ---------------------------------------------------------------- no private name crosses a module boundary


def private_import_violations(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``from pipeline.x import _name`` or ``x._name`` of a project module from another module: a private name
    is the module's own; what others need is public (and documented) or moves to where both can use it."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
        modules: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PROJECT:
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{rel}:{node.lineno} imports {node.module}.{alias.name}")
                    else:
                        modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                modules |= {a.asname or a.name for a in node.names if a.name.split(".")[0] in PROJECT}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append(f"{rel}:{node.lineno} uses {node.value.id}.{node.attr}")
    return found


def test_no_private_name_is_used_across_modules() -> None:
    paths = [p for room in PROJECT for p in sources(room)]
    violations = private_import_violations(paths)
    assert not violations, "\n".join(violations)


def test_private_import_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from flows.build_tasks import _ctx, chunks\nfrom pipeline.clean import wordscan\n"
        "x = wordscan._repeats\ny = chunks._x\nz = other._y\n"
    )
    assert [f.split(" ", 1)[1] for f in private_import_violations([bad], tmp_path)] == [
        "imports flows.build_tasks._ctx",
        "uses wordscan._repeats",
        "uses chunks._x",
    ]


# ---------------------------------------------------------------- other libraries' internals: each one named


@dataclass(frozen=True)
class Internal:
    why: str
    checked: str  # the versions of the library this use was checked against


# (file, or a folder ending in "/", the use as the checker spells it) -> why we read that library's internal.
# A new release of the library may change any of these without notice: each is re-checked when its floor or
# ceiling moves, and whatever is not listed here fails test_no_other_library_internals_are_read.
LIBRARY_INTERNALS: dict[tuple[str, str], Internal] = {
    # ---- third-party libraries
    ("pipeline/clean/langid.py", "model._rowbase"): Internal(
        "py3langid's automaton row offsets: FastIdentifier vectorises py3langid's own walk over its tables "
        "(the reference stays in tests/pipeline/clean/test_langid.py)",
        "py3langid 0.4.0 (0.3.0 has neither _rowbase nor _alias_pairs: pileworks needs py3langid>=0.4)",
    ),
    ("pipeline/clean/langid.py", "model._alias_pairs"): Internal(
        "py3langid's language aliases, applied as its classify applies them", "py3langid 0.4.0"
    ),
    ("pipeline/clean/classifier.py", "self.model.f"): Internal(
        "fastText's C++ binding object, whose per-line predict is the one path that returns right "
        "probabilities under numpy 2 (fasttext-wheel's Python predict fails on one string)",
        "fasttext-wheel 0.9.2 with numpy 2.x",
    ),
    ("training/safe_load.py", "engine._config"): Internal(
        "DeepSpeed's engine config, handed to the checkpoint engine we build in place of its own (read with "
        "getattr and a None default: DeepSpeed's engines accept None)",
        "deepspeed 0.19.8",
    ),
    # ---- the standard library
    ("pipeline/clean/normalize.py", "re._constants"): Internal(
        "the regex parser's constants that re itself uses, to read ftfy's BADNESS_RE (sre_constants on 3.10)",
        "Python 3.11-3.13",
    ),
    ("pipeline/clean/normalize.py", "re._parser"): Internal(
        "the regex parser that re itself uses, to read ftfy's BADNESS_RE (sre_parse on 3.10)",
        "Python 3.11-3.13",
    ),
    ("flows/cli/", "argparse._SubParsersAction"): Internal(
        "the type of add_subparsers()' result, in each command's register() annotation only",
        "Python 3.10-3.13",
    ),
    ("training/checkpoint.py", "os._exit"): Internal("documented: exit without cleanup handlers", "any"),
    ("flows/cli/main.py", "os._exit"): Internal("documented: exit without cleanup handlers", "any"),
    ("flows/runtime/pool.py", "os._exit"): Internal("documented: exit without cleanup handlers", "any"),
    ("flows/runtime/shutdown.py", "os._exit"): Internal("documented: exit without cleanup handlers", "any"),
    ("flows/runtime/shutdown.py", "_thread"): Internal(
        "documented low-level threading module: interrupt_main raises a Ctrl-C lost during a fork again",
        "Python 3.10-3.13",
    ),
    # (more standard-library entries here: concurrent.futures, multiprocessing, with their Python versions)
}

THIRD_PARTY_PROGRAMS = (
    "prefect.server",
    "prefect.cli",
)  # Prefect's server and CLI: run them, never import them
# Internals whose names carry no underscore: module -> attributes read on its objects in a file importing it.
UNDERSCORE_FREE_INTERNALS = {"fasttext": ("f",)}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def project_private_names(paths: Iterable[Path]) -> set[str]:
    """Private attributes the project's own classes and objects have (``self._x = ...``, a method or a field in a
    class body): an ``x._name`` of one of these is ours. A module's private functions and variables do not count:
    read as an attribute from elsewhere they break rule 6."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    return {n for n in names if _private(n)}


def _foreign_module(module: str) -> bool:
    return bool(module) and module.split(".")[0] not in PROJECT and module != "__future__"


def _import_uses(node: ast.AST) -> list[str]:
    """Private modules or names imported from another library, and Prefect's server and CLI."""
    if isinstance(node, ast.Import):
        modules = [a.name for a in node.names]
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level:
        modules = [node.module or ""]
        names = [f"{node.module}.{a.name}" for a in node.names]
    else:
        return []
    found = []
    for module, name in zip(modules * (len(names) if len(modules) == 1 else 1), names, strict=False):
        if not _foreign_module(module):
            continue
        parts = name.split(".")
        program = any(name == p or name.startswith(p + ".") for p in THIRD_PARTY_PROGRAMS)
        if program or any(_private(part) for part in parts):
            found.append(name)
    return found


def foreign_internal_uses(paths: list[Path], root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file, line, use) for every read of another library's internals: a private module or name imported from
    it, ``x._name`` or ``getattr(x, "_name")`` of a private name the project does not define, Prefect's server
    or CLI imported, and :data:`UNDERSCORE_FREE_INTERNALS`."""
    ours = project_private_names(paths)
    found = []
    for path in paths:
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        imported = {
            a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
        }
        hidden = {attr for m in imported for attr in UNDERSCORE_FREE_INTERNALS.get(m, ())}
        for node in ast.walk(tree):
            uses = _import_uses(node)
            if isinstance(node, ast.Attribute) and (
                (_private(node.attr) and node.attr not in ours) or node.attr in hidden
            ):
                uses = [ast.unparse(node)]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _private(node.args[1].value)
                and node.args[1].value not in ours
            ):
                uses = [f"{ast.unparse(node.args[0])}.{node.args[1].value}"]
            found.extend((rel, getattr(node, "lineno", 0), use) for use in uses)
    return sorted(found)


def _listed_by(key: tuple[str, str], rel: str, use: str) -> bool:
    where, listed = key
    return use == listed and (rel == where or (where.endswith("/") and rel.startswith(where)))


def _listed(rel: str, use: str) -> bool:
    return any(_listed_by(key, rel, use) for key in LIBRARY_INTERNALS)


def test_no_other_library_internals_are_read_but_the_listed_ones() -> None:
    paths = [p for room in PROJECT for p in sources(room)]
    uses = foreign_internal_uses(paths)
    unlisted = [f"{rel}:{line} reads {use}" for rel, line, use in uses if not _listed(rel, use)]
    assert not unlisted, (
        "another library's internals, read where LIBRARY_INTERNALS does not name them: use its public interface, "
        "or add the place with the reason and the versions it was checked against:\n" + "\n".join(unlisted)
    )
    stale = {key for key in LIBRARY_INTERNALS if not any(_listed_by(key, rel, use) for rel, _, use in uses)}
    assert not stale, f"allow-list entries nothing reads any more (take them out): {sorted(stale)}"


def test_every_listed_internal_says_why_and_which_versions() -> None:
    for key, internal in LIBRARY_INTERNALS.items():
        assert internal.why.strip() and internal.checked.strip(), key


def test_library_internals_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import fasttext\nimport prefect.cli\nfrom prefect.server.api.server import SubprocessASGIServer\n"
        "from prefect._internal.concurrency import x\nfrom concurrent.futures import _base\n"
        "from docket import _helpers as h\nfrom flows.runtime import _ours\nimport torch._dynamo\n"
        "class Mine:\n    def __init__(self):\n        self._size = 1\n"
        "n = Mine()._size + pool._processes + getattr(engine, '_config', None)\n"
        "p = model.f.predict\ny = m.__dict__\n"
    )
    assert [(line, use) for _, line, use in foreign_internal_uses([bad], tmp_path)] == [
        (2, "prefect.cli"),
        (3, "prefect.server.api.server.SubprocessASGIServer"),
        (4, "prefect._internal.concurrency.x"),
        (5, "concurrent.futures._base"),
        (6, "docket._helpers"),
        (8, "torch._dynamo"),
        (12, "engine._config"),
        (12, "pool._processes"),
        (13, "model.f"),
    ]
    # a listed internal counts only where it is listed
    assert _listed("pipeline/clean/langid.py", "model._rowbase") and not _listed(
        "pipeline/dedup.py", "model._rowbase"
    )
    assert _listed("flows/cli/new.py", "argparse._SubParsersAction")
    assert not _listed("flows/runtime/new.py", "argparse._SubParsersAction")
