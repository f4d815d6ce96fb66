"""The Prefect UI, tested as a person sees it: a real server, a real build, headless Chromium clicking the tabs.

``prefect server start`` runs on 127.0.0.1 with a private PREFECT_HOME; ``pileworks build`` runs against it in a
subprocess (exactly what a user types); then Debian's Chromium, driven by Playwright (never a downloaded browser),
opens the flow run page, looks up every stage in the Task Runs tab, opens the Artifacts tab and the stage table.
Screenshots go to ``test-artifacts/`` (gitignored) for a human to look at.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.flows.prefect_server import prefect_server
from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts"
STAGES = (
    "plan-inputs",
    "ingest",
    "clean",
    "minhash-signatures",
    "near-clusters",
    "tokenize",
    "shard-and-publish",
)
ARTIFACT_KEYS = ("stage-stats", "shards", "manifest", "dedup-audit")
UI_TIMEOUT_MS = 90_000  # the first page load compiles the UI bundle's routes on a loaded machine

pytestmark = [
    pytest.mark.ui,
    pytest.mark.slow,
    pytest.mark.timeout(540),
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt install chromium)"
    ),
]


def run_build(server_env: dict[str, str], inputs: list[str], output: Path) -> dict[str, Any]:
    """``pileworks build --json`` against the server; returns the printed summary."""
    sets = [a for k, v in TINY_OVERRIDES.items() for a in ("--set", f"{k}={v}")]
    cmd = [sys.executable, "-m", "flows.cli", "build", "--output", str(output), "--json", *sets]
    cmd += [a for path in inputs for a in ("--input", path)]
    done = subprocess.run(cmd, env=server_env, capture_output=True, text=True, timeout=300, cwd=SHOTS.parent)
    if done.returncode != 0:
        raise AssertionError(f"pileworks build failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout[done.stdout.index("{") :])


def flow_run_id_of(summary: dict[str, Any]) -> str:
    """The manifest's lineage names the Prefect flow run that built it."""
    manifest_path = summary["manifest_uri"].removeprefix("file://")
    run_id = json.loads(Path(manifest_path).read_text())["lineage"]["prefect_flow_run_id"]
    assert run_id and re.fullmatch(r"[0-9a-f-]{36}", run_id), run_id
    return run_id


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])  # IHDR width, height


def check_task_runs(page: Any, expect: Any) -> None:
    """Task Runs tab: every stage has a Completed run; found with the search box, as a person would."""
    page.get_by_text("Task Runs", exact=True).first.click()
    search = page.get_by_placeholder("Search by run name")
    expect(search).to_be_visible(timeout=UI_TIMEOUT_MS)
    for stage in STAGES:
        search.fill(stage)
        # Task run names are "<task name>-<3 hex>"; "tokenize" must not be satisfied by "train-tokenizer-xxx".
        expect(page.get_by_text(re.compile(rf"^{re.escape(stage)}-[0-9a-f]{{3}}$")).first).to_be_visible(
            timeout=30_000
        )
    search.fill("")
    # The tab's header reads "N Task runs (N Completed)": every task of the build completed.
    deadline, seen = time.monotonic() + 30, None
    while time.monotonic() < deadline:  # the list refreshes a moment after the search box is cleared
        counts = re.search(r"(\d+) Task runs?\s*\((\d+) Completed\)", page.inner_text("body"))
        seen = counts and counts.group(0)
        if counts and int(counts[1]) == int(counts[2]) >= len(STAGES):
            return
        page.wait_for_timeout(500)
    raise AssertionError(f"the Task Runs tab does not show all tasks Completed: {seen!r}")


def check_artifacts(page: Any, expect: Any, summary: dict[str, Any], shot: Path) -> None:
    """Artifacts tab: the four artifact cards; the stage table opens and shows the counts of this build."""
    page.get_by_text("Artifacts", exact=True).first.click()
    for key in ARTIFACT_KEYS:
        expect(page.get_by_text(key, exact=True).first).to_be_visible(timeout=30_000)
    expect(page.get_by_text(f"Shards of dataset {summary['dataset_id']}").first).to_be_visible()
    page.screenshot(path=str(shot), full_page=True)
    page.get_by_text("stage-stats", exact=True).first.click()
    expect(page.get_by_text("Documents and bytes per stage").first).to_be_visible(timeout=30_000)
    for stage, st in summary["stages"].items():  # one table row per stage, with this build's counts
        row = page.get_by_role("row").filter(has=page.get_by_text(stage, exact=True))
        expect(row).to_have_count(1, timeout=30_000)
        for count in (st["docs_in"], st["docs_out"]):
            expect(row.get_by_role("cell", name=str(count), exact=True).first).to_be_visible()
        for reason, n in st["dropped"].items():
            expect(row).to_contain_text(f"{reason}={n}")


def check_flow_run_page(ui_url: str, run_id: str, summary: dict[str, Any], shots: Path) -> list[Path]:
    from playwright.sync_api import expect, sync_playwright

    shots.mkdir(parents=True, exist_ok=True)
    artifacts_shot, table_shot = shots / "ui-flow-run-artifacts.png", shots / "ui-stage-stats.png"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(UI_TIMEOUT_MS)
            page.goto(f"{ui_url}/runs/flow-run/{run_id}", timeout=UI_TIMEOUT_MS)
            expect(page.get_by_text("build_corpus").first).to_be_visible(timeout=UI_TIMEOUT_MS)
            expect(page.get_by_text("Completed").first).to_be_visible()
            check_task_runs(page, expect)
            check_artifacts(page, expect, summary, artifacts_shot)
            page.screenshot(path=str(table_shot), full_page=True)
        finally:
            browser.close()
    return [artifacts_shot, table_shot]


def test_build_corpus_is_visible_in_the_prefect_ui(tmp_path: Path) -> None:
    inputs = write_tiny_corpus(tmp_path / "raw")
    with prefect_server(tmp_path) as server:
        started = time.monotonic()
        summary = run_build(server.client_env(), inputs, tmp_path / "store")
        build_s = time.monotonic() - started
        run_id = flow_run_id_of(summary)
        shots = check_flow_run_page(server.url, run_id, summary, SHOTS)
    for shot in shots:
        width, height = png_size(shot)
        assert width >= 1400 and height >= 1000, (shot, width, height)
        assert shot.stat().st_size > 30_000, f"{shot} is suspiciously small for a rendered page"
    assert summary["exact_duplicates"] == 1 and summary["near_duplicates"] == 1, summary["dropped"]
    print(f"build against the server: {build_s:.1f} s; screenshots: {', '.join(map(str, shots))}")
