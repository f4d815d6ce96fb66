"""``pileworks train``, ``pileworks run`` (prepare and train: the one-click job) and ``pileworks sample``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flows.cmd_build import add_build_arguments, key_value, parse_overrides, print_summary


def register(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train", help="train on a published dataset with DeepSpeed (local ranks)")
    t.add_argument(
        "--manifest", required=True, help="manifest URI, dataset folder or datasets/<name> (follows latest)"
    )
    _train_arguments(t)
    t.add_argument(
        "--allow-dataset-change", action="store_true", help="resume a checkpoint made on another dataset"
    )
    t.add_argument("--max-restarts", type=int, default=0, help="torchrun restarts after a rank failure")
    t.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    t.set_defaults(func=run_train, precheck=precheck_train)

    r = sub.add_parser(
        "run", help="prepare the corpus and train on it (the one-click flow), then print a sample"
    )
    add_build_arguments(r)
    _train_arguments(r, config_flag="--train-config")
    r.add_argument("--prompt", default="Debian is", help="prompt for the sample printed at the end")
    r.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    r.set_defaults(func=run_prepare_and_train, precheck=precheck_run)

    s = sub.add_parser("sample", help="generate text from a checkpoint")
    s.add_argument("--checkpoint", required=True, help="checkpoints folder or one tag folder in it")
    s.add_argument("--prompt", default="The", help="text to continue (default: 'The')")
    s.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    s.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8)")
    s.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest tokens (default 50)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    s.set_defaults(func=run_sample)


def _train_arguments(p: argparse.ArgumentParser, config_flag: str = "--config") -> None:
    p.add_argument(config_flag, dest="train_config", help="train YAML (default: training/configs/tiny.yaml)")
    p.add_argument("--nproc", type=int, default=2, help="ranks on this machine (default 2)")
    p.add_argument(
        "--train-set", action="append", default=[], type=key_value, metavar="KEY=VALUE",
        help="override a TrainConfig field, e.g. max_steps=50 (repeatable)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=None, help="kill the job after this many seconds")


def precheck_train(args: argparse.Namespace) -> None:
    from flows.precheck import check_train

    check_train(args.manifest, args.train_config, parse_overrides(args.train_set))


def precheck_run(args: argparse.Namespace) -> None:
    from flows.precheck import check_build
    from flows.train import resolved_train_config

    check_build(args.config, args.inputs, args.output, args.name, parse_overrides(args.set))
    resolved_train_config(args.train_config, parse_overrides(args.train_set))


def run_train(args: argparse.Namespace) -> int:
    from flows.report import flow_run_outcome
    from flows.train import train

    state = train(
        args.manifest, args.train_config, args.nproc, parse_overrides(args.train_set), args.timeout,
        args.allow_dataset_change, args.max_restarts, return_state=True,
    )  # fmt: skip
    result, run_id = flow_run_outcome(state)
    result = {k: v for k, v in result.items() if k != "history"}
    result["flow_run_url"] = args.api.run_url(run_id)
    finish_training(result, args.manifest, args.json, output_dir_set="output_dir" in dict(args.train_set))
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
    from flows.report import command

    if not tr["steps"]:
        return []
    ckpts = Path(tr["output_dir"]) / "checkpoints"
    more = ["--train-set", f"max_steps={2 * int(tr['steps'])}"]
    if output_dir_set:
        more += ["--train-set", f"output_dir={tr['output_dir']}"]
    return [
        command("sample", "--checkpoint", ckpts, "--prompt", "Debian is"),
        command("trace", "--checkpoint", ckpts, "--step", tr["steps"]),
        command("train", "--manifest", manifest, *more) + "   # resumes from the last checkpoint",
    ]


def finish_training(tr: dict[str, Any], manifest: str, as_json: bool, output_dir_set: bool) -> None:
    from flows.report import finish

    finish(tr, training_lines(tr), training_next_commands(tr, manifest, output_dir_set), as_json)


def run_prepare_and_train(args: argparse.Namespace) -> int:
    from flows.progress import display
    from flows.report import finish, flow_run_outcome
    from flows.runners import with_task_runner
    from flows.train import prepare_and_train

    flow = prepare_and_train
    if args.task_runner != "local":
        flow = with_task_runner(prepare_and_train, args.task_runner)
    state = flow(
        corpus_config=args.config, train_config=args.train_config, inputs=args.inputs, output=args.output,
        nproc=args.nproc, train_overrides=parse_overrides(args.train_set), corpus_overrides=parse_overrides(args.set),
        timeout_s=args.timeout, name=args.name, return_state=True,
    )  # fmt: skip
    out, run_id = flow_run_outcome(state)
    corpus, tr = out["corpus"], {k: v for k, v in out["training"].items() if k != "history"}
    tr["flow_run_url"] = args.api.run_url(run_id)
    sample = None
    if tr["steps"]:
        from training.sample import generate

        display.stage("generating a sample")
        sample = generate(Path(tr["output_dir"]) / "checkpoints", args.prompt, max_new_tokens=48)
    if args.json:
        finish({"corpus": corpus, "training": tr, "sample": sample}, [], _run_next(corpus, tr), True)
        return 0
    print_summary(corpus)
    lines = [
        f"published dataset {corpus['name']} {corpus['dataset_id']}",
        f"  manifest     {corpus['manifest_uri']}",
        *training_lines(tr),
    ]
    if sample is not None:
        lines += ["", f"sample ({args.prompt!r}):", sample, ""]
    finish({}, lines, _run_next(corpus, tr), False)
    return 0


def _run_next(corpus: dict[str, Any], tr: dict[str, Any]) -> list[str]:
    # ``run`` trains in <output_dir>-<dataset id>: a resume through ``train`` must name that folder.
    return training_next_commands(tr, corpus["manifest_uri"], output_dir_set=True)


def run_sample(args: argparse.Namespace) -> int:
    from training.sample import generate

    print(
        generate(args.checkpoint, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed)
    )
    return 0
