"""S3 connection options, passed explicitly (never read from deep inside I/O code)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class S3Options:
    """How to reach an S3-compatible store. Credentials are never here: boto3's standard chain or a profile.

    ``retry_mode`` is set explicitly because boto3's default is the legacy mode; ``standard`` or ``adaptive``
    with ``max_attempts`` absorb 503 SlowDown bursts.
    """

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    retry_mode: str = "standard"
    max_attempts: int = 8
    multipart_threshold: int = 64 * 1024 * 1024
    multipart_chunk: int = 16 * 1024 * 1024
    max_concurrency: int = 4  # multipart parts in flight at once (memory: this many chunks)
    connect_timeout: float = 10.0
    read_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.retry_mode not in ("standard", "adaptive", "legacy"):
            raise ValueError(f"s3.retry_mode must be standard, adaptive or legacy, got {self.retry_mode!r}")
        if self.max_attempts < 1:
            raise ValueError(f"s3.max_attempts must be >= 1, got {self.max_attempts}")
        if self.max_concurrency < 1:
            raise ValueError(f"s3.max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.multipart_chunk < 5 * 1024 * 1024:
            raise ValueError("s3.multipart_chunk must be >= 5 MiB (the S3 minimum part size)")
        if self.multipart_threshold < self.multipart_chunk:
            raise ValueError("s3.multipart_threshold must be >= s3.multipart_chunk")
