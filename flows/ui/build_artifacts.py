"""The build summary (CLI table, flow result) and the Prefect artifacts every build publishes: SVG charts, the stage
and shard tables, the manifest's facts and the dedup audit with one cluster side by side, numbers rounded."""

from __future__ import annotations

import textwrap
from typing import Any

from flows.ui import charts, readable
from pipeline.corpus_config import CorpusConfig
from pipeline.dataset.card import read_card
from pipeline.dataset.card_markdown import render_card
from pipeline.dataset.manifest import Manifest, load_manifest
from pipeline.dedup.audit import cluster_documents
from pipeline.sources import mixture_table
from pipeline.storage import S3Options, open_store
from pipeline.units.protocol import StageStats

MAX_TABLE_ROWS = 50  # longer shard/input lists stay in the manifest; the artifact says how many more
PRESIGNED_EXPIRY_S = 7 * 24 * 3600  # S3's longest presigned-URL lifetime (SigV4)

STAGE_ORDER = ("ingest", "clean", "exact_dedup", "near_dedup", "decontam", "tokenize", "shard")


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
        "mixture": mixture_rows(manifest.mixture),
        "shard_table": [
            {"split": s.split, "key": s.key, "tokens": s.tokens, "docs": s.docs, "sha256": s.sha256}
            for s in manifest.shards
        ],
        "seconds": round(seconds, 2),
    }


STAGE_TABLE = "Documents and bytes per stage"


def stage_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per stage, numbers rounded with units (the UI's stage-stats table and the CLI's summary)."""
    rows = []
    for name, st in summary["stages"].items():
        rows.append(
            {
                "stage": name,
                "docs in": readable.count(st["docs_in"]),
                "docs out": readable.count(st["docs_out"]),
                "kept": readable.pct(st["docs_out"] / st["docs_in"]) if st["docs_in"] else "n/a",
                "size in": readable.size(st["bytes_in"]),
                "size out": readable.size(st["bytes_out"]),
                "dropped": ", ".join(f"{k}={readable.count(v)}" for k, v in st["dropped"].items() if v)
                or "none",
            }
        )
    return rows


def mixture_rows(mixture: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``pileworks inspect mixture`` table as flat rows (the Prefect table artifact)."""
    rows = []
    for row in mixture_table(mixture, "train") if mixture else []:
        langs = sorted(row["languages"].items(), key=lambda kv: -kv[1])
        rows.append(
            row
            | {
                "asked": ", ".join(f"{k} {v:g}" for k, v in row["asked"].items()),
                "languages": ", ".join(f"{k} {v}" for k, v in langs),
            }
        )
    return rows


def build_charts_markdown(summary: dict[str, Any]) -> str:
    """Documents and bytes kept per stage, and drops by reason, as SVG charts."""
    stages = summary["stages"]
    names = list(stages)
    docs = charts.bar_chart(
        names,
        {
            "documents in": [stages[n]["docs_in"] for n in names],
            "documents out": [stages[n]["docs_out"] for n in names],
        },
        title="Documents per stage",
        value_label="documents",
        value_format=readable.count,
    )
    size = charts.bar_chart(
        names,
        {
            "bytes in": [stages[n]["bytes_in"] for n in names],
            "bytes out": [stages[n]["bytes_out"] for n in names],
        },
        title="Bytes per stage",
        value_label="bytes (UTF-8 text; tokenize: token bytes)",
        value_format=readable.size,
    )
    parts = [
        f"# Build {summary['name']}: dataset {summary['dataset_id'][:12]}",
        "",
        charts.markdown_image(docs, "documents per stage chart"),
        "",
        charts.markdown_image(size, "bytes per stage chart"),
        "",
    ]
    drops = {k: v for k, v in summary["dropped"].items() if v}
    if drops:
        bars = charts.bar_chart(
            list(drops),
            {"documents dropped": list(drops.values())},
            title="Drops by reason",
            value_label="documents",
            value_format=readable.count,
        )
        parts += [charts.markdown_image(bars, "drops by reason chart"), ""]
    else:
        parts += ["No document was dropped.", ""]
    return "\n".join(parts)


