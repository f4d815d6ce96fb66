"""Two real ranks over gloo under torchrun, through ``training.launch.run_local``, on the tiny fixture dataset.

One uninterrupted ZeRO-2 run is the reference; resume, kill -9 and killed-mid-save runs must reproduce its
per-step losses bit for bit (CPU, fp32, same world size). Losses are read from the metrics JSONL, where they
are written with full float precision.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.fixtures.tiny_dataset import build_tiny_dataset
from tests.training.tamper import plant_payload
from training.checkpoint import (
    CRASH_IN_SAVE_ENV,
    RECORD_NAME,
    list_tags,
    step_of_tag,
    tag_for_step,
    verify_tag,
)
from training.generate import convert_to_fp32, generate, load_model
from training.launch import run_local
from training.metrics import read_metrics
from training.safe_load import safe_load

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

MAX_STEPS = 18  # 16 samples per step, 161 samples per epoch: the run crosses an epoch boundary
BASE = {
    "preset": "tiny",
    "model": {"d_model": 64, "n_layer": 2},
    "seq_len": 64,
    "micro_batch_size": 4,
    "grad_accum_steps": 2,
    "max_steps": MAX_STEPS,
    "warmup_steps": 3,
    "lr": 3e-3,
    "checkpoint_interval": 6,
    "keep_last": 3,
    "eval_interval": 6,
    "eval_batches": 1,
    "log_interval": 1,
    "num_workers": 1,
    "zero_stage": 2,
    "tensorboard": False,
    "pg_timeout_s": 60,
    "record_samples": True,
}
RUN_TIMEOUT_S = 240
# the refusal of a planted exec; torch 2.4 names the global "builtins.exec", 2.5 and later "exec"
REFUSED_EXEC = re.compile(
    r"refused by the weights-only loader \(Unsupported global: GLOBAL (builtins\.)?exec\)"
)
STEP_LINE = re.compile(r"^\[Rank (\d)\] .* step (\d+)/\d+ loss ([0-9.]+) \(this rank ([0-9.]+)\)")


@pytest.fixture(scope="module")
def manifest_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_dataset(tmp_path_factory.mktemp("tiny-store"))


def train(manifest_uri: str, out: Path, *, lines: list[str] | None = None, on_line=None, **kw) -> int:
    overrides = {**BASE, "output_dir": str(out), **kw.pop("overrides", {})}
    sink = lines if lines is not None else []

    def collect(line: str) -> None:
        sink.append(line)
        if on_line is not None:
            on_line(line)

    return run_local(
        manifest_uri, None, 2, overrides=overrides, on_line=collect, timeout_s=RUN_TIMEOUT_S, **kw
    )


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out)}


def samples_seen(out: Path) -> dict[tuple[int, int], list[int]]:
    """(step, rank) -> the dataset indices that rank trained on, in order (a replayed step: its last run)."""
    seen = {}
    for path in sorted((out / "samples").glob("rank-*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            seen[(rec["step"], rec["rank"])] = rec["indices"]
    return seen


def global_samples(out: Path) -> dict[int, list[int]]:
    """step -> the sorted indices all ranks trained on together in that step."""
    by_step: dict[int, list[int]] = {}
    for (step, _rank), indices in samples_seen(out).items():
        by_step.setdefault(step, []).extend(indices)
    return {step: sorted(indices) for step, indices in by_step.items()}


@pytest.fixture(scope="module")
def reference_run(manifest_uri: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The uninterrupted ZeRO-2 run: its output folder and its merged log lines."""
    out = tmp_path_factory.mktemp("reference")
    lines: list[str] = []
    assert train(manifest_uri, out, lines=lines) == 0, "\n".join(lines[-40:])
    return out, lines


@pytest.fixture(scope="module")
def reference(reference_run: tuple[Path, list[str]]) -> dict[int, float]:
    result = losses(reference_run[0])
    assert sorted(result) == list(range(1, MAX_STEPS + 1))
    return result


def assert_loss_falls(by_step: dict[int, float]) -> None:
    first = sum(by_step[s] for s in range(1, 4)) / 3
    last = sum(by_step[s] for s in range(MAX_STEPS - 2, MAX_STEPS + 1)) / 3
    assert last < first - 0.5, (first, last)


