"""Entry point of one rank: ``python -m training.train --manifest URI --config train.yaml`` under a launcher.

Run under ``deepspeed`` or ``torchrun`` (see :mod:`training.launch`); alone it runs as a single rank. Training
resumes automatically from the newest complete checkpoint in ``<output_dir>/checkpoints``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pipeline.config import parse_overrides
from pipeline.dataset.manifest import Manifest, load_manifest
from pipeline.errors import CheckpointError
from pipeline.storage import ObjectStore, open_store, sha256_bytes
from training.blend import BlendedDistributedSampler, blend_sources, epoch_order, source_tokens
from training.cache import ShardCache
from training.checkpoint import load_checkpoint, save_checkpoint, upload_checkpoint
from training.config import TrainConfig, load_train_config
from training.data import ShardDataset, build_dataloader, check_ranks_agree, preflight_steps
from training.engine import (
    DistInfo,
    build_engine,
    evaluate,
    init_distributed,
    reduce_step,
    train_step,
)
from training.hf_init import check_dataset_tokenizer, load_hf_model
from training.metrics import GpuMonitor, MetricsWriter, StepClock, peak_flops
from training.model import GPT, count_params, flops_per_token, model_config_from_preset
from training.preempt import EXIT_STOPPED, StopFlag
from training.ranklog import setup_rank_logging
from training.resume import ResumeState, parse_allowed
from training.sampler import ResumableDistributedSampler

FLOW_RUN_ENV = "PILEWORKS_FLOW_RUN_ID"  # set by the Prefect train flow; recorded in checkpoints
logger = logging.getLogger("training.train")

EXIT_USER_ERROR = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.train", description=__doc__)
    parser.add_argument(
        "--manifest",
        required=True,
        help="manifest URI (a local path, file://, s3://, gs://, az:// or abfs[s]://)",
    )
    parser.add_argument("--config", default=None, help="TrainConfig YAML/JSON (defaults when left out)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field (VALUE is read as YAML); repeatable",
    )
    parser.add_argument(
        "--allow-dataset-change",
        action="store_true",
        help="resume a checkpoint that was trained on another dataset id (the data restarts at epoch 0)",
    )
    parser.add_argument(
        "--allow-change",
        action="append",
        default=[],
        metavar="FIELD[,FIELD]",
        help="resume although these checkpoint fields differ (seed, seq_len, samples_per_epoch, world_size, "
        "micro_batch, grad_accum, ...); repeatable",
    )
    parser.add_argument(
        "--stop-at-step",
        type=int,
        default=None,
        help="checkpoint and stop at this step (the LR schedule still runs to max_steps)",
    )
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


@dataclass
class Progress:
    """Where the run is: completed optimizer steps and the data position (global sample counts)."""

    step: int = 0
    epoch: int = 0
    consumed_in_epoch: int = 0
    consumed_samples: int = 0


@dataclass
class Run:
    cfg: TrainConfig
    info: DistInfo
    manifest: Manifest
    manifest_uri: str
    engine: Any
    model_cfg: Any
    sampler: ResumableDistributedSampler
    loader: Any
    valid_loader: Any
    metrics: MetricsWriter
    tokenizer_files: dict[str, bytes]  # tokenizer.json and its HF companions, copied into every checkpoint
    progress: Progress
    grad_accum: int

    @property
    def ckpt_dir(self) -> Path:
        return Path(self.cfg.output_dir) / "checkpoints"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_data(cfg: TrainConfig, manifest: Manifest, store: ObjectStore, info: DistInfo) -> tuple[Any, ...]:
    cache = ShardCache(store, cfg.cache_dir or Path(cfg.output_dir) / "shard-cache", cfg.cache_max_bytes)
    train_ds = ShardDataset(manifest, store, cfg.seq_len, "train", cache)
    blend = blend_sources(manifest.mixture, cfg.seq_len, cfg.blend)
    sampler = (
        BlendedDistributedSampler(
            blend, len(train_ds), num_replicas=info.world_size, rank=info.rank, seed=cfg.seed
        )
        if blend
        else ResumableDistributedSampler(
            len(train_ds), num_replicas=info.world_size, rank=info.rank, seed=cfg.seed
        )
    )
    if blend:
        logger.info(
            "blending %d sources by target share: %s",
            len(blend),
            ", ".join(f"{s.name} {s.share:.1%} ({s.count} samples)" for s in blend),
        )
    loader = build_dataloader(train_ds, sampler, cfg.micro_batch_size, num_workers=cfg.num_workers)
    valid_loader = None
    if cfg.eval_batches and manifest.split_shards("valid"):
        try:
            valid_ds = ShardDataset(manifest, store, cfg.seq_len, "valid", cache)
        except ValueError as exc:
            logger.warning("evaluation disabled: %s", exc)
        else:
            valid_sampler = ResumableDistributedSampler(
                len(valid_ds), num_replicas=info.world_size, rank=info.rank, seed=cfg.seed, shuffle=False
            )
            if len(valid_sampler) >= cfg.micro_batch_size:
                valid_loader = build_dataloader(valid_ds, valid_sampler, cfg.micro_batch_size, num_workers=0)
            else:
                logger.warning("evaluation disabled: the valid split has fewer samples per rank than a batch")
    return train_ds, sampler, loader, valid_loader


def check_equal_steps(
    n_samples: int,
    sampler: ResumableDistributedSampler,
    cfg: TrainConfig,
    info: DistInfo,
    grad_accum: int,
    dataset: tuple[str, str],
) -> int:
    """Preflight: all ranks report their dataset (id, tokenizer sha256) and epoch length; refuse to start if
    they read different datasets or their step counts would differ."""
    reports: list[Any] = [(dataset, len(sampler))]
    if dist.is_initialized() and info.world_size > 1:
        reports = [None] * info.world_size
        dist.all_gather_object(reports, (dataset, len(sampler)))
    check_ranks_agree([r[0] for r in reports], what="dataset (id, tokenizer sha256)")
    return preflight_steps(
        n_samples,
        info.world_size,
        cfg.micro_batch_size,
        grad_accum,
        start=0,
        rank_samples=[r[1] for r in reports],
    )


def fetch_tokenizer(manifest: Manifest, store: ObjectStore) -> dict[str, bytes]:
    """``tokenizer.json`` and its Hugging Face companions (``manifest.tokenizer.files``), each verified."""
    keys = {manifest.tokenizer.key: manifest.tokenizer.sha256, **manifest.tokenizer.files}
    files = {}
    for key, sha256 in keys.items():
        data = store.get_bytes(key)
        if sha256_bytes(data) != sha256:
            raise ValueError(f"{store.uri_of(key)} does not match the manifest's sha256")
        files["tokenizer.json" if key == manifest.tokenizer.key else key.rsplit("/", 1)[-1]] = data
    return files


def build_model(cfg: TrainConfig, manifest: Manifest, store: ObjectStore) -> GPT:
    """The preset's model with random weights (the same on every rank), or ``init_from``'s, which must share
    the dataset's tokenizer; with ``attention`` and ``activation_checkpointing`` applied."""
    tk = manifest.tokenizer
    init = None
    if cfg.init_from:
        init = load_hf_model(cfg.init_from, cfg.s3)
        check_dataset_tokenizer(init, cfg.init_from, tk, store.get_bytes(tk.key))
        if cfg.seq_len > init.config.max_seq_len:
            raise ValueError(
                f"seq_len {cfg.seq_len} exceeds init_from's max_position_embeddings {init.config.max_seq_len}"
            )
        model_cfg = init.config
    else:
        model_cfg = model_config_from_preset(
            cfg.preset, vocab_size=tk.vocab_size, max_seq_len=cfg.seq_len, overrides=cfg.model
        )
    if cfg.attention == "document":
        model_cfg = dataclasses.replace(model_cfg, attention="document", eos_id=tk.eos_id)
    seed_everything(cfg.seed)  # identical initial weights on every rank
    model = GPT(model_cfg, activation_checkpointing=cfg.activation_checkpointing)
    if init is not None:
        model.load_state_dict(init.state, strict=True)
    return model


