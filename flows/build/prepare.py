"""A build's preparation, one step for the head start and the flow: the work folder, the plan over the workers and
the first pass's calls.

``pileworks build`` prepares a local build before it imports Prefect (``flows/build/head_start.py``) and starts
the first pass on its workers; the flow, in the same process, takes that preparation as it is (the same
:class:`Prepared`, context and call arguments: nothing rebuilt, nothing to match) or, when there was none
(another task runner, a deployment), prepares the same way itself. Without Prefect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flows.build.context import BuildContext
from flows.build.inputs import build_key, ingest_keys
from flows.build.plan import chunks, sizing
from pipeline.corpus_config import CorpusConfig
from pipeline.storage import ObjectStore, open_store


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A build of ``cfg`` (its classifier pinned) over the listed ``planned`` inputs: its store and work folder, the
    workers it uses and its parts per task (heavy and light passes)."""

    cfg: CorpusConfig
    planned: dict[str, Any]
    store: ObjectStore
    work: str
    workers: int
    size: int
    light: int

    @property
    def parts(self) -> int:
        return len(self.planned["plans"])

    def context(self, lease: str) -> dict[str, Any]:
        """The :class:`BuildContext` every task of the build gets (JSON), with its ``lease``."""
        ctx = BuildContext(
            store_uri=self.store.uri, work=self.work, config=self.cfg.to_dict(), parts=self.parts, lease=lease
        )
        return ctx.to_json()

    def ingest_calls(self, ctx: dict[str, Any]) -> list[tuple[dict[str, Any], list[Any], list[str]]]:
        """The first pass's task arguments: ``(ctx, plans, unit keys)`` per chunk of parts."""
        plans = self.planned["plans"]
        keys = ingest_keys(self.cfg, plans, self.planned["inputs"])
        return [
            (ctx, part_plans, part_keys)
            for part_plans, part_keys in zip(chunks(plans, self.size), chunks(keys, self.size), strict=True)
        ]


def prepare(
    cfg: CorpusConfig, planned: dict[str, Any], workers: int, fit: Callable[[int], int] | None = None
) -> Prepared:
    """The build of ``cfg`` over ``planned`` (:func:`flows.build.inputs.list_and_plan`) on up to ``workers``;
    ``fit``: the flow's task runner's, told the widest pass's chunks (:func:`flows.build.plan.sizing`)."""
    used, size, light = sizing(planned["plans"], workers, fit=fit)
    return Prepared(
        cfg=cfg,
        planned=planned,
        store=open_store(cfg.output, cfg.s3),
        work=f"work/{build_key(cfg, planned)}",
        workers=used,
        size=size,
        light=light,
    )
