"""The one store configuration: the ``s3:`` section shared by the corpus and training configs.

Every store is opened with one (``open_store(uri, s3)`` has no default), so no code path can reach a cloud with
settings other than the ones the user gave. The section kept its name from when S3 was the only cloud: its retry
budget, timeouts and part sizes hold for ``gs://`` and ``az://`` stores too, beside their endpoints. Credentials
are never here: each cloud's standard chain (boto3's or a profile; Application Default Credentials;
``DefaultAzureCredential``, a connection string or a SAS token in the environment).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.config import build_config


@dataclass(frozen=True, kw_only=True)
class S3Options:
    """How to reach an S3-compatible store and how long to keep trying.

    Retries are ours, per operation (``pipeline.storage.retry``): transient failures (throttling, 5xx,
    connection refused/reset, timeouts) are retried with capped exponential backoff and full jitter until
    ``retry_budget_s`` seconds have passed or ``max_attempts`` tries were made; botocore itself makes one
    attempt, so there is no shared retry quota to drain. Errors that cannot succeed (missing object, no
    credentials, access denied, no such bucket) fail at once.
    """

    endpoint_url: str | None = None  # None: AWS (or AWS_ENDPOINT_URL, botocore's standard variable)
    region: str | None = None
    profile: str | None = None
    retry_budget_s: float = 120.0  # total time one operation may spend retrying
    retry_base_s: float = 0.1  # first backoff cap; doubles per retry up to retry_cap_s
    retry_cap_s: float = 5.0
    max_attempts: int = 100
    multipart_threshold: int = 64 * 1024 * 1024
    multipart_chunk: int = 16 * 1024 * 1024
    max_concurrency: int = 4  # multipart parts in flight at once (memory: this many chunks)
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    # gs:// (pipeline.storage.gcs): None: STORAGE_EMULATOR_HOST, else Google. An http:// endpoint (an
    # emulator) is reached without credentials: no token crosses plain HTTP; https:// ones use ADC.
    gcs_endpoint_url: str | None = None
    # az:// and abfs:// (pipeline.storage.azure): the account's Blob endpoint (https://ACCOUNT.blob.core.
    # windows.net, a sovereign cloud's, Azurite's http://127.0.0.1:10000/devstoreaccount1). None: the
    # BlobEndpoint of AZURE_STORAGE_CONNECTION_STRING, the abfs URI's account, or AZURE_STORAGE_ACCOUNT_NAME.
    azure_endpoint_url: str | None = None

    def __post_init__(self) -> None:
        for name in ("endpoint_url", "gcs_endpoint_url", "azure_endpoint_url"):
            value = getattr(self, name)
            if value is not None and not value.startswith(("http://", "https://")):
                raise ValueError(f"s3.{name} must start with http:// or https://, got {value!r}")
        if self.retry_budget_s < 0:
            raise ValueError(f"s3.retry_budget_s must be >= 0 (0: no retries), got {self.retry_budget_s}")
        if not 0 < self.retry_base_s <= self.retry_cap_s:
            raise ValueError("s3.retry_base_s must be > 0 and <= s3.retry_cap_s")
        if self.max_attempts < 1:
            raise ValueError(f"s3.max_attempts must be >= 1, got {self.max_attempts}")
        if self.max_concurrency < 1:
            raise ValueError(f"s3.max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.multipart_chunk < 5 * 1024 * 1024:
            raise ValueError("s3.multipart_chunk must be >= 5 MiB (the S3 minimum part size)")
        if self.multipart_threshold < self.multipart_chunk:
            raise ValueError("s3.multipart_threshold must be >= s3.multipart_chunk")
        for name in ("connect_timeout", "read_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"s3.{name} must be > 0, got {getattr(self, name)}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def updated(self, changes: Mapping[str, Any]) -> S3Options:
        """A copy with ``changes`` (field name -> value) applied; unknown names are an error naming the field."""
        if not changes:
            return self
        return build_config(S3Options, {**self.to_dict(), **changes}, "s3")


def resolve_s3_options(changes: Mapping[str, Any] | None = None, base: S3Options | None = None) -> S3Options:
    """The one place a store configuration is made outside a config file: ``changes`` over ``base``/defaults."""
    return (base or S3Options()).updated(changes or {})