def build_run(args: argparse.Namespace, cfg: TrainConfig, info: DistInfo) -> Run:
    manifest, store = load_manifest(args.manifest, cfg.s3)
    model = build_model(cfg, manifest, store)
    model_cfg = model.cfg
    engine, ds_config = build_engine(model, cfg, info)
    grad_accum = int(ds_config["gradient_accumulation_steps"])
    train_ds, sampler, loader, valid_loader = build_data(cfg, manifest, store, info)
    dataset = (manifest.dataset_id, manifest.tokenizer.sha256)
    steps = check_equal_steps(len(train_ds), sampler, cfg, info, grad_accum, dataset)
    logger.info(
        "model %s: %.2fM parameters; %d train samples of %d tokens, %d steps per epoch; batch %d x %d "
        "accum x %d ranks",
        cfg.init_from or cfg.preset,
        model.num_params() / 1e6,
        len(train_ds),
        cfg.seq_len,
        steps,
        cfg.micro_batch_size,
        grad_accum,
        info.world_size,
    )
    metrics = MetricsWriter(
        cfg.output_dir,
        enabled=info.rank == 0,
        tensorboard=cfg.tensorboard,
        wandb=cfg.wandb,
        wandb_project=cfg.wandb_project,
        wandb_mode=cfg.wandb_mode,
        run_config=cfg.to_dict(),
    )
    return Run(
        cfg=cfg,
        info=info,
        manifest=manifest,
        manifest_uri=args.manifest,
        engine=engine,
        model_cfg=model_cfg,
        sampler=sampler,
        loader=loader,
        valid_loader=valid_loader,
        metrics=metrics,
        tokenizer_files=fetch_tokenizer(manifest, store),
        progress=Progress(),
        grad_accum=grad_accum,
    )


