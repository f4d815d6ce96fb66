"""Write a pip constraints file that pins every direct dependency to the floor pyproject.toml allows.

The lowest-versions job (`make test-lowest`) installs with it, so the floors pyproject declares are the versions
CI tests, not a hope. Direct dependencies are `[project].dependencies` plus the extras named on the command line
(the `test` extra by default: the job runs tests). Each requirement must have a `>=` floor; a `<` cap beside it is
kept out of the pin. torch too is pinned at its floor: torch 2.4.0 from PyPI is a CUDA build (about 6 GB with its
NVIDIA libraries), which runs on the CPU; a checkpoint loader written for 2.5 failed every resume on 2.4 until
the job ran it (2026-12-05).

    python .ci/floors.py [--extra test ...] [--skip NAME ...] > constraints.txt
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib  # Python 3.11+: CI and the lowest job run 3.11
from pathlib import Path

# name, then optional [extras], then the specifiers, then an optional environment marker (PEP 508, simplified to
# what pyproject here writes: one requirement per string, no URLs)
REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?P<specs>[^;]*?)\s*(?:;.*)?$"
)


def normalise(name: str) -> str:
    """PEP 503's normal form, so `PyYAML` and `pyyaml` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def floor_of(requirement: str) -> tuple[str, str | None]:
    """(name, floor) of one requirement string; floor is None where it has no `>=`."""
    match = REQUIREMENT.match(requirement)
    if match is None:
        raise ValueError(f"pyproject.toml: cannot read the requirement {requirement!r}")
    floors = [spec.strip()[2:].strip() for spec in match["specs"].split(",") if spec.strip().startswith(">=")]
    if len(floors) > 1:
        raise ValueError(f"pyproject.toml: {requirement!r} has more than one `>=`")
    return normalise(match["name"]), (floors[0] if floors else None)


def direct_requirements(pyproject: dict, extras: list[str]) -> list[str]:
    """The project's requirement strings, then each named extra's; a self-reference (`pileworks[...]`) is left out."""
    project = pyproject["project"]
    own = normalise(project["name"])
    optional = project.get("optional-dependencies", {})
    requirements = list(project.get("dependencies", []))
    for extra in extras:
        if extra not in optional:
            raise ValueError(f"pyproject.toml: no extra named {extra!r} (there are {sorted(optional)})")
        requirements += optional[extra]
    return [r for r in requirements if floor_of(r)[0] != own]


def constraints(pyproject: dict, extras: list[str], skip: set[str]) -> list[str]:
    """`name==floor` lines, one per direct dependency, sorted; a dependency without a floor is an error."""
    pins: dict[str, str] = {}
    for requirement in direct_requirements(pyproject, extras):
        name, floor = floor_of(requirement)
        if name in skip:
            continue
        if floor is None:
            raise ValueError(f"pyproject.toml: {requirement!r} has no `>=` floor for the lowest-versions job")
        if pins.get(name, floor) != floor:
            raise ValueError(f"pyproject.toml: {name} has two floors, {pins[name]} and {floor}")
        pins[name] = floor
    return [f"{name}=={floor}" for name, floor in sorted(pins.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pyproject", type=Path, default=Path(__file__).resolve().parent.parent / "pyproject.toml"
    )
    parser.add_argument(
        "--extra", action="append", default=None, help="an extra whose floors to pin (default: test)"
    )
    parser.add_argument(
        "--skip", action="append", default=[], help="a dependency left unpinned (default: none)"
    )
    args = parser.parse_args(argv)
    pyproject = tomllib.loads(args.pyproject.read_text())
    extras = args.extra if args.extra is not None else ["test"]
    skip = {normalise(s) for s in args.skip}
    try:
        lines = constraints(pyproject, extras, skip)
    except ValueError as error:
        print(f"floors.py: {error}", file=sys.stderr)
        return 2
    print(f"# made by .ci/floors.py from {args.pyproject.name}: each direct dependency at its floor")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
