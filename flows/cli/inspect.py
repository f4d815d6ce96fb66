"""``pileworks inspect dedup <dataset>``: the near-dedup audit and one cluster's documents side by side;
``pileworks inspect mixture <dataset>``: tokens, documents and shares per source and language;
``pileworks inspect card <dataset> [--against <other>]``: the data card (what each rule removed), or what moved
between two datasets."""

from __future__ import annotations

import argparse
import io
import json

from flows.cli.s3_flags import add_s3_arguments, resolve_s3
from pipeline.storage import ObjectStore, S3Options, open_store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="inspect what a build did")
    what = p.add_subparsers(
        dest="what", metavar="WHAT", required=True, help="what to inspect: dedup, mixture, card"
    )
    d = what.add_parser("dedup", help="the near-dedup report and a cluster's documents side by side")
    d.add_argument("dataset", help="manifest URI, dataset folder or datasets/<name> of a build")
    d.add_argument("--cluster", type=int, default=None, help="cluster number (0 = the largest, the default)")
    d.add_argument("--width", type=int, default=160, help="columns of the side-by-side view (default 160)")
    d.add_argument("--report", action="store_true", help="print the whole dedup report as JSON")
    add_s3_arguments(d)
    d.set_defaults(func=run_dedup)
    m = what.add_parser("mixture", help="tokens, documents and shares per source and language, weights asked")
    m.add_argument("dataset", help="manifest URI, dataset folder or datasets/<name> of a build")
    m.add_argument(
        "--split", default="train", choices=("train", "valid"), help="split to inspect (default train)"
    )
    m.add_argument("--json", action="store_true", help="print the manifest's mixture section as JSON")
    m.add_argument(
        "--domains",
        type=int,
        default=10,
        metavar="N",
        help="top N domains per source of web documents (from the shards' docs.parquet; 0: none)",
    )
    add_s3_arguments(m)
    m.set_defaults(func=run_mixture)
    c = what.add_parser("card", help="the data card: what each rule removed, examples, PII, mixture")
    c.add_argument("dataset", help="manifest URI, dataset folder or datasets/<name> of a build")
    c.add_argument(
        "--json", action="store_true", help="print card.json (with --against: the difference) as JSON"
    )
    c.add_argument(
        "--against",
        default=None,
        metavar="OTHER",
        help="another dataset (same forms): what each rule removed in one and not the other, per source",
    )
    add_s3_arguments(c)
    c.set_defaults(func=run_card)


def run_card(args: argparse.Namespace) -> int:
    from pipeline.dataset.card import read_card
    from pipeline.dataset.card_markdown import diff_cards, render_card, render_diff
    from pipeline.dataset.manifest import load_manifest

    s3 = resolve_s3(args)
    card = read_card(*load_manifest(args.dataset, s3))
    if args.against is not None:
        diff = diff_cards(card, read_card(*load_manifest(args.against, s3)))
        print(json.dumps(diff, indent=1) if args.json else render_diff(diff), end="\n" if args.json else "")
        return 0
    print(
        json.dumps(card, indent=1, ensure_ascii=False) if args.json else render_card(card),
        end="\n" if args.json else "",
    )
    return 0


def run_mixture(args: argparse.Namespace) -> int:
    from pipeline.dataset.manifest import load_manifest
    from pipeline.sources import domain_tokens, format_mixture, format_top_domains

    manifest, store = load_manifest(args.dataset, resolve_s3(args))
    if not manifest.mixture:
        raise ValueError(
            f"{args.dataset}: the manifest has no mixture section (built before sources existed)"
        )
    if args.json:
        print(json.dumps(manifest.mixture, indent=1))
        return 0
    print(f"dataset {manifest.name} {manifest.dataset_id}, split {args.split}")
    print(format_mixture(manifest.mixture, args.split))
    if args.domains > 0:
        shards = manifest.split_shards(args.split)
        top = domain_tokens((io.BytesIO(store.get_bytes(s.docs_key)) for s in shards), args.domains)
        if top:
            print(f"top domains per source (web documents, {args.split})")
            print(format_top_domains(top))
    return 0


def locate_build(dataset: str, s3: S3Options) -> tuple[ObjectStore, str]:
    """The store root and the near-dedup work folder of the build that published ``dataset``."""
    from pipeline.dataset.manifest import load_manifest

    manifest, dstore = load_manifest(dataset, s3)
    build_key = manifest.lineage.get("build_key")
    if not build_key:
        raise ValueError(f"{dataset}: the manifest records no build_key (built by another tool?)")
    root_uri = dstore.uri.rstrip("/").rsplit("/datasets/", 1)[0]
    return open_store(root_uri, s3), f"work/{build_key}/near"


def run_dedup(args: argparse.Namespace) -> int:
    from pipeline.dedup.audit import format_cluster

    store, near = locate_build(args.dataset, resolve_s3(args))
    report_key = f"{near}/clusters/dedup_report.json"
    if not store.exists(report_key):
        raise FileNotFoundError(
            f"{store.uri_of(report_key)} is missing: near dedup was disabled or the work folder was removed"
        )
    report = json.loads(store.get_bytes(report_key))
    if args.report:
        print(json.dumps(report, indent=1))
        return 0
    print(
        f"documents in {report['docs_in']}, removed near {report['removed_near']} "
        f"({report['removal_rate_near']:.2%}), clusters {report['clusters']}"
    )
    for warning in report.get("warnings", []):
        print(f"warning: {warning}")
    if report["clusters"]:
        print(format_cluster(store, near, args.cluster, width=args.width))
    return 0
