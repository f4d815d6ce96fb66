"""``pileworks train``: train on a published dataset with DeepSpeed (local ranks)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flows.cli.build import add_set_argument
from flows.cli.s3_flags import add_s3_arguments, dotted_s3_overrides
from pipeline.config import parse_overrides


def register(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train", help="train on a published dataset with DeepSpeed (local ranks)")
    t.add_argument(
        "--manifest", required=True, help="manifest URI, dataset folder or datasets/<name> (follows latest)"
    )
    add_train_arguments(t)
    add_init_from_argument(t)
    add_set_argument(t, "override a TrainConfig field, e.g. lr=1e-3 (repeatable)", "--train-set")
    t.add_argument(
        "--allow-dataset-change", action="store_true", help="resume a checkpoint made on another dataset"
    )
    t.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    t.add_argument(
        "--allow-change",
        action="append",
        default=[],
        metavar="FIELD[,FIELD]",
        help="resume although these checkpoint fields differ (seed, seq_len, world_size, micro_batch, ...)",
    )
    add_s3_arguments(t)
    t.set_defaults(func=run_train, precheck=precheck_train)


def add_train_arguments(p: argparse.ArgumentParser, config_flag: str = "--config") -> None:
    p.add_argument(config_flag, dest="train_config", help="train YAML (default: training/configs/tiny.yaml)")
    p.add_argument("--nproc", type=int, default=2, help="ranks on this machine (default 2)")
    p.add_argument("--timeout", type=float, default=None, help="kill the job after this many seconds")
    p.add_argument("--max-restarts", type=int, default=0, help="torchrun restarts after a rank failure")


def add_init_from_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--init-from",
        default=None,
        metavar="FOLDER",
        help="start from a Hugging Face GPTNeoXForCausalLM folder (a local path or an s3://, gs:// or az:// "
        "prefix, e.g. a Pythia model you downloaded) instead of random weights: sets init_from",
    )


def precheck_train(args: argparse.Namespace) -> None:
    from flows.cli.precheck import check_train

    check_train(args.manifest, args.train_config, train_overrides(args))


def train_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """``--set`` values, then the S3 flags (which win) as ``s3.<field>`` overrides of the train config."""
    overrides = parse_overrides(args.set) | dotted_s3_overrides(args)
    if getattr(args, "init_from", None):
        overrides["init_from"] = args.init_from
    return overrides


def run_train(args: argparse.Namespace) -> int:
    from flows.cli.report import flow_run_outcome
    from flows.runtime.runners import prefect_api
    from flows.train.flow import train

    with prefect_api():
        state = train(
            args.manifest,
            args.train_config,
            args.nproc,
            train_overrides(args),
            args.timeout,
            args.allow_dataset_change,
            args.max_restarts,
            args.allow_change,
            return_state=True,
        )
    result, run_id = flow_run_outcome(state)
    result = {k: v for k, v in result.items() if k != "history"}
    result["flow_run_url"] = args.api.run_url(run_id)
    output_dir_set = "output_dir" in parse_overrides(args.set)
    finish_training(result, args.manifest, args.json, output_dir_set=output_dir_set)
    return 0


def training_lines(tr: dict[str, Any]) -> list[str]:
    ckpts = Path(tr["output_dir"]) / "checkpoints"
    if not tr["steps"]:
        return [f"no training step was recorded in {tr['output_dir']}"]
    lines = [
        f"trained {tr['steps']} steps: loss {tr['first_loss']:.3f} -> {tr['final_loss']:.3f}, "
        f"{tr['tokens_per_s']:.0f} tokens/s, data wait {tr['data_wait_share']:.1%}",
        f"  checkpoints  {ckpts}",
    ]
    if tr.get("flow_run_url"):
        lines.append(f"  run          {tr['flow_run_url']}")
    return lines


def training_next_commands(tr: dict[str, Any], manifest: str, output_dir_set: bool) -> list[str]:
    from flows.cli.report import command

    if not tr["steps"]:
        return []
    ckpts = Path(tr["output_dir"]) / "checkpoints"
    more = ["--set", f"max_steps={2 * int(tr['steps'])}"]
    if output_dir_set:
        more += ["--set", f"output_dir={tr['output_dir']}"]
    return [
        command("sample", "--checkpoint", ckpts, "--prompt", "Debian is"),
        command("trace", "--checkpoint", ckpts, "--step", tr["steps"]),
        command("train", "--manifest", manifest, *more) + "   # resumes from the last checkpoint",
    ]


def finish_training(tr: dict[str, Any], manifest: str, as_json: bool, output_dir_set: bool) -> None:
    from flows.cli.report import finish

    finish(tr, training_lines(tr), training_next_commands(tr, manifest, output_dir_set), as_json)
