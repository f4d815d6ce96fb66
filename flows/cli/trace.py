"""``pileworks trace --checkpoint X --step N``: the shards and documents optimizer step N trained on."""

from __future__ import annotations

import argparse
import json

from flows.cli.s3_flags import add_s3_arguments, resolve_s3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="lineage: which shards and documents a training step saw")
    p.add_argument("--checkpoint", required=True, help="checkpoints folder or one tag folder of the run")
    p.add_argument("--step", type=int, required=True, help="optimizer step (1-based)")
    p.add_argument("--manifest", default=None, help="manifest URI, if the dataset moved since training")
    p.add_argument(
        "--max-docs", type=int, default=20, help="documents to list, largest share first (default 20)"
    )
    p.add_argument(
        "--input-root",
        default=None,
        help="where the build's input corpus lies now, if it moved since (documents are named under it)",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    add_s3_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from training.lineage import trace_step

    out = trace_step(
        args.checkpoint,
        args.step,
        s3=resolve_s3(args),
        manifest_uri=args.manifest,
        max_docs=args.max_docs,
        input_root=args.input_root,
    )
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(
        f"step {out['step']} of {out['checkpoint']} (dataset {out['dataset_id']}, world size {out['world_size']}, "
        f"epoch {', '.join(map(str, out['epochs']))}): {len(out['samples'])} samples"
    )
    print(
        f"trained by Prefect flow run {out['prefect_flow_run_id']}; dataset built by flow run {out['dataset_flow_run_id']}"
    )
    print("shards: " + ", ".join(out["shards"]))
    print("tokens per source: " + ", ".join(f"{k} {v}" for k, v in out.get("source_tokens", {}).items()))
    print(f"documents ({out['documents_total']}, largest share first):")
    for d in out["documents"]:
        print(
            f"  {d['tokens']:6d} tokens  {d['doc_id']}  (input {d.get('uri') or d['source']}, at {d['location']})"
        )
    return 0
