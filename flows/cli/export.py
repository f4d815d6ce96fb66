"""``pileworks export --checkpoint DIR --to hf OUT``: a checkpoint as a Hugging Face folder (GPT-NeoX);
``--to fp32 OUT.safetensors``: its consolidated fp32 weights in one safetensors file (no pickle)."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a checkpoint for other tools (hf: transformers' GPTNeoXForCausalLM folder; fp32: one "
        "safetensors file of the consolidated weights)",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoints folder (newest verified tag) or one tag")
    p.add_argument("--to", required=True, choices=["hf", "fp32"], help="target format")
    p.add_argument("out", help="output folder (hf) or file (fp32)")
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    if args.to == "fp32":
        return run_export_fp32(args)
    from pipeline.tokenize.hf_files import hf_tokenizer_files
    from training.checkpoint import read_record
    from training.export_hf import export_hf, special_ids
    from training.generate import resolve_tag_dir

    tag_dir = resolve_tag_dir(args.checkpoint)
    ids = special_ids(read_record(tag_dir))
    # Used only when the checkpoint carries no tokenizer_config.json (a dataset published before them).
    fallback = hf_tokenizer_files(
        (tag_dir / "tokenizer.json").read_bytes(), eos_id=ids.eos_id, pad_id=ids.pad_id, bos_id=ids.bos_id
    )
    out = export_hf(tag_dir, args.out, tokenizer_files=fallback)
    print(json.dumps({"format": args.to, "out": str(out), "files": sorted(p.name for p in out.iterdir())}))
    return 0


def run_export_fp32(args: argparse.Namespace) -> int:
    from training.generate import export_fp32

    out = export_fp32(args.checkpoint, args.out)
    print(json.dumps({"format": args.to, "out": str(out), "bytes": out.stat().st_size}))
    return 0
