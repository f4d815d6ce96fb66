"""Prefect at whichever end of pyproject's range this environment holds: `make test` installs the newest, `make
test-lowest` the floor (`.ci/floors.py`). Both run this module, so a real flow runs under each end of the range.

The installed Prefect must lie in the declared range (else the job did not test what it claims), and a real build
runs on Prefect's own test server: its flow run and task runs read back through Prefect's client as completed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.prefect_runs import settled_task_runs
from tests.flows.tiny_corpus import TINY_OVERRIDES

pytestmark = [pytest.mark.slow]

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def declared(name: str) -> str:
    """The specifier pyproject's `dependencies` give ``name`` (e.g. ``>=3.2,<4``)."""
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (CI's)
    requirements = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    found = [Requirement(r) for r in requirements if Requirement(r).name == name]
    assert len(found) == 1, f"pyproject.toml lists {name} {len(found)} times"
    return str(found[0].specifier)


def test_the_installed_prefect_lies_in_the_declared_range() -> None:
    import prefect
    from packaging.specifiers import SpecifierSet

    spec = declared("prefect")
    print(f"prefect {prefect.__version__} (pyproject: prefect{spec})")
    assert SpecifierSet(spec).contains(prefect.__version__), (
        f"prefect {prefect.__version__} is outside pyproject's prefect{spec}"
    )


def test_a_real_build_runs_and_its_runs_read_back_through_prefect(
    prefect_harness, tiny_corpus: Path, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client

    from flows.build.flow import build_corpus
    from pipeline.dataset.manifest import load_manifest

    summary = build_corpus(
        inputs=[str(tiny_corpus)], output=str(tmp_path / "store"), overrides=TINY_OVERRIDES
    )
    manifest, _ = load_manifest(summary["manifest_uri"], None)
    run_id = manifest.lineage["prefect_flow_run_id"]
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        tasks = settled_task_runs(client, run.id)
    assert run.state is not None and run.state.is_completed(), run.state
    assert tasks, "the build's task runs must be recorded by Prefect's server"
    assert all(t.state is not None and t.state.is_completed() for t in tasks), [t.state for t in tasks]
