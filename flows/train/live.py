"""Training as it happens, in the Prefect run: a progress artifact and one child task run per milestone.

While the DeepSpeed job runs, :class:`TrainingWatch` follows the trainer's ``metrics.jsonl`` (the contract in
``training/metrics.py``) from the job's output-line callback, so it runs in the ``deepspeed-job`` task's own thread
and nested task runs attach to it:

* ``training-progress`` (a progress artifact updated in place): the share of ``max_steps`` done, with the last
  step's loss and tokens/s in its description;
* one task run per milestone, named so the task list and the graph read as the run's story:
  ``eval step 50: valid loss 5.12``, ``checkpoint step 50 committed (3 files, COMPLETE.json)``,
  ``rank 1 exited with code 17``, ``restart 1: resumed from step 50``, ``finished step 200: loss 3.81``.
They are nested under the job's task run: the graph shows them when its node is expanded.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.ui import readable
from training.checkpoint import RECORD_NAME, CheckpointError, read_record

POLL_INTERVAL_S = 2.0  # the metrics file is re-read at most this often while lines stream in
# torch.distributed.elastic's line when a worker dies: "failed (exitcode: 17) local_rank: 1 (pid: 42) of binary"
RANK_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")


@task(name="training-event", task_run_name="{label}", cache_policy=NO_CACHE)
def training_event(label: str, record: dict[str, Any], warning: bool = False) -> dict[str, Any]:
    """A milestone of the running job, as its own task run (its name is the message)."""
    log = get_run_logger()
    (log.warning if warning else log.info)("%s", label)
    return record


class TrainingWatch:
    """Follows ``<output_dir>/metrics.jsonl`` and the launcher's output; shows milestones in the Prefect run."""

    def __init__(self, output_dir: str, max_steps: int, *, poll_interval_s: float = POLL_INTERVAL_S) -> None:
        from prefect.artifacts import create_progress_artifact

        self.path, self.max_steps, self.poll_interval_s = (
            Path(output_dir) / "metrics.jsonl",
            max_steps,
            poll_interval_s,
        )
        self.offset = (
            self.path.stat().st_size if self.path.exists() else 0
        )  # earlier runs' lines are not ours
        self.last_poll = 0.0
        self.last_train: dict[str, Any] | None = None
        self.stopped_at: int | None = None  # the step the ranks saved on a SIGTERM (training.preempt)
        created = create_progress_artifact(
            0.0, key="training-progress", description=f"waiting for step 1 of {readable.count(max_steps)}"
        )
        assert isinstance(created, UUID)  # the synchronous call returns the id
        self.progress_id = created

    def on_line(self, line: str) -> None:
        failed = RANK_FAILED.search(line)
        if failed:
            code, rank = failed.groups()
            training_event(
                f"rank {rank} exited with code {code}",
                {"rank": int(rank), "exit_code": int(code)},
                warning=True,
            )
        if time.monotonic() - self.last_poll >= self.poll_interval_s:
            self.poll()

    def poll(self) -> None:
        """Handle every complete line appended since the last poll."""
        self.last_poll = time.monotonic()
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for raw in complete.splitlines():
            if raw.strip():
                self.handle(json.loads(raw))
        self.show_progress()

    def handle(self, rec: dict[str, Any]) -> None:
        kind, step = rec.get("kind"), rec.get("step")
        if kind == "train":
            self.last_train = rec
        elif kind == "eval":
            training_event(f"eval step {step}: valid loss {readable.sig(rec.get('loss'), 4)}", rec)
        elif kind == "checkpoint":
            training_event(self.checkpoint_label(rec), rec)
        elif kind == "start" and (rec.get("attempt") or rec.get("resumed_from") is not None):
            where = "from scratch" if rec.get("resumed_from") is None else f"from step {rec['resumed_from']}"
            training_event(f"restart {rec.get('attempt', 0)}: resumed {where}", rec, warning=True)
        elif kind == "stop":
            self.stopped_at = step
            training_event(f"stopped by {rec.get('signal', 'SIGTERM')} at step {step}: checkpoint saved", rec)
        elif kind == "end":
            loss = self.last_train.get("loss") if self.last_train else None
            training_event(f"finished step {step}: loss {readable.sig(loss, 4)}", rec)

    def checkpoint_label(self, rec: dict[str, Any]) -> str:
        """Names the commit record: a checkpoint only counts once its COMPLETE.json lists its files."""
        tag_dir = self.path.parent / "checkpoints" / str(rec.get("tag"))
        try:
            files = len(read_record(tag_dir).get("files", []))
        except CheckpointError as exc:
            return f"checkpoint step {rec.get('step')}: no valid {RECORD_NAME} ({exc})"
        return f"checkpoint step {rec.get('step')} committed ({files} files, {RECORD_NAME})"

    def show_progress(self) -> None:
        from prefect.artifacts import update_progress_artifact

        if self.last_train is None:
            return
        r = self.last_train
        update_progress_artifact(
            self.progress_id,
            min(100.0, 100.0 * r["step"] / self.max_steps),
            description=f"step {readable.count(r['step'])}/{readable.count(self.max_steps)}: loss "
            f"{readable.sig(r.get('loss'), 4)}, {readable.si(r.get('tokens_per_s'))} tokens/s, data wait "
            f"{readable.pct(r.get('data_wait_share'))}",
        )
