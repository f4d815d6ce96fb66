"""A planted pickle payload: what an attacker with write access to a checkpoint folder can do."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from training.checkpoint import RECORD_NAME, write_complete_record


class Payload:
    """Unpickling this runs ``exec``: it writes ``marker`` (the proof the payload ran)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('payload ran')",))


def plant_payload(tag_dir: Path, name: str, marker: Path, base: object = None) -> None:
    """Write ``name`` as ``base`` (a dict; empty if None) plus the payload, then rewrite the COMPLETE record
    so the tag verifies again, hashes and all."""
    blob = dict(base) if isinstance(base, dict) else {}
    blob["planted"] = Payload(marker)
    torch.save(blob, tag_dir / name)
    record = json.loads((tag_dir / RECORD_NAME).read_text()) if (tag_dir / RECORD_NAME).is_file() else {}
    meta = {k: v for k, v in record.items() if k not in ("format", "tag", "step", "created_at", "files")}
    write_complete_record(tag_dir, step=int(record.get("step", 1)), meta=meta)