def resume_state(run: Run) -> ResumeState:
    """What the data order of this run depends on, at its current position."""
    return ResumeState(
        dataset_id=run.manifest.dataset_id,
        tokenizer_sha256=run.manifest.tokenizer.sha256,
        seed=run.cfg.seed,
        shuffle=bool(run.sampler.shuffle),
        seq_len=run.cfg.seq_len,
        samples_per_epoch=run.sampler.n,
        world_size=run.info.world_size,
        micro_batch=run.cfg.micro_batch_size,
        grad_accum=run.grad_accum,
        epoch=run.progress.epoch,
        consumed_in_epoch=run.progress.consumed_in_epoch,
    )


def resume(run: Run, allowed: frozenset[str]) -> int | None:
    loaded = load_checkpoint(run.engine, run.ckpt_dir, expected=resume_state(run), allowed=allowed)
    if loaded is None:
        logger.info("no complete checkpoint in %s: starting from step 0", run.ckpt_dir)
        return None
    state, record, decision = loaded
    p = run.progress
    p.step = int(state["step"])
    p.consumed_samples = int(state["consumed_samples"])
    if decision.continue_order:
        p.epoch, p.consumed_in_epoch = int(state["epoch"]), int(state["consumed_in_epoch"])
    if int(run.engine.global_steps) != p.step:
        raise CheckpointError(f"engine step {run.engine.global_steps} != checkpoint step {p.step}")
    return int(record["step"])


def batch_stream(run: Run):
    """Micro batches across epoch boundaries, advancing ``run.progress``'s data position as each is taken."""
    p, per_batch = run.progress, run.cfg.micro_batch_size * run.info.world_size
    while True:
        run.sampler.set_epoch(p.epoch)
        run.sampler.set_start(p.consumed_in_epoch)
        for batch in run.loader:
            p.consumed_in_epoch += per_batch
            p.consumed_samples += per_batch
            yield batch
        p.epoch, p.consumed_in_epoch = p.epoch + 1, 0


def checkpoint(run: Run, uploads: list[threading.Thread]) -> None:
    p, t0 = run.progress, time.perf_counter()
    state = resume_state(run).to_dict()
    client_state = {
        **dataclasses.asdict(p),
        "seed": run.cfg.seed,
        "dataset_id": run.manifest.dataset_id,
        "resume_state": state,
        "config": run.cfg.to_dict(),
    }
    meta = {
        "dataset_id": run.manifest.dataset_id,
        "resume_state": state,  # readable before anything is unpickled: resume checks it first
        "tokenizer": {  # the export and evaluation read the special ids from here
            "sha256": run.manifest.tokenizer.sha256,
            "vocab_size": run.manifest.tokenizer.vocab_size,
            "eos_id": run.manifest.tokenizer.eos_id,
            "pad_id": run.manifest.tokenizer.pad_id,
            "bos_id": run.manifest.tokenizer.bos_id,
        },
        "manifest_uri": run.manifest_uri,
        "world_size": run.info.world_size,
        "zero_stage": run.cfg.zero_stage,
        "model_config": dataclasses.asdict(run.model_cfg),
        "progress": dataclasses.asdict(p),
        "train_config": run.cfg.to_dict(),
        # Lineage: the Prefect flow run that trained this (set by flows/train/flow.py) and the dataset's own lineage.
        "lineage": {
            "prefect_flow_run_id": os.environ.get(FLOW_RUN_ENV) or None,
            "dataset": run.manifest.lineage,
        },
    }
    for thread in uploads:
        thread.join()  # an upload must finish before pruning may delete its tag
    uploads.clear()
    tag_dir = save_checkpoint(
        run.engine,
        run.ckpt_dir,
        step=p.step,
        client_state=client_state,
        meta=meta,
        keep_last=run.cfg.keep_last,
        extra_files=run.tokenizer_files,
    )
    seconds = time.perf_counter() - t0
    logger.info("checkpoint %s saved in %.2fs", tag_dir.name, seconds)
    run.metrics.log("checkpoint", step=p.step, tag=tag_dir.name, seconds=seconds)
    if run.cfg.checkpoint_upload_uri and run.info.rank == 0:
        store = open_store(run.cfg.checkpoint_upload_uri, run.cfg.s3)
        thread = threading.Thread(target=upload_checkpoint, args=(tag_dir, store), name="ckpt-upload")
        thread.start()
        uploads.append(thread)