def assert_rank_averaged_logging(lines: list[str], by_step: dict[int, float]) -> None:
    """Both ranks log every step with a [Rank N] prefix: the same averaged loss, their own local losses."""
    seen: dict[int, dict[int, tuple[float, float]]] = {}
    for line in lines:
        match = STEP_LINE.match(line)
        if match:
            rank, step, avg, local = int(match[1]), int(match[2]), float(match[3]), float(match[4])
            seen.setdefault(step, {})[rank] = (avg, local)
    assert sorted(seen) == list(range(1, MAX_STEPS + 1))
    for step, ranks in seen.items():
        assert set(ranks) == {0, 1}
        (avg0, local0), (avg1, local1) = ranks[0], ranks[1]
        assert avg0 == avg1 and avg0 == pytest.approx(by_step[step], abs=1e-6)
        assert avg0 == pytest.approx((local0 + local1) / 2, abs=2e-6)
    assert any(ranks[0][1] != ranks[1][1] for ranks in seen.values()), "ranks saw the same data"


def test_zero2_loss_falls_and_is_rank_averaged(reference_run: tuple[Path, list[str]]) -> None:
    out, lines = reference_run
    by_step = losses(out)
    assert_loss_falls(by_step)
    assert_rank_averaged_logging(lines, by_step)
    assert list_tags(out / "checkpoints") == [tag_for_step(s) for s in (18, 12, 6)]
    evals = read_metrics(out, "eval")
    assert [e["step"] for e in evals] == [6, 12, 18] and evals[-1]["loss"] < evals[0]["loss"]
    assert not any("Traceback" in line for line in lines)


def test_checkpoint_converts_to_fp32_and_generates(
    reference_run: tuple[Path, list[str]], tmp_path: Path
) -> None:
    import torch

    out, _ = reference_run
    tag_dir = out / "checkpoints" / tag_for_step(MAX_STEPS)
    model, record, used = load_model(out / "checkpoints")  # the newest verified tag
    assert used == tag_dir and record["step"] == MAX_STEPS
    # fp32 training: the ZeRO-merged fp32 master weights equal the module weights DeepSpeed saved.
    module = safe_load(tag_dir / "mp_rank_00_model_states.pt", map_location="cpu")["module"]
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, module[name].float()), name
    path = convert_to_fp32(tag_dir, tmp_path / "model.pt")
    assert set(torch.load(path, weights_only=True)) >= {"embed.weight", "ln_final.weight"}
    text = generate(out / "checkpoints", "The model", max_new_tokens=12, temperature=0.8, top_k=20, seed=1)
    assert text.startswith("The model") and len(text) > len("The model")
    assert text == generate(tag_dir, "The model", max_new_tokens=12, temperature=0.8, top_k=20, seed=1)


