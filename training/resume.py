"""Resume by check: what a checkpoint's data order depends on, and the comparison that guards a resume.

The order in which a run sees its samples is a pure function of the fields of :class:`ResumeState` (see
``training.sampler``): the dataset and tokenizer, ``seed``/``shuffle``/``seq_len``/``samples_per_epoch`` pick
the epoch's permutation, and the position (``epoch``, ``consumed_in_epoch``, a global count) says where in it
the run stands. The layout (``world_size`` x ``micro_batch`` x ``grad_accum``) decides how positions are cut
into steps. A checkpoint records the state; a resume compares it with the new run's and refuses any difference
that would silently train on another order, naming the fields and the override.

Which layout changes keep the order exactly: positions are global, and an epoch ends when fewer than
``world_size * micro_batch`` positions remain (the loader never yields a short batch). So a change that keeps
``world_size * micro_batch`` and ``grad_accum`` (2 ranks x 4 -> 1 rank x 8, or 4 ranks x 2 -> 8 ranks x 1)
continues the same global sample order step for step; any other layout change is refused unless allowed.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from pipeline.errors import CheckpointError

logger = logging.getLogger(__name__)

# Fields that pick the permutation: a change means another order; allowed, the data restarts at epoch 0.
ORDER_FIELDS = ("dataset_id", "tokenizer_sha256", "seed", "shuffle", "seq_len", "samples_per_epoch")
# Fields of the step layout: a change keeping world_size * micro_batch and grad_accum keeps the order.
LAYOUT_FIELDS = ("world_size", "micro_batch", "grad_accum")
# What --allow-dataset-change allows: a new dataset brings its own tokenizer file and length.
DATASET_CHANGE = frozenset({"dataset_id", "tokenizer_sha256", "samples_per_epoch"})
OVERRIDE_OPTION = "--allow-change"


@dataclass(frozen=True, kw_only=True)
class ResumeState:
    """The sampler and data state a checkpoint holds (client state and COMPLETE record)."""

    dataset_id: str
    tokenizer_sha256: str
    seed: int
    shuffle: bool
    seq_len: int
    samples_per_epoch: int
    world_size: int
    micro_batch: int
    grad_accum: int
    epoch: int = 0
    consumed_in_epoch: int = 0  # global sample offset in the epoch's permutation, over all ranks

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResumeState:
        names = {f.name for f in fields(cls)}
        missing = sorted(names - set(data) - {"epoch", "consumed_in_epoch"})
        if missing:
            raise CheckpointError(f"checkpoint resume state lacks {missing}")
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class ResumeDecision:
    """``continue_order``: keep the checkpoint's (epoch, consumed_in_epoch); else start the new order at 0."""

    continue_order: bool
    changed: tuple[str, ...]


def _differences(saved: ResumeState, now: ResumeState) -> dict[str, tuple[Any, Any]]:
    names = ORDER_FIELDS + LAYOUT_FIELDS
    return {n: (getattr(saved, n), getattr(now, n)) for n in names if getattr(saved, n) != getattr(now, n)}


def layout_keeps_order(saved: ResumeState, now: ResumeState) -> bool:
    """True when the step layout cuts the same global positions into the same steps and epochs."""
    return (
        saved.world_size * saved.micro_batch == now.world_size * now.micro_batch
        and saved.grad_accum == now.grad_accum
    )


def check_resume(
    saved: ResumeState, now: ResumeState, *, tag: str, allowed: Collection[str]
) -> ResumeDecision:
    """Compare a checkpoint's state with this run's; raise one line naming what differs unless allowed.

    ``allowed`` names fields the user accepted changing (``--allow-change FIELD``; ``--allow-dataset-change``
    allows :data:`DATASET_CHANGE`).
    """
    diff = _differences(saved, now)
    unknown = sorted(set(allowed) - set(ORDER_FIELDS + LAYOUT_FIELDS))
    if unknown:
        raise ValueError(
            f"{OVERRIDE_OPTION} names unknown field(s) {unknown}; known: {ORDER_FIELDS + LAYOUT_FIELDS}"
        )
    refused = [n for n in diff if n in ORDER_FIELDS and n not in allowed]
    layout = [n for n in diff if n in LAYOUT_FIELDS]
    if layout and not layout_keeps_order(saved, now):
        refused += [n for n in layout if n not in allowed]
    if refused:
        what = ", ".join(f"{n} {diff[n][0]!r} -> {diff[n][1]!r}" for n in refused)
        raise CheckpointError(
            f"checkpoint {tag} does not match this run ({what}): resuming would train on another sample "
            f"order; pass {OVERRIDE_OPTION} {','.join(refused)} to resume anyway"
        )
    order_changed = any(n in ORDER_FIELDS for n in diff)
    if layout:
        logger.info(
            "resuming %s with another layout (%s): %s",
            tag,
            ", ".join(f"{n} {diff[n][0]} -> {diff[n][1]}" for n in layout),
            "the global sample order continues" if layout_keeps_order(saved, now) else "allowed by the user",
        )
    if order_changed:
        logger.warning(
            "resuming %s with %s changed (allowed): the data starts at epoch 0 of the new order",
            tag,
            ", ".join(n for n in diff if n in ORDER_FIELDS),
        )
    return ResumeDecision(continue_order=not order_changed, changed=tuple(diff))


def parse_allowed(values: Collection[str], *, allow_dataset_change: bool) -> frozenset[str]:
    """``--allow-change a,b --allow-change c`` and ``--allow-dataset-change`` as one set of field names."""
    names = {n.strip() for v in values for n in v.split(",") if n.strip()}
    return frozenset(names | (DATASET_CHANGE if allow_dataset_change else set()))
