"""The build summary (CLI table, flow result) and the Prefect artifacts every run publishes."""

from __future__ import annotations

import json
from typing import Any

from flows.corpus_config import CorpusConfig
from pipeline.manifest import load_manifest
from pipeline.units import StageStats

STAGE_ORDER = ("ingest", "clean", "exact_dedup", "near_dedup", "tokenize", "shard")


def build_summary(
    manifest_uri: str, stats: dict[str, StageStats], cfg: CorpusConfig, seconds: float
) -> dict[str, Any]:
    manifest, _ = load_manifest(manifest_uri, s3=cfg.s3)
    dropped: dict[str, int] = {}
    for name in STAGE_ORDER:
        if name in stats:
            for reason, n in stats[name].dropped.items():
                dropped[f"{name}:{reason}"] = dropped.get(f"{name}:{reason}", 0) + int(n)
    ingest = stats.get("ingest", StageStats(stage="ingest"))
    return {
        "name": cfg.name,
        "manifest_uri": manifest_uri,
        "dataset_id": manifest.dataset_id,
        "docs_in": ingest.docs_in,
        "bytes_in": int(ingest.extra.get("raw_bytes", ingest.bytes_in)),
        "docs_out": sum(s.docs for s in manifest.shards if s.split == "train")
        + sum(s.docs for s in manifest.shards if s.split != "train"),
        "quarantined": sum(ingest.dropped.values()),
        "dropped": dropped,
        "exact_duplicates": int(stats["exact_dedup"].dropped.get("exact_duplicate", 0))
        if "exact_dedup" in stats
        else 0,
        "near_duplicates": sum(int(v) for k, v in stats["near_dedup"].dropped.items())
        if "near_dedup" in stats
        else 0,
        "tokens": {split: info["tokens"] for split, info in manifest.splits.items()},
        "shards": {split: info["shards"] for split, info in manifest.splits.items()},
        "stages": {name: stats[name].to_json() for name in STAGE_ORDER if name in stats},
        "shard_table": [
            {"split": s.split, "key": s.key, "tokens": s.tokens, "docs": s.docs, "sha256": s.sha256}
            for s in manifest.shards
        ],
        "seconds": round(seconds, 2),
    }


def stage_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, st in summary["stages"].items():
        rows.append(
            {
                "stage": name,
                "docs in": st["docs_in"],
                "docs out": st["docs_out"],
                "MB in": round(st["bytes_in"] / 1e6, 2),
                "MB out": round(st["bytes_out"] / 1e6, 2),
                "dropped": ", ".join(f"{k}={v}" for k, v in st["dropped"].items() if v) or "none",
            }
        )
    return rows


def publish_build_artifacts(summary: dict[str, Any]) -> None:
    """Tables of the stages and shards, the dedup audit and a link to the manifest, on the current run."""
    from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

    create_table_artifact(stage_rows(summary), key="stage-stats", description="Documents and bytes per stage")
    create_table_artifact(
        summary["shard_table"], key="shards", description=f"Shards of dataset {summary['dataset_id']}"
    )
    create_link_artifact(
        summary["manifest_uri"], link_text=f"manifest {summary['dataset_id']}", key="manifest",
        description="The published dataset's manifest",
    )  # fmt: skip
    report = summary["stages"].get("near_dedup", {}).get("extra", {}).get("report")
    if report:
        create_markdown_artifact(
            dedup_markdown(report), key="dedup-audit", description="MinHash near-dedup audit"
        )


def dedup_markdown(report: dict[str, Any]) -> str:
    lines = ["# Near-duplicate removal", ""]
    lines.append(f"- documents in: {report.get('docs_in')}")
    lines.append(f"- removed as exact duplicates: {report.get('removed_exact')}")
    lines.append(
        f"- removed as near duplicates: {report.get('removed_near')} ({report.get('removal_rate_near', 0):.2%})"
    )
    lines.append(f"- clusters: {report.get('clusters')}; params: `{json.dumps(report.get('params', {}))}`")
    for warning in report.get("warnings", []):
        lines.append(f"- **warning**: {warning}")
    hist = report.get("cluster_size_histogram", {})
    if hist:
        lines += ["", "| cluster size | clusters |", "|---|---|"] + [
            f"| {k} | {v} |" for k, v in hist.items()
        ]
    per_source = report.get("per_source", {})
    if per_source:
        lines += ["", "| source | docs | removed | rate |", "|---|---|---|---|"]
        for src, row in list(per_source.items())[:30]:
            if isinstance(row, dict):
                lines.append(f"| {src} | {row.get('docs')} | {row.get('removed_near')} | {row.get('rate')} |")
    return "\n".join(lines)


class RunProgress:
    """A Prefect progress artifact for a long flow: the share of its stages done, and the last one finished."""

    def __init__(self, stages: list[str], key: str) -> None:
        from prefect.artifacts import create_progress_artifact

        self.stages, self.done = stages, 0
        self.id = create_progress_artifact(0.0, key=key, description=f"0/{len(stages)} stages")

    def finished(self, stage: str) -> None:
        from prefect.artifacts import update_progress_artifact

        self.done = min(len(self.stages), self.done + 1)
        update_progress_artifact(
            self.id,
            100.0 * self.done / len(self.stages),
            description=f"{self.done}/{len(self.stages)} stages: {stage} done",
        )