def test_deepspeeds_own_zero_to_fp32_script_works_without_a_tag(
    reference_run: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """The ``zero_to_fp32.py`` DeepSpeed copies into the checkpoint folder, run unchanged, finds ``latest``."""
    import torch

    ckpt = reference_run[0] / "checkpoints"
    assert (ckpt / "latest").read_text() == tag_for_step(MAX_STEPS)
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    done = subprocess.run(
        [sys.executable, str(ckpt / "zero_to_fp32.py"), str(ckpt), str(tmp_path / "fp32")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = torch.load(tmp_path / "fp32" / "pytorch_model.bin", weights_only=True)
    model, _record, _tag = load_model(ckpt)
    ours = model.state_dict()
    assert set(theirs) <= set(ours) and "embed.weight" in theirs
    for name, tensor in theirs.items():
        assert torch.equal(tensor, ours[name]), name


def test_trained_zero2_checkpoint_exports_to_transformers_with_equal_logits(
    manifest_uri: str, reference_run: tuple[Path, list[str]], tmp_path: Path
) -> None:
    import torch

    transformers = pytest.importorskip("transformers", reason="the hf extra is absent")
    from pipeline.dataset.manifest import load_manifest
    from training.evaluate import evaluate_checkpoint
    from training.export_hf import export_hf

    ckpt = reference_run[0] / "checkpoints"
    model, record, _tag = load_model(ckpt)
    manifest, _store = load_manifest(manifest_uri, None)
    assert record["tokenizer"]["eos_id"] == manifest.tokenizer.eos_id
    out = export_hf(ckpt, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tok("the model was trained on the data of the archive")["input_ids"]])
    with torch.no_grad():
        diff = (hf(ids).logits - model(ids)).abs().max().item()
    assert diff <= 1e-4, diff
    result = evaluate_checkpoint(ckpt)  # the valid split of its own dataset
    evals = read_metrics(reference_run[0], "eval")
    assert result["split"] == "valid" and result["loss"] < evals[0]["loss"] + 1.0


def test_zero1_loss_falls_and_is_rank_averaged(manifest_uri: str, tmp_path: Path) -> None:
    lines: list[str] = []
    upload = tmp_path / "uploaded"
    overrides = {"zero_stage": 1, "keep_last": 1, "checkpoint_upload_uri": upload.as_uri()}
    code = train(manifest_uri, tmp_path / "run", lines=lines, overrides=overrides)
    assert code == 0, "\n".join(lines[-40:])
    by_step = losses(tmp_path / "run")
    assert_loss_falls(by_step)
    assert_rank_averaged_logging(lines, by_step)
    assert list_tags(tmp_path / "run" / "checkpoints") == [tag_for_step(18)]
    # every committed tag was uploaded, record included, even those pruned locally since
    assert list_tags(upload) == [tag_for_step(s) for s in (18, 12, 6)]
    verify_tag(upload / tag_for_step(18))


def test_stop_and_resume_is_bitwise_exact(
    manifest_uri: str, reference: dict[int, float], reference_run: tuple[Path, list[str]], tmp_path: Path
) -> None:
    reference_out = reference_run[0]
    lines: list[str] = []
    assert train(manifest_uri, tmp_path, lines=lines, stop_at_step=9) == 0, "\n".join(lines[-40:])
    assert sorted(losses(tmp_path)) == list(range(1, 10))
    assert train(manifest_uri, tmp_path, lines=lines) == 0, "\n".join(lines[-40:])
    assert any("resumed from" in line and tag_for_step(9) in line for line in lines)
    assert losses(tmp_path) == reference  # every step, bit for bit
    assert samples_seen(tmp_path) == samples_seen(reference_out)  # every rank, every step, in order
    start = [r for r in read_metrics_all(tmp_path) if r["kind"] == "start"]
    assert [r["resumed_from"] for r in start] == [None, 9]


def test_resume_on_another_world_size_sees_the_same_samples_and_a_changed_seed_is_refused(
    manifest_uri: str, reference_run: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """2 ranks x 4 stop at step 9; 1 rank x 8 (same world * micro batch, same accumulation) finishes: every
    step trains on exactly the samples of the uninterrupted 2-rank run. ZeRO 0: DeepSpeed cannot re-partition
    ZeRO optimizer shards. Then a resume with another seed is refused in one line naming the field."""
    lines: list[str] = []
    zero0 = {"zero_stage": 0}
    assert train(manifest_uri, tmp_path, lines=lines, overrides=zero0, stop_at_step=9) == 0, "\n".join(
        lines[-40:]
    )
    one_rank = {**BASE, **zero0, "output_dir": str(tmp_path), "micro_batch_size": 8}
    code = run_local(manifest_uri, None, 1, overrides=one_rank, on_line=lines.append, timeout_s=RUN_TIMEOUT_S)
    assert code == 0, "\n".join(lines[-40:])
    assert any("world_size 2 -> 1" in line and "the global sample order continues" in line for line in lines)
    assert sorted(global_samples(tmp_path)) == list(range(1, MAX_STEPS + 1))
    assert global_samples(tmp_path) == global_samples(reference_run[0])
    lines.clear()
    changed = {**one_rank, "seed": 5, "max_steps": MAX_STEPS + 1}
    code = run_local(manifest_uri, None, 1, overrides=changed, on_line=lines.append, timeout_s=RUN_TIMEOUT_S)
    assert code != 0  # the rank exits 2; torchrun reports a failed worker as 1
    refusal = [line for line in lines if "does not match this run" in line]
    assert len(refusal) == 1 and "seed 1234 -> 5" in refusal[0] and "--allow-change seed" in refusal[0]


def read_metrics_all(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_kill_9_of_a_rank_restarts_and_resumes_exactly(
    manifest_uri: str, reference: dict[int, float], tmp_path: Path
) -> None:
    pids: dict[int, int] = {}
    killed: list[int] = []

    def killer(line: str) -> None:
        match = re.match(r"^\[Rank 1\] .* pid (\d+), rank 1 of 2", line)
        if match:
            pids[1] = int(match[1])
        step = STEP_LINE.match(line)
        if step and step[1] == "1" and int(step[2]) == 8 and not killed:
            os.kill(pids[1], signal.SIGKILL)
            killed.append(pids[1])

    lines: list[str] = []
    code = train(manifest_uri, tmp_path, lines=lines, on_line=killer, max_restarts=1)
    assert killed, "the run never reached step 8"
    assert code == 0, "\n".join(lines[-60:])
    records = read_metrics_all(tmp_path)
    assert [r["resumed_from"] for r in records if r["kind"] == "start"] == [None, 6]
    assert [r["step"] for r in records if r["kind"] == "end"] == [MAX_STEPS]
    assert {r["attempt"] for r in records if r["kind"] == "train" and r["step"] > 6} >= {1}
    assert losses(tmp_path) == reference


def send_stop(how: str, launcher: int, rank_pids: dict[int, int], sig: signal.Signals) -> None:
    """The signal as each sender sends it: ``pileworks`` (and a Kubernetes pod whose first process is the
    launcher) to the launcher's process group, as a shell does to its job when its terminal closes (SIGHUP);
    Slurm to every process of the job, the DataLoader workers included; a single rank (one node of several
    drained, a rank signalled by hand)."""
    if how == "launcher group":
        os.killpg(launcher, sig)
    elif how == "every process":
        for process in [psutil.Process(launcher), *psutil.Process(launcher).children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                process.send_signal(sig)
    else:
        os.kill(rank_pids[1], sig)


@pytest.mark.parametrize(
    ("how", "sig"),
    [
        ("launcher group", signal.SIGTERM),
        ("every process", signal.SIGTERM),
        ("one rank", signal.SIGTERM),
        ("launcher group", signal.SIGHUP),
    ],
    ids=["launcher group", "every process", "one rank", "launcher group SIGHUP"],
)
def test_sigterm_saves_the_step_every_rank_reached_and_the_rerun_resumes_exactly(
    how: str,
    sig: signal.Signals,
    manifest_uri: str,
    reference: dict[int, float],
    reference_run: tuple[Path, list[str]],
    tmp_path: Path,
) -> None:
    """A SIGTERM after step 8 (between the periodic checkpoints of steps 6 and 12): every rank finishes its
    step, they save that step's checkpoint, write a ``stop`` record and exit 143; the rerun resumes from that
    step and reproduces the uninterrupted run's losses and samples bit for bit. The DataLoader workers
    (``num_workers`` 1) get the signal too where the group or every process is sent it. A SIGHUP (the launcher
    run from a terminal that closed) is taken the same way; its rerun is the SIGTERM cases'."""
    launcher: list[int] = []
    rank_pids: dict[int, int] = {}
    sent: list[str] = []

    def signaller(line: str) -> None:
        match = re.match(r"^\[Rank (\d)\] .* pid (\d+), rank \d of 2", line)
        if match:
            rank_pids[int(match[1])] = int(match[2])
        step = STEP_LINE.match(line)
        if step and step[1] == "0" and int(step[2]) == 8 and not sent:
            send_stop(how, launcher[0], rank_pids, sig)
            sent.append(how)

    lines: list[str] = []
    on_start = lambda proc: launcher.append(proc.pid)  # noqa: E731
    code = train(manifest_uri, tmp_path, lines=lines, on_line=signaller, on_start=on_start)
    text = "\n".join(lines[-60:])
    assert sent, "the run never reached step 8"
    assert code != 0, text  # the launcher reports the stop (torchrun: 1)
    records = read_metrics_all(tmp_path)
    stops = [r for r in records if r["kind"] == "stop"]
    # what each rank knows stopped it: rank 0 (which writes the metrics) was not sent it in the one-rank case
    said = {rank: sig.name for rank in (0, 1)} | ({0: "another rank's signal"} if how == "one rank" else {})
    assert len(stops) == 1 and stops[0]["signal"] == said[0], text
    stopped = stops[0]["step"]
    assert 8 <= stopped < 12 and not [r for r in records if r["kind"] == "end"], text
    assert max(r["step"] for r in records if r["kind"] == "train") == stopped
    verify_tag(tmp_path / "checkpoints" / tag_for_step(stopped))  # complete: every file listed and intact
    for rank in (0, 1):
        stop_line = rf"\[Rank {rank}\] .*stopped by {said[rank]} at step {stopped} of {MAX_STEPS}"
        assert re.search(stop_line, text), text
    assert "DataLoader worker" not in text
    if sig != signal.SIGTERM:
        return
    lines.clear()
    assert train(manifest_uri, tmp_path, lines=lines) == 0, "\n".join(lines[-40:])
    assert any("resumed from" in line and tag_for_step(stopped) in line for line in lines)
    assert losses(tmp_path) == reference  # every step, bit for bit
    assert samples_seen(tmp_path) == samples_seen(reference_run[0])


def test_without_checkpoint_on_sigterm_the_ranks_die_and_the_last_periodic_checkpoint_is_left(
    manifest_uri: str, tmp_path: Path
) -> None:
    """``checkpoint_on_sigterm: false``: the ranks die of the signal; steps since the last periodic checkpoint
    (step 6) are lost, as they were before the handler."""
    launcher: list[int] = []
    sent: list[bool] = []

    def signaller(line: str) -> None:
        step = STEP_LINE.match(line)
        if step and step[1] == "0" and int(step[2]) == 8 and not sent:
            os.killpg(launcher[0], signal.SIGTERM)
            sent.append(True)

    lines: list[str] = []
    overrides = {"checkpoint_on_sigterm": False}
    on_start = lambda proc: launcher.append(proc.pid)  # noqa: E731
    code = train(
        manifest_uri, tmp_path, lines=lines, on_line=signaller, on_start=on_start, overrides=overrides
    )
    assert sent and code != 0
    assert [r for r in read_metrics_all(tmp_path) if r["kind"] == "stop"] == []
    assert step_of_tag(list_tags(tmp_path / "checkpoints")[0]) == 6


def test_rank_killed_mid_save_resumes_from_previous_complete(
    manifest_uri: str, reference: dict[int, float], tmp_path: Path
) -> None:
    lines: list[str] = []
    code = train(manifest_uri, tmp_path, lines=lines, env={CRASH_IN_SAVE_ENV: "12:1"})
    assert code != 0
    torn = tmp_path / "checkpoints" / tag_for_step(12)
    assert (torn / "mp_rank_00_model_states.pt").is_file() and not (torn / RECORD_NAME).exists()
    # DeepSpeed's latest names the last committed tag, never the torn one
    assert (tmp_path / "checkpoints" / "latest").read_text() == tag_for_step(6)
    lines.clear()
    assert train(manifest_uri, tmp_path, lines=lines) == 0, "\n".join(lines[-40:])
    text = "\n".join(lines)
    assert "skipping checkpoint step-00000012: step-00000012: no COMPLETE.json" in text
    assert re.search(r"\[Rank 1\] .*resumed from .*step-00000006", text)
    assert losses(tmp_path) == reference
    assert (torn / RECORD_NAME).is_file()  # the redone save of step 12 committed
    assert (tmp_path / "checkpoints" / "latest").read_text() == tag_for_step(MAX_STEPS)


def test_planted_payload_in_a_verifying_checkpoint_never_runs(
    manifest_uri: str, reference_run: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """DeepSpeed's own load path (the engine's checkpoint engine) refuses a payload the record vouches for."""
    out = tmp_path / "run"
    shutil.copytree(reference_run[0] / "checkpoints", out / "checkpoints")
    tag_dir = out / "checkpoints" / tag_for_step(MAX_STEPS)
    optim = tag_dir / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    marker = tmp_path / "pwned"
    plant_payload(tag_dir, optim.name, marker, base=safe_load(optim))
    verify_tag(tag_dir)
    lines: list[str] = []
    # rank 0 refuses its planted shard (exit 2); torchrun then stops rank 1: the job fails
    assert train(manifest_uri, out, lines=lines, overrides={"max_steps": MAX_STEPS + 2}) != 0
    assert not marker.exists()
    assert any(REFUSED_EXEC.search(line) for line in lines), "\n".join(lines[-30:])