def data_card_markdown(card: dict[str, Any]) -> str:
    """The data card (``pipeline.dataset.card_markdown``) with charts: documents and bytes removed per rule, and the
    training tokens per source."""
    rows = [r for r in card["waterfall"] if r["docs_removed"] or r["bytes_removed"]]
    rules = [f"{r['stage']}:{r['rule']}" for r in rows]
    text = render_card(card)
    if not rows:
        return text
    docs = charts.bar_chart(
        rules,
        {"documents removed": [r["docs_removed"] for r in rows]},
        title="Documents removed per rule",
        value_label="documents",
        value_format=readable.count,
    )
    size = charts.bar_chart(
        rules,
        {"bytes removed": [r["bytes_removed"] or 0 for r in rows]},
        title="Bytes removed per rule",
        value_label="bytes",
        value_format=readable.size,
    )
    parts = [
        charts.markdown_image(docs, "documents removed per rule chart"),
        charts.markdown_image(size, "bytes removed per rule chart"),
    ]
    mix = card.get("mixture", {}).get("train", [])
    if mix:
        tokens = charts.bar_chart(
            [m["source"] for m in mix],
            {"tokens": [m["tokens"] for m in mix]},
            title="Training tokens per source",
            value_label="tokens",
            value_format=readable.count,
        )
        parts.append(charts.markdown_image(tokens, "tokens per source chart"))
    head, _, rest = text.partition("## Removal waterfall")
    return head + "\n\n".join(parts) + "\n\n## Removal waterfall" + rest


def manifest_link(uri: str, s3: S3Options, how: str) -> str:
    """A link a browser on the UI's page can open: s3 -> a presigned or AWS console URL when configured; a local
    store has none (a file:// link from an http page is blocked), so its path is shown as text."""
    if uri.startswith("s3://") and how != "none":
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        if how == "presigned":
            from pipeline.storage.s3 import S3Store

            store = open_store(f"s3://{bucket}", s3=s3)
            assert isinstance(store, S3Store)
            url = store.presigned_url(key, PRESIGNED_EXPIRY_S)
            return f"[open manifest.json (presigned, valid {PRESIGNED_EXPIRY_S // 86400} days)]({url})"
        region = s3.region or "us-east-1"
        return f"[open in the S3 console](https://s3.console.aws.amazon.com/s3/object/{bucket}?region={region}&prefix={key})"
    return f"`{uri.removeprefix('file://')}`"


def manifest_markdown(manifest: Manifest, link: str) -> str:
    """The dataset's key facts: id, tokenizer, tokens per split, shards (size, sha256 prefix), inputs."""
    tok = manifest.tokenizer
    lines = [
        f"# Dataset {manifest.name}@{manifest.dataset_id[:12]}",
        "",
        f"Manifest: {link}",
        "",
        "| field | value |",
        "|---|---|",
        f"| dataset id | `{manifest.dataset_id}` |",
        f"| tokenizer | `{tok.key}` (vocab {readable.count(tok.vocab_size)}, eos id {tok.eos_id}, sha256 `{tok.sha256[:12]}`) |",
        f"| token dtype | {manifest.dtype} |",
        f"| code version | {manifest.code_version} |",
        f"| created | {manifest.created_at} |",
    ]
    for split, info in manifest.splits.items():
        lines.append(
            f"| {split} | {readable.count(info['tokens'])} tokens, {readable.count(info['docs'])} docs, "
            f"{info['shards']} shard(s) |"
        )
    lines += [
        "",
        "## Shards",
        "",
        "| split | shard | tokens | docs | size | sha256 |",
        "|---|---|---:|---:|---:|---|",
    ]
    for s in manifest.shards[:MAX_TABLE_ROWS]:
        lines.append(
            f"| {s.split} | `{s.key}` | {readable.count(s.tokens)} | {readable.count(s.docs)} | "
            f"{readable.size(s.bytes)} | `{s.sha256[:12]}` |"
        )
    if len(manifest.shards) > MAX_TABLE_ROWS:
        lines.append(f"| … | {len(manifest.shards) - MAX_TABLE_ROWS} more shards in the manifest | | | | |")
    lines += ["", "## Inputs", "", "| input | size | fingerprint (etag / mtime) |", "|---|---:|---|"]
    for i in manifest.inputs[:MAX_TABLE_ROWS]:
        lines.append(f"| `{i.get('uri')}` | {readable.size(i.get('size'))} | `{str(i.get('etag'))[:24]}` |")
    if len(manifest.inputs) > MAX_TABLE_ROWS:
        lines.append(f"| … {len(manifest.inputs) - MAX_TABLE_ROWS} more inputs | | |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")


