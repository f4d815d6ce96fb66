"""Fail fast: what a command can check in a second before it contacts Prefect or starts a flow.

A flow that starts on a typo, a missing input or an unreachable store only fails after the server, the task
retries and the timeouts had their turn; these checks raise the same error (one line, naming the object and the
fix) before any of that. They read what the flow will read: the config through the flow's own loader, the
inputs through the ingest listing (one attempt, short timeouts, so an unreachable endpoint answers in seconds).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator
from typing import Any

from pipeline.errors import PileworksError


class UsageError(PileworksError, ValueError):
    """A command line that cannot work (a bad flag value found after parsing): exit 2, like argparse's errors."""


FAST_S3 = {"max_attempts": 1, "connect_timeout": 3.0, "read_timeout": 10.0}


def _fast(s3: Any) -> Any:
    """The same S3 options with one attempt and short timeouts: a check must not ride out an outage."""
    if s3 is None:
        return None
    names = {f.name for f in dataclasses.fields(s3)}
    fast = {k: v for k, v in FAST_S3.items() if k in names}
    if "retry_budget_s" in names:
        fast["retry_budget_s"] = 0.0
    return dataclasses.replace(s3, **fast)


def check_build(
    config_path: str | None,
    inputs: list[str] | None,
    output: str | None,
    name: str | None,
    overrides: dict[str, Any],
) -> Any:
    """Load the corpus config and list its inputs (exist, match something of a known format, readable)."""
    from pipeline.corpus_config import load_corpus_config
    from pipeline.ingest import stage as ingest
    from pipeline.storage import is_remote

    cfg = load_corpus_config(config_path, inputs=inputs, output=output, name=name, overrides=overrides)
    sources = list(cfg.resolved_inputs())
    # the flow lists again, and says what it skips
    with _quiet(ingest.log), _unreachable_is_one_line(cfg.s3, sources):
        listed = ingest.list_inputs(sources, s3=_fast(cfg.s3), extensions=cfg.ingest.extensions)
    _check_extractor(cfg.ingest, [ingest.format_of(f.uri, cfg.ingest.extensions) for f in listed])
    if is_remote(cfg.output):  # the flow's first request there: no credentials, no bucket say so now
        from pipeline.storage import open_store
        from pipeline.storage.uploads import UPLOADS_FOLDER

        with _unreachable_is_one_line(cfg.s3, [cfg.output]):
            next(iter(open_store(cfg.output, _fast(cfg.s3)).list(UPLOADS_FOLDER + "/")), None)
    return cfg


def _check_extractor(ingest_cfg: Any, formats: list[str | None]) -> None:
    """Where a WARC or ARC file is listed, build its HTML extractor now: a package that is missing (trafilatura,
    jusText, lxml_html_clean) is one line naming the pip command that installs it, before Prefect or any worker
    starts, not an error of the first ingest task. WET files hold text and need no extractor."""
    from pipeline.ingest import html
    from pipeline.ingest.config import WEB_FORMATS

    if any(fmt in WEB_FORMATS and not fmt.startswith("wet") for fmt in formats if fmt is not None):
        html.build_extractor(ingest_cfg.html)


# per scheme: the store's name, the s3: field and flag of its endpoint, the endpoint when none is set
_ENDPOINTS = {
    "s3://": ("S3", "endpoint_url", "--s3-endpoint-url", "AWS"),
    "gs://": ("GCS", "gcs_endpoint_url", "--gcs-endpoint-url", "Google"),
    "az://": ("Azure", "azure_endpoint_url", "--azure-endpoint-url", "AZURE_STORAGE_CONNECTION_STRING's"),
}


def _endpoint_hint(s3: Any, uris: list[str]) -> tuple[str, str]:
    """``(the GCS store at URL, check s3.gcs_endpoint_url (--gcs-endpoint-url))`` for the cloud ``uris`` name;
    for several clouds, each one's setting."""
    schemes = {"az://" if u.startswith(("abfs://", "abfss://")) else u[: u.find("://") + 3] for u in uris}
    hints = [_ENDPOINTS[s] for s in sorted(schemes) if s in _ENDPOINTS]
    if len(hints) != 1:
        return "a cloud store", "check " + (", ".join(f"s3.{f} ({flag})" for _, f, flag, _ in hints) or "s3:")
    name, field, flag, default = hints[0]
    if name == "GCS":
        default = os.environ.get("STORAGE_EMULATOR_HOST") or default
    return f"the {name} store at {getattr(s3, field, None) or default}", f"check s3.{field} ({flag})"


@contextlib.contextmanager
def _unreachable_is_one_line(s3: Any, uris: list[str]) -> Iterator[None]:
    """A store that does not answer the one quick try: say so, and what to check (not the retry budget)."""
    from pipeline.errors import RetryBudgetSpent, StorageError
    from pipeline.storage.retry import transient_reason

    try:
        yield
    except StorageError as exc:
        cause = exc.__cause__
        reason = exc.reason if isinstance(exc, RetryBudgetSpent) else None
        if reason is None and cause is not None:
            reason = transient_reason(cause)
        if reason is None:
            raise
        where, check = _endpoint_hint(s3, uris)
        raise StorageError(
            f"cannot reach {where}{' for ' + uris[0] if len(uris) == 1 else ''} ({reason}: {cause}); {check} "
            "and that the store is up"
        ) from cause


@contextlib.contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def check_train(manifest_uri: str, config_path: str | None, overrides: dict[str, Any]) -> Any:
    """Find the dataset (a manifest that loads and validates), then load the training config.

    A local dataset is looked up first (a second, before torch is imported); a cloud one (``s3://``, ``gs://``, ``az://``) needs the
    training config's ``s3:`` section to be reached at all."""
    from pipeline.dataset.manifest import load_manifest
    from pipeline.storage import is_remote

    if not is_remote(manifest_uri):
        load_manifest(manifest_uri, None)
    from flows.train.flow import (
        resolved_train_config,  # prefect and torch: only once a local dataset is found
    )

    cfg = resolved_train_config(config_path, overrides)
    manifest, store = load_manifest(manifest_uri, _fast(cfg.s3))
    if cfg.init_from:  # the model's config and tokenizer against the dataset's, before any rank starts
        from training.hf_init import check_dataset_tokenizer, load_hf_model

        model = load_hf_model(cfg.init_from, _fast(cfg.s3), weights=False)
        tokenizer = manifest.tokenizer
        check_dataset_tokenizer(model, cfg.init_from, tokenizer, store.get_bytes(tokenizer.key))
    return cfg
