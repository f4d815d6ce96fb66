"""Names for flow and task runs that say what they do: ``clean part 3/12``, ``near-dedup: bands 2/9``,
``build sample 46dab3b9``, ``train tiny on sample@46dab3b9`` (that one lives with its flow in flows/train/flow.py).

Prefect calls a ``task_run_name``/``flow_run_name`` callable when the run starts; it reads the run's parameters
from :mod:`prefect.runtime`. Part numbers count from 1 (a person's "part 3 of 12"); the total comes from the
build context (``parts``) or the near-dedup plan.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pipeline.corpus_config import load_corpus_config

BUILD_FLOW = "build_corpus"  # the build flow's name in Prefect (runs recorded without the engine use it too)
DATASET_IN_URI = re.compile(r"datasets/([^/]+)/([0-9a-f]{8})[0-9a-f]*")


def _task_params() -> dict[str, Any]:
    from prefect.runtime import task_run

    return dict(task_run.parameters or {})


def part(label: str, index_param: str = "index") -> Callable[[], str]:
    """``<label> i/N`` for a per-part task: ``index`` (0-based) is a parameter, N is ``ctx['parts']``."""

    def name() -> str:
        p = _task_params()
        index = p[index_param] if index_param in p else p["plan"]["index"]
        total = p.get("ctx", {}).get("parts") or "?"
        return f"{label} {int(index) + 1}/{total}"

    return name


def parts(label: str, param: str = "indices") -> Callable[[], str]:
    """``<label> a-b/N`` for a chunk task over a run of parts, ``<label> a, b, …, z/N`` over parts dealt
    round-robin (``param``: the part indices, or the part plans); N is ``ctx['parts']`` (for LSH edges, the
    plan's bucket partitions; for index bands, the index's parts)."""

    def name() -> str:
        p = _task_params()
        items = p.get(param) or []
        idx = [int(x["index"]) if isinstance(x, dict) else int(x) for x in items] or [0]
        total = p.get("ctx", {}).get("parts") or "?"
        if param == "partitions":
            total = p.get("plan", {}).get("num_partitions", "?")
        shown = label
        if p.get("from_index"):
            shown, total = label.replace("bands", "index bands"), p.get("plan", {}).get("index_parts", "?")
        if idx[-1] - idx[0] == len(idx) - 1:  # a run of parts
            return f"{shown} {idx[0] + 1}-{idx[-1] + 1}/{total}"
        listed = (
            [str(i + 1) for i in idx]
            if len(idx) <= 3
            else [str(idx[0] + 1), str(idx[1] + 1), "…", str(idx[-1] + 1)]
        )
        return f"{shown} {', '.join(listed)}/{total}"  # parts dealt round-robin: the first two and the last

    return name


def bands() -> str:
    """LSH bands over this build's parts, then over the parts of an earlier dataset's index."""
    p = _task_params()
    if p.get("from_index"):
        return f"near-dedup: index bands {p['index'] + 1}/{p['plan'].get('index_parts', '?')}"
    return f"near-dedup: bands {p['index'] + 1}/{p.get('ctx', {}).get('parts') or '?'}"


def edges() -> str:
    p = _task_params()
    return f"near-dedup: edges {p['partition'] + 1}/{p['plan'].get('num_partitions', '?')}"


def dataset_label(manifest_uri: str) -> str:
    """``sample@46dab3b9`` from a published manifest's URI (``…/datasets/<name>/<dataset_id>/…``)."""
    m = DATASET_IN_URI.search(manifest_uri)
    if m:
        return f"{m[1]}@{m[2]}"
    tail = manifest_uri.rstrip("/").rsplit("datasets/", 1)[-1]
    return f"{tail.split('/')[0]}@latest" if "datasets/" in manifest_uri else manifest_uri


def build_run_name() -> str:
    """At the start of a build: ``build <name>``; :func:`rename_flow_run` adds the dataset id once published."""
    from prefect.runtime import flow_run

    p = flow_run.parameters or {}
    name = p.get("name") or (p.get("overrides") or {}).get("name")
    if not name:
        try:
            name = load_corpus_config(p.get("config_path"), overrides=p.get("overrides")).name
        except (ValueError, OSError):  # the flow itself reports a bad config, with its message
            return "build"
    return f"build {name}"


def unchanged_run_name(name: str, dataset_id: str) -> str:
    """A build that found its dataset published: ``build sample 46dab3b9 (unchanged)``."""
    return f"build {name} {dataset_id[:8]} (unchanged)"


def rename_flow_run(name: str) -> None:
    """Rename the current flow run (e.g. once the build knows its dataset id)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if flow_run.id:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, name=name)


def windows(label: str) -> Callable[[], str]:
    """``<label> train 1-36, valid 1/141+3``: the shards of each split a shard task writes or publishes."""

    def name() -> str:
        shown = [f"{w['split']} {_span(w['first'], w['stop'])}" for w in _task_params().get("windows") or []]
        return f"{label} {', '.join(shown) or '?'}"

    return name


def _span(first: int, stop: int) -> str:
    return f"{first + 1}" if stop == first + 1 else f"{first + 1}-{stop}"
