"""The documentation keeps up with the code: every command and config section has a guide, links resolve.

Commands come from the parser ``pileworks`` builds (``flows.cli.main.build_parser``), sub-commands included
(``inspect card``, ``quality train``, and a leaf's choice positional such as ``server start``); config sections
from the embedded corpus config (``pipeline/configs/corpus.yaml``) and the dataclasses it loads into, so a section
commented out in the YAML (``clean.classifier``) or living in a list (``sources[].quality``) counts too. A name is
documented when a guide holds it as inline code: `` `pileworks server start` ``, `` `inspect card` ``,
`` `clean.quality` ``. Each checker is also shown failing on a planted gap.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.cli.main import build_parser
from pipeline.corpus_config import DEFAULT_CONFIG, CorpusConfig

ROOT = Path(__file__).resolve().parents[1]
GUIDES = ("pipeline/README.md", "flows/README.md", "training/README.md", "infra/README.md")
LINKED = ("README.md", *GUIDES, "CONTRIBUTING.md", "tests/bench/README.md")
FRONT_PAGE_MAX_LINES = 150


# ---------------------------------------------------------------- what must be documented


def cli_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[str]:
    """Every command path of the parser: sub-parsers at any depth, and the choices of a leaf's positional."""
    found: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append(" ".join((*prefix, name)))
                found += cli_commands(sub, (*prefix, name))
        elif prefix and not action.option_strings and action.choices is not None:
            found += [" ".join((*prefix, str(choice))) for choice in action.choices]
    return found


def _is_config(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _section_type(tp: Any) -> tuple[type | None, str]:
    """The dataclass a field holds (directly, optional, or as a tuple of them) and the suffix its path takes."""
    if _is_config(tp):
        return tp, ""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if _is_config(a)]
        return (inner[0], "") if inner else (None, "")
    if origin is tuple and args and _is_config(args[0]):
        return args[0], "[]"
    return None, ""


def dataclass_sections(cls: type = CorpusConfig, prefix: str = "") -> list[str]:
    """Dotted names of every nested config dataclass: ``clean.quality``, ``sources``, ``sources[].langid``."""
    found: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        inner, suffix = _section_type(hints[f.name])
        if inner is not None:
            found.append(prefix + f.name)
            found += dataclass_sections(inner, f"{prefix}{f.name}{suffix}.")
    return found


def yaml_sections(data: dict[str, Any], cls: type | None = CorpusConfig, prefix: str = "") -> list[str]:
    """Dotted names of the YAML's mapping-valued keys that are sections: those whose field holds a config
    dataclass, or that no dataclass field explains (an unknown mapping counts, so it cannot hide)."""
    found: list[str] = []
    hints = typing.get_type_hints(cls) if cls is not None else {}
    for key, value in data.items():
        if not isinstance(value, dict):
            continue
        inner = _section_type(hints[key])[0] if key in hints else None
        if inner is not None or key not in hints:
            found.append(prefix + key)
            found += yaml_sections(value, inner, f"{prefix}{key}.")
    return found


def config_sections() -> list[str]:
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    return sorted(set(dataclass_sections()) | set(yaml_sections(data)))


# ---------------------------------------------------------------- the checkers


def command_documented(command: str, text: str) -> bool:
    """`pileworks COMMAND ...` or `COMMAND ...` as inline code."""
    return re.search(r"`(?:pileworks )?" + re.escape(command) + r"[ `]", text) is not None


def section_documented(section: str, text: str) -> bool:
    """`section` as inline code, alone or followed by a colon or a space (`clean.c4: ...`)."""
    return re.search(r"`" + re.escape(section) + r"[`:\s]", text) is not None


def undocumented(names: list[str], texts: list[str], documented: Any) -> list[str]:
    return [name for name in names if not any(documented(name, text) for text in texts)]


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    found: set[str] = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6} (.+)", line)):
            slug = github_slug(m.group(1))
            n = 0
            while (slug if n == 0 else f"{slug}-{n}") in found:
                n += 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def broken_links(path: Path, text: str) -> list[str]:
    """Relative links of a markdown file whose target (and ``#anchor`` in a markdown target) does not exist."""
    broken = []
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for target in LINK.findall(prose):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{target}: no heading with that anchor")
    return broken


# A path of the repository's code (`pipeline/units/protocol.py`, `tests/bench/README.md`, or `path.name` for a
# name in a module: `flows/build/plan.sizing`) or a dotted module name (`pipeline.units.protocol.checked_bytes`),
# wherever a markdown file names one. CHANGELOG.md is left out: its entries name the paths of their day.
CODE_PATH = re.compile(r"(?<![\w/.\-~$])((?:pipeline|flows|training|tests|infra)/[\w./\-]*)")
CODE_NAME = re.compile(r"(?<![\w./\-])((?:pipeline|flows|training)(?:\.[A-Za-z_]\w*)+)")
MADE_BY_THE_USER = {"infra/.env"}  # infra/README.md: `cp infra/.env.example infra/.env`