def log_step(
    run: Run, local_loss: float, loss: float, lr: float, timing: dict[str, Any], gpu: GpuMonitor
) -> None:
    p, cfg = run.progress, run.cfg
    # epoch/consumed_in_epoch: the data position after this step, so lineage (training.lineage) can replay
    # the order exactly from any logged step, also after a resume.
    run.metrics.log(
        "train",
        step=p.step,
        loss=loss,
        lr=lr,
        epoch=p.epoch,
        consumed_in_epoch=p.consumed_in_epoch,
        world_size=run.info.world_size,
        **step_source_tokens(run),
        **timing,
        **gpu.sample(),
    )
    if p.step % cfg.log_interval == 0 or p.step == cfg.max_steps:
        mfu = f" mfu {timing['mfu']:.1%}" if timing["mfu"] is not None else ""
        logger.info(
            "step %d/%d loss %.6f (this rank %.6f) lr %.3e | %.0f tok/s %.1f samples/s step %.3fs "
            "data wait %.1f%%%s",
            p.step,
            cfg.max_steps,
            loss,
            local_loss,
            lr,
            timing["tokens_per_s"],
            timing["samples_per_s"],
            timing["step_time_s"],
            100 * timing["data_wait_share"],
            mfu,
        )


def step_source_tokens(run: Run) -> dict[str, Any]:
    """``{"source_tokens": {name: tokens}}`` of the step just taken (blended runs; ``{}`` otherwise)."""
    sampler, p = run.sampler, run.progress
    if not isinstance(sampler, BlendedDistributedSampler):
        return {}
    per_step = run.cfg.micro_batch_size * run.grad_accum * run.info.world_size
    start = max(0, p.consumed_in_epoch - per_step)  # a step that began in the last epoch counts from 0
    order = epoch_order(sampler.sources, sampler.n, seed=sampler.seed, epoch=p.epoch)
    return {"source_tokens": source_tokens(order, start, p.consumed_in_epoch, run.cfg.seq_len)}


def record_samples(run: Run, seen: list[torch.Tensor]) -> None:
    """Append this step's sample ids (in the order this rank trained on them) and clear ``seen``."""
    path = Path(run.cfg.output_dir) / "samples" / f"rank-{run.info.rank:05d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    indices = torch.cat(seen).tolist()
    seen.clear()
    line = {"step": run.progress.step, "rank": run.info.rank, "world_size": run.info.world_size}
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({**line, "indices": indices}) + "\n")


def maybe_evaluate(run: Run) -> None:
    p, cfg = run.progress, run.cfg
    if run.valid_loader is None or not (p.step % cfg.eval_interval == 0 or p.step == cfg.max_steps):
        return
    loss, batches = evaluate(
        run.engine, run.valid_loader, max_batches=cfg.eval_batches, device=run.info.device
    )
    logger.info("step %d eval loss %.6f over %d batches per rank", p.step, loss, batches)
    run.metrics.log("eval", step=p.step, loss=loss, batches=batches)