def cluster_markdown(
    cid: int, size: int, docs: list[dict[str, Any]], width: int = 60, max_lines: int = 24
) -> str:
    """One near-duplicate cluster's documents side by side: a table column per document, a row per text line."""
    if not docs:
        return "No near-duplicate cluster in this build."
    cols = []
    for d in docs:
        body = d["text"] if d["text"] is not None else "(document of the persisted index; text not stored)"
        cols.append(
            [seg for para in body.splitlines() for seg in (textwrap.wrap(para, width) or [""])][:max_lines]
        )
    heads = [f"{'**kept**' if d['keep'] else 'dropped'} `{_short(d['id'])}`" for d in docs]
    lines = [
        f"## Example: cluster {cid} ({size} documents, {len(docs)} shown)",
        "",
        "| " + " | ".join(heads) + " |",
        "|" + "---|" * len(docs),
        "| " + " | ".join(readable.size(d["nbytes"]) for d in docs) + " |",
    ]
    for i in range(max(len(c) for c in cols)):
        lines.append("| " + " | ".join(_cell(c[i]) if i < len(c) else "" for c in cols) + " |")
    lines += [""] + [f"- {'kept' if d['keep'] else 'dropped'}: `{d['id']}`" for d in docs]
    return "\n".join(lines)


def _short(doc_id: str) -> str:
    """A document id without its folder (``part-2.jsonl#B9070``); the full id is listed under the table."""
    return doc_id.rsplit("/", 1)[-1]


def dedup_markdown(report: dict[str, Any], cluster: str = "") -> str:
    removed_near, docs_in = report.get("removed_near") or 0, report.get("docs_in") or 0
    params = report.get("params", {})
    lines = [
        "# Near-duplicate removal",
        "",
        f"- documents in: {readable.count(docs_in)}",
        f"- removed as exact duplicates: {readable.count(report.get('removed_exact'))}",
        f"- removed as near duplicates: {readable.count(removed_near)} ({readable.pct(report.get('removal_rate_near', 0))})",
        f"- clusters: {readable.count(report.get('clusters'))}; threshold {params.get('threshold')}, "
        f"{params.get('num_perm')} permutations, {params.get('bands')} bands x {params.get('rows')} rows",
    ]
    lines += [f"- **warning**: {w}" for w in report.get("warnings", [])]
    hist = report.get("cluster_size_histogram", {})
    if hist:
        lines += ["", "| cluster size | clusters |", "|---:|---:|"] + [
            f"| {k} | {readable.count(v)} |" for k, v in hist.items()
        ]
    per_source = [(s, r) for s, r in report.get("per_source", {}).items() if isinstance(r, dict)]
    if per_source:
        lines += ["", "| source | docs | removed | rate |", "|---|---:|---:|---:|"]
        for src, row in per_source[:MAX_TABLE_ROWS]:
            lines.append(
                f"| `{src}` | {readable.count(row.get('docs'))} | {readable.count(row.get('removed_near'))} | "
                f"{readable.pct(row.get('rate'))} |"
            )
    if cluster:
        lines += ["", cluster]
    return "\n".join(lines)