def top_level_names(module: Path) -> set[str]:
    """What a module defines or imports at its top level."""
    names: set[str] = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def _name_exists(parts: list[str], root: Path) -> bool:
    """``parts`` of a dotted name: packages, then a module (a ``.py``, or a kernel's ``.c``), then a name in it."""
    here = root / parts[0]
    for i, part in enumerate(parts[1:], 1):
        if (here / part / "__init__.py").exists():
            here = here / part
        elif (here / f"{part}.c").exists():
            return True
        elif (here / f"{part}.py").exists():
            rest = parts[i + 1 :]
            return not rest or rest[0] in top_level_names(here / f"{part}.py")
        else:
            return (here / "__init__.py").exists() and part in top_level_names(here / "__init__.py")
    return (here / "__init__.py").exists()


def missing_code(text: str, root: Path = ROOT) -> list[str]:
    """The paths and module names ``text`` names that the tree at ``root`` does not hold."""
    missing = []
    for match in CODE_PATH.finditer(text):
        path = match.group(1).rstrip(".-")
        module, _, name = path.rpartition(".")
        found = (root / path).exists() or path in MADE_BY_THE_USER
        if not found and "/" in module and (root / f"{module}.py").exists():
            found = name in top_level_names(root / f"{module}.py")
        if not found:
            missing.append(path)
    for match in CODE_NAME.finditer(text):
        if not _name_exists(match.group(1).split("."), root):
            missing.append(match.group(1))
    return missing


def screen_gaps(markdown: str, root: Path = ROOT) -> list[str]:
    """CONTRIBUTING.md's "Architecture in one screen": a top folder (``pipeline/``) starts a block; each room it
    draws (``  units/``) is a folder there and each ``name.py``/``name.c`` it names is a file somewhere below it;
    every room of pipeline/ and flows/ on disk is drawn."""
    screen = markdown.split("## Architecture in one screen", 1)[1].split("```")[1]
    gaps, drawn, top = [], set(), ""
    for line in screen.splitlines():
        if m := re.match(r"(\w+)/\s", line):
            top = m.group(1)
        elif m := re.match(r"  (\w+)/\s", line):
            drawn.add(f"{top}/{m.group(1)}")
            if not (root / top / m.group(1)).is_dir():
                gaps.append(f"{top}/{m.group(1)}/: no such folder")
        for name in re.findall(r"\b\w+\.(?:py|c)\b", line):
            if top and not any((root / top).rglob(name)):
                gaps.append(f"{top}/**/{name}: no such file")
    for top in ("pipeline", "flows"):
        on_disk = {f"{top}/{p.parent.name}" for p in (root / top).glob("*/__init__.py")}
        gaps += [f"{room}/: not drawn" for room in sorted(on_disk - drawn)]
    return gaps


def markdown_files(root: Path = ROOT) -> list[Path]:
    skip = {"build", "node_modules"}
    return sorted(
        p
        for p in root.rglob("*.md")
        if p.name != "CHANGELOG.md"
        and not any(part.startswith(".") or part in skip for part in p.relative_to(root).parts)
    )


def guide_texts() -> list[str]:
    return [(ROOT / g).read_text() for g in GUIDES]


# ---------------------------------------------------------------- the tests


def test_every_command_is_documented_in_a_guide() -> None:
    commands = cli_commands(build_parser())
    assert {"build", "inspect card", "quality train", "server start"} <= set(commands)
    missing = undocumented(commands, guide_texts(), command_documented)
    assert not missing, f"commands no guide documents (as `pileworks CMD` or `CMD` inline code): {missing}"


def test_every_config_section_is_documented_in_a_guide() -> None:
    sections = config_sections()
    assert {"clean.quality", "clean.classifier", "dedup.near", "sources[].quality", "ingest.html"} <= set(
        sections
    )
    missing = undocumented(sections, guide_texts(), section_documented)
    assert not missing, f"config sections no guide documents (as `section` inline code): {missing}"


def test_front_page_is_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= FRONT_PAGE_MAX_LINES, f"README.md has {lines} lines; move detail into a guide"


@pytest.mark.parametrize("name", LINKED)
def test_relative_links_resolve(name: str) -> None:
    path = ROOT / name
    assert not broken_links(path, path.read_text())


def test_every_path_and_module_the_docs_name_exists() -> None:
    files = markdown_files()
    assert {ROOT / "CONTRIBUTING.md", ROOT / "pipeline" / "README.md"} <= set(files)
    missing = {str(p.relative_to(ROOT)): found for p in files if (found := missing_code(p.read_text()))}
    assert not missing, f"paths and modules named in the docs that do not exist: {missing}"


