"""``pileworks quality train``: a fastText quality classifier from positive and negative examples.

``--positive`` / ``--negative``: files or folders in any format ingest reads (txt, jsonl, parquet, WARC/WET, ...;
``.txt`` files as one example per paragraph); ``--negative-sample N`` draws N negatives from them (a seeded hash of
each text: the same draw on every run). The texts are normalised with the clean config of ``--config`` (the
corpus config the model will be used in; default the embedded one). Prints the held-out precision, recall and
AUC, saved beside the model as ``<out>.metrics.json``; use the model with ``--set clean.classifier.model=<out>``.
"""

from __future__ import annotations

import argparse
import json

from flows.cli.s3_flags import add_s3_arguments, resolve_s3


def register(sub: argparse._SubParsersAction) -> None:
    q = sub.add_parser("quality", help="model-based quality: train a fastText classifier")
    qsub = q.add_subparsers(
        dest="quality_command",
        metavar="COMMAND",
        required=True,
        help="train: a classifier from your examples",
    )
    t = qsub.add_parser("train", help="train a fastText quality classifier on positive and negative examples")
    t.add_argument("--positive", nargs="+", required=True, help="files/folders of good examples (label hq)")
    t.add_argument("--negative", nargs="+", required=True, help="files/folders of other text (label lq)")
    t.add_argument("--out", required=True, help="the model file to write (a local path; metrics beside it)")
    t.add_argument("--negative-sample", type=int, default=None, metavar="N", help="draw N of the negatives")
    t.add_argument("--label", default="hq", help="the positives' label, read by clean.classifier.label")
    t.add_argument("--text-field", default="text", help="the text field of jsonl/parquet inputs")
    t.add_argument("--config", default=None, help="corpus config whose clean section normalises the texts")
    t.add_argument("--epoch", type=int, default=25, help="fastText epochs (default 25)")
    t.add_argument(
        "--holdout-fraction", type=float, default=0.1, help="held out for the metrics (default 0.1)"
    )
    t.add_argument("--seed", type=int, default=0, help="seed of the draw, the split and fastText (default 0)")
    add_s3_arguments(t)
    t.set_defaults(func=run_quality_train)


def run_quality_train(args: argparse.Namespace) -> int:
    from pipeline.clean.classifier_train import ClassifierTrainConfig, train_classifier
    from pipeline.corpus_config import load_corpus_config
    from pipeline.decontam import EvalSet, read_eval_texts

    s3 = resolve_s3(args)
    cfg = ClassifierTrainConfig(
        label=args.label,
        epoch=args.epoch,
        holdout_fraction=args.holdout_fraction,
        negative_sample=args.negative_sample,
        seed=args.seed,
        clean=load_corpus_config(args.config).clean,
    )
    texts = {
        name: read_eval_texts(EvalSet(name=name, inputs=tuple(inputs), text_field=args.text_field), s3)
        for name, inputs in (("positive", args.positive), ("negative", args.negative))
    }
    metrics = train_classifier(texts["positive"], texts["negative"], args.out, cfg)
    print(json.dumps(metrics, indent=1))
    return 0
