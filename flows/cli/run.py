"""``pileworks run``: prepare the corpus and train on it (the one-click flow), then print a sample."""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.cli.build import add_build_arguments, print_summary
from flows.cli.train import add_train_arguments
from pipeline.config import parse_overrides, split_overrides


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "run", help="prepare the corpus and train on it (the one-click flow), then print a sample"
    )
    add_build_arguments(
        r,
        "override a config field: dedup.near.threshold=0.7 (corpus) or train.lr=1e-3 (training); repeatable",
    )
    add_train_arguments(r, config_flag="--train-config")
    # --train-set KEY=VALUE predates --set train.KEY=VALUE: still accepted, not advertised.
    r.add_argument("--train-set", action="append", default=[], metavar="KEY=VALUE", help=argparse.SUPPRESS)
    r.add_argument("--prompt", default="Debian is", help="prompt for the sample printed at the end")
    r.set_defaults(func=run_prepare_and_train)


def run_prepare_and_train(args: argparse.Namespace) -> int:
    from flows.runners import with_task_runner
    from flows.train import prepare_and_train

    train_overrides, corpus_overrides = split_overrides(parse_overrides(args.set), "train")
    train_overrides.update(parse_overrides(args.train_set))
    flow = prepare_and_train
    if args.task_runner != "local":
        flow = with_task_runner(prepare_and_train, args.task_runner)
    out = flow(
        corpus_config=args.config, train_config=args.train_config, inputs=args.inputs, output=args.output,
        nproc=args.nproc, train_overrides=train_overrides, corpus_overrides=corpus_overrides,
        timeout_s=args.timeout,
    )  # fmt: skip
    print_summary(out["corpus"])
    tr = out["training"]
    if tr["steps"]:
        print(f"\ntraining: {tr['steps']} steps, loss {tr['first_loss']:.3f} -> {tr['final_loss']:.3f}, "
              f"{tr['tokens_per_s']:.0f} tokens/s, data wait {tr['data_wait_share']:.1%}; checkpoints in {tr['output_dir']}")  # fmt: skip
        from training.generate import generate

        text = generate(Path(tr["output_dir"]) / "checkpoints", args.prompt, max_new_tokens=48)
        print(f"\nsample ({args.prompt!r}):\n{text}\n")
    return 0
