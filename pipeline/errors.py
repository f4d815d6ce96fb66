"""The ``PileworksError`` family: our own failures, caught by type (never by class-name strings).

Dependency-free, at the bottom of ``pipeline/``, so every floor (``pipeline``, ``training``, ``flows``) and the
command line can raise and catch them without importing torch, prefect or boto3. Each class also derives from
the built-in it used to be (``RuntimeError`` / ``ValueError``), so existing ``except`` clauses keep working.
The messages are written for the user: they name the URI, stage, part or field, and what to do.
"""

from __future__ import annotations


class PileworksError(Exception):
    """Base of every failure pileworks raises on purpose (with an actionable message)."""


class ConfigError(PileworksError, ValueError):
    """A config value is wrong; the message names the file, the dotted field path and what to do."""


class StorageError(PileworksError, RuntimeError):
    """An object-store operation failed (after retries); the message names the URI."""


class PermanentStorageError(StorageError):
    """A store operation that cannot succeed by retrying (no credentials, no such bucket, a bad profile)."""


class RetryBudgetSpent(StorageError):
    """Transient failures for a whole retry budget: ``reason`` says which kind (``connection``, ``throttled``,
    ``server-5xx``), so a caller can tell an unreachable store from a refusal whatever the cloud's SDK."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class AlreadyExistsError(StorageError):
    """A create-only write found the object already there (a racing publisher won)."""


class UnitNotDone(PileworksError, FileNotFoundError, RuntimeError):
    """A step was asked to read a unit (or a folder) whose completion marker is missing: run the step that
    writes it first. Both a ``FileNotFoundError`` and a ``RuntimeError``, as the steps raised one or the other."""


class UnitDamaged(UnitNotDone):
    """A unit's bytes, as its consumer read them, do not match the digest its marker records (bit rot behind an
    unchanged mtime, a half-synced copy). The reader named the file and dropped the marker, so the unit is no
    longer done: rerunning the steps recomputes it (the build flow does, at once). ``key``: the damaged object."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message, key)
        self.key = key

    def __str__(self) -> str:
        return str(self.args[0])


class StageFailed(PileworksError, RuntimeError):
    """A corpus stage failed; the message names the stage and the part so the run page says where to look."""


class CheckpointError(PileworksError, RuntimeError):
    """A checkpoint cannot be used: incomplete, corrupted, or made for another dataset."""


class TrainingFailed(PileworksError, RuntimeError):
    """The training job exited non-zero (or timed out); the message has the exit code and the last lines."""


class UploadAborted(StorageError):
    """A multipart upload was aborted under its writer (S3's ``NoSuchUpload``): retrying the same call cannot
    succeed; the writer starts the upload again."""
