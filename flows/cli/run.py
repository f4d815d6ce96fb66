"""``pileworks run``: prepare the corpus and train on it (the one-click flow), then print a sample."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flows.cli.build import add_build_arguments, corpus_and_train_overrides, print_summary
from flows.cli.train import (
    add_init_from_argument,
    add_train_arguments,
    training_lines,
    training_next_commands,
)


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "run", help="prepare the corpus and train on it (the one-click flow), then print a sample"
    )
    add_build_arguments(
        r,
        "override a config field: dedup.near.threshold=0.7 (corpus) or train.lr=1e-3 (training); repeatable",
    )
    add_train_arguments(r, config_flag="--train-config")
    add_init_from_argument(r)  # also builds the corpus with that model's tokenizer
    # --train-set KEY=VALUE predates --set train.KEY=VALUE: still accepted, not advertised.
    r.add_argument("--train-set", action="append", default=[], metavar="KEY=VALUE", help=argparse.SUPPRESS)
    r.add_argument("--prompt", default="Debian is", help="prompt for the sample printed at the end")
    r.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    r.set_defaults(func=run_prepare_and_train, precheck=precheck_run)


def precheck_run(args: argparse.Namespace) -> None:
    from flows.cli.precheck import check_build
    from flows.train.flow import resolved_train_config

    corpus_overrides, train_overrides = run_overrides(args)
    check_build(args.config, args.inputs, args.output, args.name, corpus_overrides)
    resolved_train_config(args.train_config, train_overrides)


def run_overrides(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Corpus and training overrides; ``--init-from`` builds with the model's tokenizer (its EOS and pad tokens)
    and trains from its weights. An explicit ``--set tokenize.*`` still wins."""
    corpus, train = corpus_and_train_overrides(args)
    if not args.init_from:
        return corpus, train
    from pipeline.corpus_config import load_corpus_config
    from training.hf_init import tokenize_overrides

    s3 = load_corpus_config(args.config, overrides=corpus).s3
    return tokenize_overrides(args.init_from, s3) | corpus, {**train, "init_from": args.init_from}


def run_prepare_and_train(args: argparse.Namespace) -> int:
    from flows.cli.report import finish, flow_run_outcome
    from flows.runtime.runners import prefect_api
    from flows.train.flow import prepare_and_train
    from flows.ui.progress import display

    corpus_overrides, train_overrides = run_overrides(args)
    with prefect_api():  # one API for the flow and every worker of its build
        state = prepare_and_train(
            corpus_config=args.config,
            train_config=args.train_config,
            inputs=args.inputs,
            output=args.output,
            nproc=args.nproc,
            train_overrides=train_overrides,
            corpus_overrides=corpus_overrides,
            timeout_s=args.timeout,
            max_restarts=args.max_restarts,
            name=args.name,
            return_state=True,
            task_runner=args.task_runner,
            workers=args.workers,
        )
    out, run_id = flow_run_outcome(state)
    corpus, tr = out["corpus"], {k: v for k, v in out["training"].items() if k != "history"}
    tr["flow_run_url"] = args.api.run_url(run_id)
    sample = None
    if tr["steps"]:
        from training.generate import generate

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
