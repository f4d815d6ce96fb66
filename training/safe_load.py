"""Checkpoint loading that cannot run code: ``torch.load(weights_only=True)`` with a short allow-list.

A checkpoint's ``COMPLETE.json`` catches corruption, not tampering: whoever can write the folder can rewrite the
record too. DeepSpeed loads its files with ``weights_only=False`` (a full unpickler, so a planted ``__reduce__``
runs), here every load of model, optimizer and RNG state goes through the restricted unpickler instead:

* our own loads (:func:`safe_load`);
* DeepSpeed's engine, whose loads all go through ``engine.checkpoint_engine``: :func:`install_safe_checkpoint_engine`
  replaces it with :class:`SafeCheckpointEngine` (same saving, restricted loading);
* DeepSpeed's ``zero_to_fp32`` helpers, run under :func:`safe_zero_to_fp32`, which points that module's ``torch``
  at a view of torch whose ``load`` is :func:`safe_load` for the duration of the call.

The allow-list holds only the plain data types DeepSpeed's ZeRO optimizer state pickles by name (an enum, the
loss-scaler's attribute bag, a named tuple); tensors, containers, ``torch.Size`` and dtypes are allowed by torch.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import re
from collections.abc import Iterator
from typing import Any

import torch

from pipeline.errors import CheckpointError


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file holds something the restricted unpickler refuses (code or an unknown type)."""


def allowed_globals() -> list[Any]:
    """The non-torch types DeepSpeed's checkpoints name: found with ``get_unsafe_globals_in_checkpoint`` over
    ZeRO 0/1/2 saves, plus ``set``, which DeepSpeed 0.17's model states hold and which torch allows by itself
    only from 2.5 on (2.4 refused every checkpoint of DeepSpeed 0.17.6 for it). Imported here, not at module
    level: importing deepspeed picks its accelerator."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, fragment_address, set]


@functools.cache
def allow_deepspeed_globals() -> None:
    """Add :func:`allowed_globals` to the weights-only unpickler's list, once per process. This is
    ``add_safe_globals``, which torch has had since 2.4 (our floor), not the ``safe_globals`` block of 2.5+; the
    types are plain data, so leaving them allowed after a load widens nothing that runs code."""
    torch.serialization.add_safe_globals(allowed_globals())


def safe_load(path: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` with ``weights_only=True`` and :func:`allowed_globals`; other keywords (mmap) pass on."""
    kwargs.pop("weights_only", None)
    allow_deepspeed_globals()
    try:
        return torch.load(path, map_location=map_location, weights_only=True, **kwargs)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"{path}: refused by the weights-only loader ({_reason(exc)}); the file holds a type that is not plain "
            "checkpoint data: do not load it with weights_only=False unless you trust who wrote it"
        ) from exc


def _reason(exc: Exception) -> str:
    """The part of torch's long message that names the refused global (``Unsupported global: GLOBAL x``)."""
    text = str(exc)
    match = re.search(r"WeightsUnpickler error: (.*?)(?: was not|\.\s|$)", text, flags=re.M)
    if match:
        return match.group(1).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _torch_engine_class() -> type:
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    return TorchCheckpointEngine


def build_safe_checkpoint_engine(config_params: Any = None) -> Any:
    """A DeepSpeed ``TorchCheckpointEngine`` whose ``load`` is :func:`safe_load` (saving is unchanged)."""

    class SafeCheckpointEngine(_torch_engine_class()):  # type: ignore[misc]
        def load(self, path: str, map_location: Any = None) -> Any:
            return safe_load(path, map_location=map_location)

    return SafeCheckpointEngine(config_params)


def install_safe_checkpoint_engine(engine: Any) -> None:
    """Swap the engine's checkpoint engine for the safe one; refuse engines that are not torch's plain one.

    DeepSpeed builds ``engine.checkpoint_engine`` lazily (first save or load), so build it now if absent.
    """
    current = getattr(engine, "checkpoint_engine", None)
    if current is not None and type(current) is not _torch_engine_class():
        raise RuntimeError(
            f"DeepSpeed uses checkpoint engine {type(current).__name__}; pileworks only knows how to make "
            "TorchCheckpointEngine's loads safe: remove the checkpoint engine setting from the DeepSpeed config"
        )
    engine.checkpoint_engine = build_safe_checkpoint_engine(getattr(engine, "_config", None))


class _TorchWithSafeLoad:
    """torch as seen by one module: every attribute is torch's, except ``load``."""

    load = staticmethod(safe_load)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@contextlib.contextmanager
def safe_zero_to_fp32() -> Iterator[Any]:
    """DeepSpeed's ``zero_to_fp32`` module with its ``torch.load`` calls restricted while the block runs."""
    from deepspeed.utils import zero_to_fp32

    saved = zero_to_fp32.torch
    zero_to_fp32.torch = _TorchWithSafeLoad()
    try:
        yield zero_to_fp32
    finally:
        zero_to_fp32.torch = saved
