"""``pileworks verify``: whether the bytes in a store are the ones its records promise. Read-only: it reports.

- A published dataset: its ``manifest.json`` parses, every object it lists (shards, indexes, tokenizer files,
  the card) is there with its sha256, and ``latest.json`` points at a dataset that has a manifest.
- With ``work``: every build unit whose marker records its outputs (``pipeline.units.proofs``), each output hashed
  whatever its tag says. A damaged unit is recomputed by the next build that reads it: its reader checks the bytes
  against the marker's digest, names the file, drops the marker and the build runs its steps again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pipeline.dataset.manifest import LATEST_KEY, MANIFEST_KEY, Manifest, object_hashes
from pipeline.errors import StorageError
from pipeline.storage import ObjectInfo, ObjectStore, join_key
from pipeline.units.proofs import check_outputs
from pipeline.units.protocol import SUCCESS

REBUILD = "delete the dataset's folder and rerun its build (the same inputs and config publish the same id)"


@dataclass(frozen=True)
class Damage:
    uri: str
    problem: str
    remedy: str

    def line(self) -> str:
        return f"damaged: {self.uri} {self.problem}: {self.remedy}"


@dataclass
class VerifyReport:
    """What was checked and what was found damaged (empty: all is well)."""

    datasets: int = 0
    objects: int = 0
    units: int = 0
    damage: list[Damage] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.damage

    def summary(self) -> str:
        checked = f"{self.datasets} dataset(s) ({self.objects} objects), {self.units} unit(s)"
        if self.ok:
            return f"verified {checked}: all intact"
        return f"verified {checked}: {len(self.damage)} damaged"


def verify_dataset(store: ObjectStore, prefix: str, report: VerifyReport) -> None:
    """The dataset under ``prefix`` (``""``: the store is the dataset's folder): manifest, then every object."""
    manifest_key = join_key(prefix, MANIFEST_KEY) if prefix else MANIFEST_KEY
    try:
        manifest = Manifest.from_json(json.loads(store.get_bytes(manifest_key)))
    except (ValueError, KeyError, TypeError) as exc:
        report.damage.append(Damage(store.uri_of(manifest_key), f"is not a valid manifest ({exc})", REBUILD))
        return
    report.datasets += 1
    for rel, sha256 in sorted(object_hashes(manifest).items()):
        key = join_key(prefix, rel) if prefix else rel
        report.objects += 1
        try:
            store.verify_sha256(key, sha256)
        except FileNotFoundError:
            report.damage.append(Damage(store.uri_of(key), "is missing", REBUILD))
        except StorageError as exc:
            problem = str(exc).removeprefix(store.uri_of(key) + ": ")
            report.damage.append(Damage(store.uri_of(key), f"has {problem}", REBUILD))


def verify_pointer(store: ObjectStore, name_prefix: str, report: VerifyReport) -> str | None:
    """``<name_prefix>/latest.json``: the dataset folder it points at (checked to hold a manifest), else None."""
    key = join_key(name_prefix, LATEST_KEY) if name_prefix else LATEST_KEY
    try:
        pointer: Any = json.loads(store.get_bytes(key))
        dataset = (
            join_key(name_prefix, str(pointer["dataset_id"])) if name_prefix else str(pointer["dataset_id"])
        )
    except (ValueError, KeyError, TypeError) as exc:
        report.damage.append(Damage(store.uri_of(key), f"is not a valid pointer ({exc})", "rerun the build"))
        return None
    if not store.exists(join_key(dataset, MANIFEST_KEY)):
        report.damage.append(
            Damage(store.uri_of(key), f"points at {dataset}, which has no {MANIFEST_KEY}", "rerun the build")
        )
        return None
    return dataset


def verify_store(store: ObjectStore, report: VerifyReport) -> None:
    """Every dataset published under ``datasets/`` and every ``latest.json`` there."""
    keys = [info.key for info in store.list("datasets/")]
    for key in keys:
        parts = key.split("/")
        if len(parts) == 4 and parts[3] == MANIFEST_KEY:
            verify_dataset(store, "/".join(parts[:3]), report)
        elif len(parts) == 3 and parts[2] == LATEST_KEY:
            verify_pointer(store, "/".join(parts[:2]), report)


def verify_work(store: ObjectStore, report: VerifyReport) -> None:
    """Every unit under ``work/`` whose marker records its outputs, each output hashed (one listing in all)."""
    listing: dict[str, ObjectInfo] = {info.key: info for info in store.list("work/")}
    for key, info in listing.items():
        if info.size == 0 or not key.endswith((".done", f"/{SUCCESS}")):
            continue
        marker = json.loads(store.get_bytes(key))
        if not isinstance(marker, dict) or "outputs" not in marker:
            continue  # a folder's part count, or a marker from before markers recorded outputs
        base = key.removesuffix(".done") if key.endswith(".done") else key.removesuffix(f"/{SUCCESS}")
        report.units += 1
        check = check_outputs(store, base, marker["outputs"], listing, thorough=True)
        if check.damaged is not None:
            remedy = (
                f"a build that reads it finds the same mismatch and recomputes its unit {base} (a rebuild "
                "that finds its dataset published reads no unit)"
            )
            report.damage.append(Damage(store.uri_of(check.damaged), check.reason, remedy))


def verify_target(store: ObjectStore, work: bool = False) -> VerifyReport:
    """``store`` rooted at a dataset folder, a dataset-name folder (``latest.json``) or a store root."""
    report = VerifyReport()
    if store.exists(MANIFEST_KEY):
        if work:
            raise ValueError("--work checks a store's build units: give the store root, not a dataset")
        verify_dataset(store, "", report)
    elif store.exists(LATEST_KEY):
        dataset = verify_pointer(store, "", report)
        if dataset is not None:
            verify_dataset(store, dataset, report)
    else:
        verify_store(store, report)
        if work:
            verify_work(store, report)
    return report
