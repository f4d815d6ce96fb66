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
