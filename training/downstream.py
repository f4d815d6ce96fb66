"""Downstream task scores of a model by log-likelihood, computed as lm-evaluation-harness computes them.

Each request is a (context, continuation) pair of text (:mod:`training.tasks`). Its tokens are cut as
lm-evaluation-harness's ``_encode_pair`` cuts them: trailing whitespace of the context moves to the front of
the continuation, then ``context + continuation`` is encoded whole and the continuation is what follows the
context's own tokens (so a BPE merge across the boundary is the whole's); an empty context is the EOS token.
The model reads ``(context + continuation)[-(max_seq_len + 1):][:-1]`` and the log-likelihood is the sum of the
continuation tokens' log-probabilities (fp32 log-softmax); a continuation is *greedy* when each of its tokens is
the model's argmax.

Scores per item, averaged over the task's items:

* multiple choice: ``acc`` (the choice of highest summed log-likelihood is the gold one, first on a tie),
  ``acc_norm`` (the same with each log-likelihood divided by its choice's length in characters, the delimiter
  not counted: lm-evaluation-harness's ``acc_norm``), ``prob`` (the probability of the gold choice among the
  choices: the softmax of the summed log-likelihoods, DataDecide's and OLMES's normalised correct probability);
* completion: ``acc`` (the continuation is greedy: LAMBADA's accuracy), ``prob`` (the continuation's
  probability, ``exp`` of its log-likelihood) and ``perplexity`` (``exp`` of minus the mean log-likelihood,
  lm-evaluation-harness's ``perplexity``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from training.export_hf import special_ids
from training.generate import load_model
from training.intervals import bootstrap_interval
from training.model import GPT
from training.tasks import McItem, Request, Task

Pair = tuple[list[int], list[int]]


def encode_pair(tok: Tokenizer, request: Request, eos_id: int) -> Pair:
    """(context ids, continuation ids) of a request, as lm-evaluation-harness's causal-LM encoding."""
    context, continuation = request.context, request.continuation
    if context == "":
        ids = tok.encode(continuation, add_special_tokens=False).ids
        return ([eos_id], ids) if ids[:1] != [eos_id] else (ids[:1], ids[1:])
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tok.encode(context + continuation, add_special_tokens=False).ids
    context_ids = tok.encode(context, add_special_tokens=False).ids
    return context_ids, whole[len(context_ids) :]


@torch.no_grad()
def loglikelihoods(
    model: GPT, pairs: Sequence[Pair], batch_size: int = 16, device: str = "cpu"
) -> list[tuple[float, bool]]:
    """(summed log-likelihood of the continuation, whether it is greedy) for every pair, in order.

    Pairs run longest first in right-padded batches (a causal model's padding on the right changes nothing)."""
    limit = model.cfg.max_seq_len
    for _context, continuation in pairs:
        if not continuation or len(continuation) > limit:
            raise ValueError(f"a continuation must have 1 to {limit} tokens; got {len(continuation)}")
    out: list[tuple[float, bool]] = [(0.0, False)] * len(pairs)
    order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        inputs = [(pairs[i][0] + pairs[i][1])[-(limit + 1) :][:-1] for i in chunk]
        x = torch.zeros(len(chunk), max(map(len, inputs)), dtype=torch.long)
        for row, seq in enumerate(inputs):
            x[row, : len(seq)] = torch.tensor(seq)
        logprobs = F.log_softmax(model(x.to(device)).float(), dim=-1).cpu()
        for row, i in enumerate(chunk):
            cont = torch.tensor(pairs[i][1])
            end = len(inputs[row])
            lp = logprobs[row, end - len(cont) : end]
            ll = float(lp.gather(-1, cont[:, None]).sum())
            out[i] = (ll, bool((lp.argmax(dim=-1) == cont).all()))
    return out


def item_scores(task: Task, results: Sequence[tuple[float, bool]]) -> dict[str, np.ndarray]:
    """Per-item scores of a task from its requests' results (in the items' request order)."""
    if task.kind == "completion":
        lls = np.array([ll for ll, _ in results])
        return {"acc": np.array([float(g) for _, g in results]), "prob": np.exp(lls), "loglik": lls}
    acc, acc_norm, prob, at = [], [], [], 0
    for item in task.items:
        assert isinstance(item, McItem)
        lls = np.array([ll for ll, _ in results[at : at + len(item.choices)]])
        at += len(item.choices)
        lengths = np.array([float(len(c)) for c in item.choices])
        acc.append(float(np.argmax(lls) == item.gold))
        acc_norm.append(float(np.argmax(lls / lengths) == item.gold))
        shifted = np.exp(lls - lls.max())
        prob.append(float(shifted[item.gold] / shifted.sum()))
    return {"acc": np.array(acc), "acc_norm": np.array(acc_norm), "prob": np.array(prob)}


def summarize(task: Task, per_item: dict[str, np.ndarray]) -> dict[str, Any]:
    """A task's scores: each metric's mean and its 95% bootstrap interval over items, and the per-item scores."""
    scores: dict[str, Any] = {"kind": task.kind, "items": len(task.items), "file": task.path}
    for metric, values in per_item.items():
        if metric == "loglik":
            scores["perplexity"] = math.exp(min(-float(values.mean()), 700.0))
            continue
        scores[metric] = float(values.mean())
        scores[f"{metric}_interval"] = bootstrap_interval(values)
    scores["per_item"] = {k: [float(v) for v in values] for k, values in per_item.items()}
    return scores


def score_tasks(
    model: GPT,
    tok: Tokenizer,
    eos_id: int,
    tasks: Sequence[Task],
    *,
    batch_size: int = 16,
    device: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Every task's scores (see the module docstring), by task name."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device).eval()
    results = {}
    for task in tasks:
        owners = [(n, r) for n, item in enumerate(task.items, 1) for r in item.requests()]
        pairs = [encode_pair(tok, r, eos_id) for _, r in owners]
        for (n, _), (_, continuation) in zip(owners, pairs, strict=True):
            if not 1 <= len(continuation) <= model.cfg.max_seq_len:
                raise ValueError(
                    f"task {task.name} ({task.path}) item {n}: a continuation of {len(continuation)} tokens; "
                    f"the model reads 1 to {model.cfg.max_seq_len}"
                )
        results[task.name] = summarize(
            task, item_scores(task, loglikelihoods(model, pairs, batch_size, device))
        )
    return results


def score_checkpoint(
    checkpoint: str | Path, tasks: Sequence[Task], *, batch_size: int = 16
) -> dict[str, Any]:
    """Every task's scores for the newest verified checkpoint of ``checkpoint`` (or that tag folder), read with
    the checkpoint's own tokenizer and EOS."""
    model, record, tag_dir = load_model(checkpoint)
    tok = Tokenizer.from_file(str(tag_dir / "tokenizer.json"))
    return score_tasks(model, tok, special_ids(record).eos_id, tasks, batch_size=batch_size)