def test_the_architecture_screen_draws_today_s_tree() -> None:
    assert screen_gaps((ROOT / "CONTRIBUTING.md").read_text()) == []


def test_readme_links_every_guide() -> None:
    readme = (ROOT / "README.md").read_text()
    assert [g for g in GUIDES if f"]({g}" not in readme] == []


# ---------------------------------------------------------------- planted gaps


def test_checker_reports_a_planted_missing_command() -> None:
    text = (
        "\n".join(guide_texts())
        .replace("`pileworks janitor", "pileworks janitor")
        .replace("`janitor", "janitor")
    )
    assert undocumented(cli_commands(build_parser()), [text], command_documented) == ["janitor"]


def test_checker_reports_a_planted_missing_section() -> None:
    text = "\n".join(guide_texts())
    planted = re.sub(r"`clean\.pii([`:\s])", r"clean.pii\1", text)
    assert undocumented(config_sections(), [planted], section_documented) == ["clean.pii"]


def test_section_walk_sees_a_planted_yaml_section() -> None:
    data = {"clean": {"quality": {"min_words": 1}, "novel": {"x": 1}}, "dedup": {"near": {"threshold": 0.5}}}
    assert yaml_sections(data) == ["clean", "clean.quality", "clean.novel", "dedup", "dedup.near"]


def test_command_walk_sees_a_planted_sub_command() -> None:
    parser = argparse.ArgumentParser(prog="p")
    sub = parser.add_subparsers()
    sub.add_parser("plain")
    nested = sub.add_parser("outer").add_subparsers()
    nested.add_parser("inner")
    sub.add_parser("svc").add_argument("action", choices=("up", "down"))
    assert cli_commands(parser) == ["plain", "outer", "outer inner", "svc", "svc up", "svc down"]


def test_checker_reports_a_planted_broken_link(tmp_path: Path) -> None:
    (tmp_path / "guide.md").write_text("# Guide\n\n## The store\n")
    page = tmp_path / "README.md"
    text = (
        "[ok](guide.md) [ok](guide.md#the-store) [web](https://example.com)\n"
        "[gone](missing.md) [bad anchor](guide.md#no-such)\n```\n[in code](ignored.md)\n```\n"
    )
    assert broken_links(page, text) == [
        "missing.md: no such file",
        "guide.md#no-such: no heading with that anchor",
    ]


def plant(root: Path, files: dict[str, str]) -> None:
    for rel, body in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(body)


def test_checker_reports_planted_stale_code_names(tmp_path: Path) -> None:
    tree = {
        "pipeline/__init__.py": "",
        "pipeline/units/__init__.py": "",
        "pipeline/units/protocol.py": "from pipeline.errors import StorageError\ndef checked_bytes(): ...\nDONE = 1\n",
        "pipeline/clean/__init__.py": "",
        "pipeline/clean/_lines.c": "",
        "infra/x.sh": "",
    }
    plant(tmp_path, tree)
    text = (
        "Alive: `pipeline/units/protocol.py`, `pipeline/units/protocol.checked_bytes`, `pipeline/units/`,\n"
        "pipeline.units.protocol.DONE, `pipeline.units.protocol.StorageError.x`, `pipeline.clean._lines`,\n"
        "infra/x.sh. `infra/.env`, s3://bucket/pipeline/gone.py.\n"
        "Gone: `pipeline/units.py`, pipeline/unitcache.py. `pipeline/units/protocol.nothing`,\n"
        "`pipeline.units.checked_bytes`, pipeline.unitcache, `pipeline.units.protocol.nothing`, `infra/y.sh`\n"
    )
    assert missing_code(text, tmp_path) == [
        "pipeline/units.py",
        "pipeline/unitcache.py",
        "pipeline/units/protocol.nothing",
        "infra/y.sh",
        "pipeline.units.checked_bytes",
        "pipeline.unitcache",
        "pipeline.units.protocol.nothing",
    ]


def test_screen_check_reports_a_planted_old_tree(tmp_path: Path) -> None:
    plant(
        tmp_path,
        dict.fromkeys(
            (
                "pipeline/units/__init__.py",
                "pipeline/units/cache.py",
                "pipeline/dedup/__init__.py",
                "pipeline/errors.py",
                "flows/build/__init__.py",
                "flows/build/flow.py",
            ),
            "",
        ),
    )
    text = (
        "## Architecture in one screen\n\n```\n"
        "flows/        the shell\n  build/   flow.py\n"
        "pipeline/     the library\n  errors.py   errors\n  units/   cache.py\n"
        "  unitcache.py   the old cache\n  tokenize/   stage.py\n```\n"
    )
    assert screen_gaps(text, tmp_path) == [
        "pipeline/**/unitcache.py: no such file",
        "pipeline/tokenize/: no such folder",
        "pipeline/**/stage.py: no such file",
        "pipeline/dedup/: not drawn",
    ]