def publish_build_artifacts(summary: dict[str, Any], cfg: CorpusConfig) -> None:
    """Charts, the stage and shard tables, the manifest's facts and the dedup audit, on the current run."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    create_table_artifact(stage_rows(summary), key="stage-stats", description=STAGE_TABLE)
    create_markdown_artifact(
        build_charts_markdown(summary),
        key="build-charts",
        description="Documents and bytes kept per stage, drops by reason",
    )
    manifest, dataset_store = load_manifest(summary["manifest_uri"], s3=cfg.s3)
    create_markdown_artifact(
        data_card_markdown(read_card(manifest, dataset_store)),
        key="data-card",
        description=f"Data card of {manifest.name}@{manifest.dataset_id[:12]}: what each rule "
        "removed, examples, PII, mixture",
    )
    link = manifest_link(summary["manifest_uri"], cfg.s3, cfg.manifest_link)
    create_markdown_artifact(
        manifest_markdown(manifest, link),
        key="manifest",
        description=f"Dataset {manifest.name}@{manifest.dataset_id[:12]}: the manifest's facts",
    )
    if summary.get("mixture"):
        create_table_artifact(
            summary["mixture"],
            key="mixture",
            description="Tokens, documents and shares per source (train split), weights asked and target shares",
        )
    near = summary["stages"].get("near_dedup", {}).get("extra", {})
    if near.get("report"):
        store = open_store(cfg.output, s3=cfg.s3)
        cid, size, docs = cluster_documents(store, near["report_key"].rsplit("/clusters/", 1)[0], max_docs=2)
        create_markdown_artifact(
            dedup_markdown(near["report"], cluster_markdown(cid, size, docs)),
            key="dedup-audit",
            description="MinHash near-dedup audit",
        )


def unchanged_markdown(summary: dict[str, Any], link: str) -> str:
    """The run page of a rebuild that found its dataset published from the same inputs and config."""
    by = summary["nothing_changed"].get("published_by")
    return "\n".join(
        [
            f"## Nothing changed: dataset `{summary['name']}` `{summary['dataset_id']}`",
            "",
            "Same inputs (sizes, ETags/mtimes), same config and code version as the build that published it"
            + (f" (flow run `{by}`)" if by else "")
            + ": no unit was recomputed and no worker started.",
            "",
            f"- manifest: {link}",
            f"- documents: {summary['docs_out']:,}; tokens: "
            + ", ".join(f"{k} {v:,}" for k, v in summary["tokens"].items()),
        ]
    )


def unchanged_artifacts(summary: dict[str, Any], cfg: CorpusConfig) -> list[dict[str, Any]]:
    """A rebuild with nothing to do: a note linking its dataset and the stage table of the published build, as
    ``key``, ``type``, ``description`` and ``data`` (markdown text; the table's rows)."""
    link = manifest_link(summary["manifest_uri"], cfg.s3, cfg.manifest_link)
    note = f"Nothing changed: dataset {summary['name']}@{summary['dataset_id'][:12]} is published"
    return [
        {
            "key": "nothing-changed",
            "type": "markdown",
            "description": note,
            "data": unchanged_markdown(summary, link),
        },
        {"key": "stage-stats", "type": "table", "description": STAGE_TABLE, "data": stage_rows(summary)},
    ]


def publish_unchanged_artifacts(summary: dict[str, Any], cfg: CorpusConfig) -> None:
    """:func:`unchanged_artifacts` on the current flow run."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    note, table = unchanged_artifacts(summary, cfg)
    create_markdown_artifact(note["data"], key=note["key"], description=note["description"])
    create_table_artifact(table["data"], key=table["key"], description=table["description"])
