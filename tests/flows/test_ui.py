"""The Prefect UI, tested as a person sees it: a real server, a real ``pileworks run``, headless Chromium.

``prefect server start`` runs on 127.0.0.1 with a private PREFECT_HOME; ``pileworks run`` (build + a 2-rank
training job in which rank 1 dies while saving a checkpoint, so torchrun restarts it) runs against it in a
subprocess, exactly what a user types. Then Debian's Chromium, driven by Playwright (never a downloaded browser),
opens the runs: named task runs with part numbers, the artifacts (charts with axes, the manifest table, the dedup
cluster), the training's milestones. Screenshots go to ``test-artifacts/`` (gitignored) for a human to look at.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import subprocess
import sys
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.flows.prefect_server import prefect_server
from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TRAIN = {
    "max_steps": 6,
    "warmup_steps": 2,
    "seq_len": 32,
    "micro_batch_size": 2,
    "checkpoint_interval": 2,
    "eval_interval": 3,
    "eval_batches": 1,
    "log_interval": 1,
    "num_workers": 0,
}
CRASH_AT = (
    "4:1"  # rank 1 exits while saving step 4 (training/checkpoint.py's test hook); torchrun restarts it
)
BUILD_ARTIFACTS = {"build-progress", "stage-stats", "build-charts", "manifest", "dedup-audit"}
TRAIN_ARTIFACTS = {"training-progress", "training-curve", "training-final"}
RAW_FLOAT = re.compile(r"\d\.\d{5,}")  # 7.109127759933472, 0.00745...: what rounded numbers never show
UI_TIMEOUT_MS = 90_000  # the first page load compiles the UI bundle's routes on a loaded machine
NS = "{http://www.w3.org/2000/svg}"

pytestmark = [
    pytest.mark.ui,
    pytest.mark.slow,
    pytest.mark.distributed,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt install chromium)"
    ),
]


def run_pileworks(server_env: dict[str, str], inputs: list[str], tmp: Path) -> str:
    """``pileworks run`` against the server; returns its output."""
    # Ids from the records: the valid split (by id hash) is then the same whatever tmp folder the test runs in,
    # so the evaluations this test looks for always have a valid split to run on.
    overrides = TINY_OVERRIDES | {"ingest.id_field": "id"}
    sets = [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
    train = [a for k, v in (TRAIN | {"output_dir": tmp / "run"}).items() for a in ("--train-set", f"{k}={v}")]
    cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "run",
        "--output",
        str(tmp / "store"),
        "--max-restarts",
        "1",
        "--timeout",
        "500",
        *sets,
        *train,
        *(a for path in inputs for a in ("--input", path)),
    ]
    env = server_env | {"PILEWORKS_TEST_EXIT_IN_SAVE": CRASH_AT}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=700, cwd=tmp)
    if done.returncode != 0:
        raise AssertionError(f"pileworks run failed ({done.returncode}):\n{done.stderr[-5000:]}")
    return done.stdout


def api(server: Any, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        f"{server.api_url}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.build_opener().open(req, timeout=30) as resp:
        return json.load(resp)


def runs_by_flow(server: Any) -> dict[str, dict[str, Any]]:
    flows = {f["id"]: f["name"] for f in api(server, "/flows/filter", {})}
    return {flows[r["flow_id"]]: r for r in api(server, "/flow_runs/filter", {})}


def artifacts_of(server: Any, run_id: str) -> list[dict[str, Any]]:
    return api(server, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}}})


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])  # IHDR width, height


def check_task_names(page: Any, expect: Any, searches: dict[str, str]) -> None:
    """Task Runs tab: each search finds a task run whose whole name matches the pattern, as a person would."""
    page.get_by_text("Task Runs", exact=True).first.click()
    search = page.get_by_placeholder("Search by run name")
    expect(search).to_be_visible(timeout=UI_TIMEOUT_MS)
    for text, pattern in searches.items():
        search.fill(text)
        expect(page.get_by_text(re.compile(pattern)).first).to_be_visible(timeout=30_000)
    search.fill("")


def check_chart(page: Any, expect: Any, alt: str, labels: set[str]) -> None:
    """The chart image is shown (decoded, non-zero size) and its SVG has the axis labels and numeric ticks."""
    img = page.get_by_alt_text(alt).first
    expect(img).to_be_visible(timeout=30_000)
    assert img.evaluate("i => i.complete && i.naturalWidth > 100 && i.naturalHeight > 100"), (
        f"{alt} not drawn"
    )
    svg = ET.fromstring(base64.b64decode(img.get_attribute("src").split(",", 1)[1]))
    texts = {t.get("class"): [] for t in svg.iter(f"{NS}text")}
    for t in svg.iter(f"{NS}text"):
        texts[t.get("class")].append(t.text or "")
    assert labels <= set(texts.get("xlabel", []) + texts.get("ylabel", [])), texts
    ticks = texts.get("xtick", []) + texts.get("ytick", [])
    assert len(ticks) >= 5 and all(not RAW_FLOAT.search(t) for t in ticks), ticks


def open_artifact(page: Any, expect: Any, ui: str, artifact: dict[str, Any], shot: Path) -> str:
    page.goto(f"{ui}/artifacts/artifact/{artifact['id']}", timeout=UI_TIMEOUT_MS)
    expect(page.get_by_text(artifact["key"]).first).to_be_visible(timeout=UI_TIMEOUT_MS)
    page.wait_for_timeout(1500)  # images decode
    page.set_viewport_size({"width": 1400, "height": 2600})  # the UI scrolls inside its own pane: show it all
    page.screenshot(path=str(shot), full_page=True)
    page.set_viewport_size({"width": 1400, "height": 1000})
    body = page.inner_text("main") if page.locator("main").count() else page.inner_text("body")
    assert not RAW_FLOAT.search(body), (
        f"{artifact['key']} shows an unrounded number: {RAW_FLOAT.search(body)}"
    )
    return body


def check_build(
    page: Any, expect: Any, ui: str, run: dict[str, Any], arts: dict[str, Any], shots: Path
) -> None:
    page.goto(f"{ui}/runs/flow-run/{run['id']}", timeout=UI_TIMEOUT_MS)
    expect(page.get_by_text(run["name"]).first).to_be_visible(timeout=UI_TIMEOUT_MS)
    check_task_names(
        page,
        expect,
        {
            "clean + exact hash": r"^clean \+ exact hash 1(-\d+|(, \d+)+|, \d+, …, \d+)/\d+$",
            "tokenize": r"^tokenize \d+(-\d+|(, \d+)+|, \d+, …, \d+)/\d+$",
            "bands": r"^near-dedup: bands \d+(-\d+|(, \d+)+|, \d+, …, \d+)/\d+$",
            "shards: write": r"^shards: write train \d+(-\d+)?(, valid \d+(-\d+)?)?$",
            "manifest: publish": r"^manifest: publish$",
        },
    )
    page.screenshot(path=str(shots / "ui-build-task-runs.png"), full_page=True)
    page.get_by_text("Artifacts", exact=True).first.click()
    for key in BUILD_ARTIFACTS:
        expect(page.get_by_text(key, exact=True).first).to_be_visible(timeout=30_000)
    page.screenshot(path=str(shots / "ui-build-artifacts.png"), full_page=True)
    body = open_artifact(page, expect, ui, arts["manifest"], shots / "ui-manifest.png")
    for fact in ("dataset id", "tokenizer", "train", "sha256", "Inputs"):
        assert fact in body, f"manifest artifact lacks {fact!r}"
    expect(
        page.get_by_role("cell", name=re.compile(r"^[0-9a-f]{12}$")).first
    ).to_be_visible()  # sha256 prefix
    open_artifact(page, expect, ui, arts["build-charts"], shots / "ui-build-charts.png")
    check_chart(page, expect, "documents per stage chart", {"documents"})
    check_chart(page, expect, "drops by reason chart", {"documents"})
    body = open_artifact(page, expect, ui, arts["dedup-audit"], shots / "ui-dedup-audit.png")
    assert re.search(r"Example: cluster 0 \(2 documents", body) and "kept" in body and "dropped" in body
    open_artifact(page, expect, ui, arts["stage-stats"], shots / "ui-stage-stats.png")
    row = page.get_by_role("row").filter(has=page.get_by_text("near_dedup", exact=True))
    expect(row).to_contain_text("near_duplicate=1")


def check_training(
    page: Any, expect: Any, ui: str, run: dict[str, Any], arts: dict[str, Any], shots: Path
) -> None:
    page.goto(f"{ui}/runs/flow-run/{run['id']}", timeout=UI_TIMEOUT_MS)
    expect(page.get_by_text(run["name"]).first).to_be_visible(timeout=UI_TIMEOUT_MS)
    check_task_names(
        page,
        expect,
        {
            "checkpoint step 2": r"^checkpoint step 2 committed \(\d+ files, COMPLETE\.json\)$",
            "exited": r"^rank 1 exited with code 17$",
            "restart": r"^restart 1: resumed from step 2$",
            "eval step": r"^eval step 3: valid loss \d+\.\d{1,3}$",
            "finished": r"^finished step 6: loss \d+\.\d{1,3}$",
            "deepspeed": r"^deepspeed job: 2 ranks$",
        },
    )
    page.set_viewport_size({"width": 1400, "height": 2000})  # every milestone, the crash and the restart
    page.wait_for_timeout(1000)
    page.screenshot(path=str(shots / "ui-train-task-runs.png"), full_page=True)
    page.set_viewport_size({"width": 1400, "height": 1000})
    body = open_artifact(page, expect, ui, arts["training-curve"], shots / "ui-training-curve.png")
    assert (
        "TensorBoard" in body
        and "metrics.jsonl" in body
        and "restart 1: from the checkpoint of step 2" in body
    )
    check_chart(page, expect, "loss chart: train and valid loss against step", {"step", "loss (nats/token)"})
    check_chart(page, expect, "throughput chart: tokens/s against step", {"step", "tokens/s"})
    check_chart(page, expect, "learning rate chart: lr against step", {"step", "lr"})
    open_artifact(page, expect, ui, arts["training-final"], shots / "ui-training-final.png")


def check_browser(
    ui: str, runs: dict[str, dict[str, Any]], arts: dict[str, dict[str, Any]], shots: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(UI_TIMEOUT_MS)
            check_build(page, expect, ui, runs["build_corpus"], arts, shots)
            check_training(page, expect, ui, runs["train"], arts, shots)
        finally:
            browser.close()


def test_pileworks_run_is_readable_in_the_prefect_ui(tmp_path: Path) -> None:
    inputs = write_tiny_corpus(tmp_path / "raw", ids=True)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with prefect_server(tmp_path) as server:
        run_pileworks(server.client_env(), inputs, tmp_path)
        runs = runs_by_flow(server)
        build, train = runs["build_corpus"], runs["train"]
        assert re.fullmatch(r"build tiny [0-9a-f]{8}", build["name"]), build["name"]
        assert train["name"] == f"train tiny on tiny@{build['name'][-8:]}", train["name"]
        arts: dict[str, dict[str, Any]] = {}
        for run, keys in ((build, BUILD_ARTIFACTS), (train, TRAIN_ARTIFACTS)):
            found = artifacts_of(server, run["id"])
            # A persisted flow result is an artifact without key or type (checked: result_serializer="json"
            # gives one per run); every artifact of ours has both.
            assert all(a["key"] and a["type"] for a in found), [(a["key"], a["type"]) for a in found]
            arts |= {a["key"]: a for a in found}
            assert keys <= set(arts), (run["name"], sorted(arts))
        assert "8/8 stages" in arts["build-progress"]["description"], arts["build-progress"]["description"]
        assert arts["training-progress"]["data"] == 100.0
        logs = api(server, "/logs/filter", {"logs": {"flow_run_id": {"any_": [build["id"]]}}, "limit": 200})
        assert not [
            m for m in logs if m["task_run_id"] and m["message"].startswith("Finished in state Completed")
        ]
        assert any(m["message"].startswith("boilerplate:") for m in logs)  # stage summaries stay
        check_browser(server.url, runs, arts, SHOTS)
    shots = sorted(SHOTS.glob("ui-*.png"))
    for shot in shots:
        width, height = png_size(shot)
        assert width >= 1400 and height >= 1000 and shot.stat().st_size > 30_000, shot
    print("screenshots:", *map(str, shots), sep="\n  ")