def train_loop(run: Run, stop_at: int, stop: StopFlag) -> bool:
    """Train to ``stop_at``; True when the ranks stopped earlier on a SIGTERM (``training.preempt``), their
    checkpoint of the last step saved."""
    cfg, info, p = run.cfg, run.info, run.progress
    clock = StepClock(
        tokens_per_step=cfg.seq_len * cfg.micro_batch_size * run.grad_accum * info.world_size,
        samples_per_step=cfg.micro_batch_size * run.grad_accum * info.world_size,
        flops_per_token=flops_per_token(run.model_cfg, cfg.seq_len),
        world_size=info.world_size,
        peak_flops_per_device=None if info.on_cpu else peak_flops(torch.cuda.get_device_name()),
    )
    gpu, batches = GpuMonitor(), batch_stream(run)
    uploads: list[threading.Thread] = []
    last_saved = p.step
    stopping = False
    seen: list[torch.Tensor] | None = [] if cfg.record_samples else None
    while p.step < stop_at and not stopping:
        clock.start_step()
        lr = float(run.engine.get_lr()[0])  # the rate this step uses; the schedule advances inside the step
        local = train_step(
            run.engine, batches, grad_accum=run.grad_accum, device=info.device, clock=clock, seen=seen
        )
        # any rank's SIGTERM, known to every rank after this same step
        loss, stopping = reduce_step(local, stopping=stop.received)
        timing = clock.finish_step()
        p.step += 1
        if seen is not None:
            record_samples(run, seen)
        log_step(run, float(local), loss, lr, timing, gpu)
        if stopping:  # the time left before the scheduler's SIGKILL goes to the checkpoint, not an evaluation
            logger.info("%s: stopping after step %d; saving its checkpoint", stop.said(), p.step)
        else:
            maybe_evaluate(run)
        if stopping or p.step % cfg.checkpoint_interval == 0 or p.step == stop_at:
            checkpoint(run, uploads)
            last_saved = p.step
    if last_saved != p.step:
        checkpoint(run, uploads)
    for thread in uploads:
        thread.join()
    return stopping


def run_training(
    args: argparse.Namespace, cfg: TrainConfig, info: DistInfo, stop: StopFlag | None = None
) -> int:
    """Train; 0 when done, :data:`~training.preempt.EXIT_STOPPED` when a SIGTERM stopped it (checkpoint saved)."""
    stop = stop or StopFlag()
    run = build_run(args, cfg, info)
    allowed = parse_allowed(args.allow_change, allow_dataset_change=args.allow_dataset_change)
    resumed_from = resume(run, allowed)
    stop_at = cfg.max_steps if args.stop_at_step is None else min(cfg.max_steps, args.stop_at_step)
    run.metrics.log(
        "start",
        world_size=info.world_size,
        params=count_params(run.model_cfg),
        flops_per_token=flops_per_token(run.model_cfg, cfg.seq_len),
        seq_len=cfg.seq_len,
        global_batch_size=cfg.micro_batch_size * run.grad_accum * info.world_size,
        resumed_from=resumed_from,
        config=cfg.to_dict(),
    )
    t0 = time.perf_counter()
    if stop_at == 0 and resumed_from is None:
        # Step 0 saved as is: a run from released weights exports them unchanged (the round trip's check).
        uploads: list[threading.Thread] = []
        checkpoint(run, uploads)
        for thread in uploads:
            thread.join()
    elif run.progress.step >= stop_at:
        logger.info("already at step %d (stop at %d): nothing to train", run.progress.step, stop_at)
    elif train_loop(run, stop_at, stop):
        name = stop.said()
        run.metrics.log("stop", step=run.progress.step, signal=name, seconds=time.perf_counter() - t0)
        run.metrics.close()
        logger.info(
            "stopped by %s at step %d of %d: its checkpoint is saved, and a rerun resumes from it",
            name,
            run.progress.step,
            stop_at,
        )
        return EXIT_STOPPED
    run.metrics.log("end", step=run.progress.step, seconds=time.perf_counter() - t0)
    run.metrics.close()
    logger.info("done at step %d in %.1fs", run.progress.step, time.perf_counter() - t0)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_rank_logging(int(os.environ.get("RANK", "0")))
    try:
        cfg = load_train_config(args.config, parse_overrides(args.set))
    except (ValueError, FileNotFoundError) as exc:
        logger.error("bad training config: %s", exc)
        return EXIT_USER_ERROR
    # Before the process group and the data: a SIGTERM during the start is kept for after the first step.
    stop = StopFlag().install() if cfg.checkpoint_on_sigterm else StopFlag()
    info = init_distributed(cfg.pg_timeout_s)
    setup_rank_logging(info.rank)  # again: importing deepspeed installed its own unprefixed handler
    logger.info(
        "pid %d, rank %d of %d, local rank %d, %s, attempt %s",
        os.getpid(),
        info.rank,
        info.world_size,
        info.local_rank,
        "cpu/gloo" if info.on_cpu else f"{info.device}/nccl",
        os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
    )
    try:
        code = run_training(args, cfg, info, stop)
    except (CheckpointError, ValueError, FileNotFoundError) as exc:
        logger.error("%s", exc)
        code = EXIT_USER_ERROR
    except Exception:
        logger.exception("training failed")
        code = 1
    if dist.is_initialized():
        if code in (0, EXIT_STOPPED):  # every rank got here: they stopped after the same step
            dist.barrier()
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
