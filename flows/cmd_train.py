"""``pileworks train``, ``pileworks run`` (prepare and train: the one-click job) and ``pileworks sample``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flows.cmd_build import add_build_arguments, parse_overrides, print_summary


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
    t.set_defaults(func=run_train)

    r = sub.add_parser(
        "run", help="prepare the corpus and train on it (the one-click flow), then print a sample"
    )
    add_build_arguments(r)
    _train_arguments(r, config_flag="--train-config")
    r.add_argument("--prompt", default="Debian is", help="prompt for the sample printed at the end")
    r.set_defaults(func=run_prepare_and_train)

    s = sub.add_parser("sample", help="generate text from a checkpoint")
    s.add_argument("--checkpoint", required=True, help="checkpoints folder or one tag folder in it")
    s.add_argument("--prompt", default="The")
    s.add_argument("--max-new-tokens", type=int, default=64)
    s.add_argument("--temperature", type=float, default=0.8)
    s.add_argument("--top-k", type=int, default=50)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=run_sample)


def _train_arguments(p: argparse.ArgumentParser, config_flag: str = "--config") -> None:
    p.add_argument(config_flag, dest="train_config", help="train YAML (default: training/configs/tiny.yaml)")
    p.add_argument("--nproc", type=int, default=2, help="ranks on this machine (default 2)")
    p.add_argument(
        "--train-set", action="append", default=[], metavar="KEY=VALUE", help="override a TrainConfig field"
    )
    p.add_argument("--timeout", type=float, default=None, help="kill the job after this many seconds")


def run_train(args: argparse.Namespace) -> int:
    from flows.train import train

    result = train(
        args.manifest, args.train_config, args.nproc, parse_overrides(args.train_set), args.timeout,
        args.allow_dataset_change, args.max_restarts,
    )  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k != "history"}, indent=1))
    return 0


def run_prepare_and_train(args: argparse.Namespace) -> int:
    from flows.runners import prefect_api
    from flows.train import prepare_and_train

    with prefect_api():
        out = prepare_and_train(
            corpus_config=args.config, train_config=args.train_config, inputs=args.inputs, output=args.output,
            nproc=args.nproc, train_overrides=parse_overrides(args.train_set), corpus_overrides=parse_overrides(args.set),
            timeout_s=args.timeout, task_runner=args.task_runner, workers=args.workers,
        )  # fmt: skip
    print_summary(out["corpus"])
    tr = out["training"]
    if tr["steps"]:
        print(f"\ntraining: {tr['steps']} steps, loss {tr['first_loss']:.3f} -> {tr['final_loss']:.3f}, "
              f"{tr['tokens_per_s']:.0f} tokens/s, data wait {tr['data_wait_share']:.1%}; checkpoints in {tr['output_dir']}")  # fmt: skip
        from training.sample import generate

        text = generate(Path(tr["output_dir"]) / "checkpoints", args.prompt, max_new_tokens=48)
        print(f"\nsample ({args.prompt!r}):\n{text}\n")
    return 0


def run_sample(args: argparse.Namespace) -> int:
    from training.sample import generate

    print(
        generate(args.checkpoint, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed)
    )
    return 0
