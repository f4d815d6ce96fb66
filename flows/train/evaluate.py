"""``evaluate``: a checkpoint's loss and perplexity, and its downstream task scores, as a Prefect flow run with
table artifacts.

Two checkpoints evaluated on the same data show as two runs of this flow with comparable artifacts. A user's
``.jsonl`` file is encoded here, by the pipeline's tokenize stage with the checkpoint's own tokenizer, exactly as
a corpus document is (literal special-token text as plain text, EOS appended); training only sees token ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from tokenizers import Tokenizer

from pipeline.storage.options import resolve_s3_options
from pipeline.tokenize.stage import Encoder, TokenizeConfig
from training.checkpoint import read_record
from training.downstream import score_checkpoint
from training.evaluate import evaluate_checkpoint
from training.export_hf import special_ids
from training.generate import resolve_tag_dir
from training.tasks import read_tasks


def read_jsonl_texts(path: str | Path) -> list[str]:
    """The ``text`` of every line of a JSONL file; ValueError naming the first bad line."""
    texts = []
    with Path(path).open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc})") from exc
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f'{path}:{number}: expected an object with a string "text" field')
            texts.append(row["text"])
    if not texts:
        raise ValueError(f"{path} holds no documents")
    return texts


def encode_jsonl(checkpoint: str | Path, path: str | Path) -> tuple[np.ndarray, int]:
    """(one token stream of the file's documents, each ending in EOS; the number of documents)."""
    tag_dir = resolve_tag_dir(checkpoint)
    tokenizer_json = (tag_dir / "tokenizer.json").read_bytes()
    tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    eos_token = tok.id_to_token(special_ids(read_record(tag_dir)).eos_id)
    if eos_token is None:
        raise ValueError(f"{tag_dir}: the tokenizer has no token with the checkpoint's EOS id")
    cfg = TokenizeConfig(
        vocab_size=tok.get_vocab_size(),
        special_tokens=tuple(t["content"] for t in json.loads(tokenizer_json)["added_tokens"]),
        eos_token=eos_token,
        pad_token=None,
        fast_path=False,
    )
    texts = read_jsonl_texts(path)
    return np.concatenate(Encoder(tok, cfg).encode(texts)).astype(np.int64), len(texts)


def evaluation_row(result: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "checkpoint",
        "step",
        "data",
        "split",
        "dataset_id",
        "seq_len",
        "samples",
        "tokens",
        "loss",
        "perplexity",
    )
    return {k: result.get(k) for k in keys}


def task_rows(scores: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per task and metric: the score and its 95% bootstrap interval over the task's items."""
    rows = []
    for name, task in scores.items():
        for metric in ("acc", "acc_norm", "prob"):
            if metric in task:
                low, high = task[f"{metric}_interval"] or (None, None)
                rows.append(
                    {"task": name, "items": task["items"], "metric": metric, "score": task[metric]}
                    | {"ci_low": low, "ci_high": high}
                )
    return rows


@flow(name="evaluate", result_serializer="json")
def evaluate(
    checkpoint: str,
    data: str | None = None,
    seq_len: int | None = None,
    batch_size: int = 8,
    max_samples: int | None = None,
    s3: dict[str, Any] | None = None,
    tasks: list[str] | None = None,
) -> dict[str, Any]:
    """Loss and perplexity of ``checkpoint`` on ``data`` (its dataset's valid split when None) and the scores
    of each ``tasks`` file (``NAME=FILE`` or ``FILE``: :mod:`training.tasks`); ``s3``: the store configuration
    (``S3Options`` fields) for datasets on ``s3://``, ``gs://`` or ``az://``."""
    task_list = read_tasks(tasks or [])
    tokens, documents = None, None
    if data is not None and data.endswith(".jsonl"):
        tokens, documents = encode_jsonl(checkpoint, data)
        data = str(Path(data).resolve())
    result = evaluate_checkpoint(
        checkpoint,
        data,
        tokens=tokens,
        seq_len=seq_len,
        batch_size=batch_size,
        max_samples=max_samples,
        s3=resolve_s3_options(s3) if s3 else None,
    )
    if documents is not None:
        result["documents"] = documents
    get_run_logger().info(
        "step %s on %s: loss %.4f, perplexity %.2f over %d tokens",
        result["step"],
        result["data"],
        result["loss"],
        result["perplexity"],
        result["tokens"],
    )
    create_table_artifact(
        [evaluation_row(result)], key="evaluation", description="Checkpoint loss and perplexity"
    )
    if task_list:
        result["tasks"] = score_checkpoint(checkpoint, task_list, batch_size=batch_size)
        create_table_artifact(
            task_rows(result["tasks"]), key="evaluation-tasks", description="Task scores, 95% intervals"
        )
    return result
