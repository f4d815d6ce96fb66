"""The preflight's bottom floor: the result types (:class:`Status`, :class:`CheckResult`), what to check
(:class:`DoctorConfig`) and the registry of check names, in the order they run. The checks live above it in
``host`` (versions, GPUs, disk), ``net`` (interfaces, master, hostfile), ``dist`` (all-reduce, DeepSpeed dry run)
and ``store`` (object-store probe); ``runner`` maps the names to them and runs them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pipeline.storage import S3Options

# Every check, in the order the runner runs them (``--only`` / ``--skip`` take these names).
CHECK_NAMES = ("versions", "gpu", "network", "master", "hostfile", "allreduce", "store", "disk", "deepspeed")


class Status(str, Enum):  # noqa: UP042  (StrEnum would change str() of a member, which reports print)
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class CheckResult:
    """One finding. ``fix`` tells the user what to do; ``data`` holds the measured figures for --json."""

    name: str
    status: Status
    message: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "message": self.message,
            "fix": self.fix,
            "data": self.data,
        }


@dataclass(frozen=True, kw_only=True)
class DoctorConfig:
    """What to check. ``env`` is the launch-relevant environment captured by the caller (MASTER_*, NCCL_*,
    GLOO_*), passed in rather than read deep inside the checks."""

    master_addr: str | None = None
    master_port: int = 29500
    expect_master: bool = False
    hostfile: str | None = None
    backend: str = "auto"
    allreduce_mib: float = 4.0
    timeout_s: float = 60.0
    connect_timeout_s: float = 3.0
    store: str | None = None
    s3: S3Options | None = None  # the resolved s3: settings (required to probe an s3:// store)
    store_probe_mib: float = 8.0
    cache_dir: str = "runs/train/shard-cache"
    checkpoint_dir: str = "runs/train"
    min_free_gib: float = 10.0
    deepspeed_config: str | None = None
    train_config: str | None = None
    world_size: int | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port must be in 1..65535, got {self.master_port}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"backend must be auto, gloo or nccl, got {self.backend!r}")
        for name in ("allreduce_mib", "timeout_s", "connect_timeout_s", "store_probe_mib"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.min_free_gib < 0:
            raise ValueError(f"min_free_gib must be >= 0, got {self.min_free_gib}")
        unknown = sorted((set(self.only) | set(self.skip)) - set(CHECK_NAMES))
        if unknown:
            raise ValueError(f"only/skip name unknown checks {unknown}; known: {', '.join(CHECK_NAMES)}")
        if self.world_size is not None and self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> DoctorConfig:
        """Defaults from the launch environment (MASTER_ADDR, MASTER_PORT, NCCL_*/GLOO_*); overrides win."""
        env = {k: v for k, v in environ.items() if k.startswith(("MASTER_", "NCCL_", "GLOO_", "AWS_"))}
        kwargs: dict[str, Any] = {"env": env, "master_addr": environ.get("MASTER_ADDR") or None}
        if environ.get("MASTER_PORT"):
            try:
                kwargs["master_port"] = int(environ["MASTER_PORT"])
            except ValueError:
                raise ValueError(
                    f"MASTER_PORT must be a port number, got {environ['MASTER_PORT']!r}"
                ) from None
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kwargs)
