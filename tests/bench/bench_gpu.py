"""GPU training benchmark: the ``125m`` preset, bf16, seq_len 2048, through the real training path.

One command on a CUDA machine::

    .venv/bin/python tests/bench/bench_gpu.py [--micro-batch 16] [--steps 40] [--no-compile] [--json out.json]
        [--activation-checkpointing]

It writes a random-token dataset in the published shard format (pipeline.dataset.shards' ShardWriter + a manifest),
then trains one rank with the same pieces ``training.train`` uses (DeepSpeed engine, ShardDataset, the
resumable sampler, the DataLoader with workers and shard prefetch) and reports, over the steps after warm-up:
tokens/s, MFU (``flops_per_token`` x tokens/s / the GPU's dense bf16 peak), the data-wait share of step time,
step time and peak GPU memory. Target on an H100/H200: MFU >= 45%, data wait < 2%.

Without a GPU it prints why and exits 0; ``--allow-cpu`` runs a tiny-preset smoke of the same code path.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch
from random_dataset import build_random_dataset

from training.config import TrainConfig
from training.engine import average_across_ranks, build_engine, init_distributed, train_step
from training.metrics import StepClock, peak_flops
from training.model import GPT, flops_per_token, model_config_from_preset
from training.train import build_data

VOCAB = 50_304  # GPT-NeoX's padded vocabulary: a multiple of 128 keeps the LM-head matmul on fast tiles


def measure(args: argparse.Namespace, work: Path, compile_model: bool) -> dict[str, float | str | None]:
    on_gpu = torch.cuda.is_available()
    total_steps = args.warmup + args.steps
    tokens = total_steps * args.micro_batch * args.seq_len + args.seq_len + 1
    manifest, store = build_random_dataset(work / "data", tokens, max(1, tokens // 4), VOCAB)
    cfg = TrainConfig(
        preset=args.preset,
        seq_len=args.seq_len,
        micro_batch_size=args.micro_batch,
        grad_accum_steps=1,
        max_steps=total_steps + 1,
        warmup_steps=min(10, total_steps),
        zero_stage=args.zero_stage,
        precision="bf16",
        compile=compile_model,
        output_dir=str(work / "out"),
        tensorboard=False,
        num_workers=args.workers,
    )
    info = init_distributed(cfg.pg_timeout_s)
    model_cfg = model_config_from_preset(cfg.preset, vocab_size=VOCAB, max_seq_len=cfg.seq_len)
    torch.manual_seed(0)
    model = GPT(model_cfg, activation_checkpointing=args.activation_checkpointing)
    engine, _ = build_engine(model, cfg, info)
    _, _, loader, _ = build_data(cfg, manifest, store, info)
    fpt = flops_per_token(model_cfg, cfg.seq_len)
    peak = peak_flops(torch.cuda.get_device_name()) if on_gpu else None
    clock = StepClock(
        tokens_per_step=cfg.seq_len * cfg.micro_batch_size,
        samples_per_step=cfg.micro_batch_size,
        flops_per_token=fpt,
        world_size=1,
        peak_flops_per_device=peak,
    )
    batches = iter(loader)
    elapsed = wait = 0.0
    loss = float("nan")
    for step in range(total_steps):
        clock.start_step()
        loss = average_across_ranks(
            train_step(engine, batches, grad_accum=1, device=info.device, clock=clock)
        )
        timing = clock.finish_step()  # the loss .item() above synchronises the GPU: the step is complete
        if step >= args.warmup:
            elapsed += timing["step_time_s"]
            wait += timing["data_wait_s"]
        else:
            logging.info("warm-up step %d: %.3fs loss %.3f", step + 1, timing["step_time_s"], loss)
    tokens_per_s = args.steps * cfg.seq_len * cfg.micro_batch_size / elapsed
    return {
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "preset": cfg.preset,
        "params": sum(p.numel() for p in engine.module.parameters()),
        "seq_len": cfg.seq_len,
        "micro_batch": cfg.micro_batch_size,
        "compiled": compile_model and on_gpu,
        "zero_stage": cfg.zero_stage,
        "steps": args.steps,
        "tokens_per_s": tokens_per_s,
        "step_time_s": elapsed / args.steps,
        "data_wait_share": wait / elapsed,
        "mfu": tokens_per_s * fpt / peak if peak else None,
        "peak_flops": peak,
        "gpu_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
        "final_loss": loss,
        "checkpointing": args.activation_checkpointing,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="125m")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=40, help="measured steps (after --warmup)")
    parser.add_argument(
        "--warmup", type=int, default=10, help="untimed steps: compilation, allocator, workers"
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--zero-stage", type=int, default=1)
    parser.add_argument("--no-compile", action="store_true", help="eager mode (default: torch.compile)")
    parser.add_argument("--allow-cpu", action="store_true", help="smoke-run the tiny preset on CPU")
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute each block in backward (less memory)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not torch.cuda.is_available():
        if not args.allow_cpu:
            print(
                "bench_gpu: no CUDA GPU here (torch.cuda.is_available() is False); run it on a GPU machine, "
                "or pass --allow-cpu for a tiny-preset smoke run of the same code path"
            )
            return 0
        args.preset, args.seq_len, args.micro_batch, args.workers = "tiny", 128, 4, 1
        args.steps, args.warmup = min(args.steps, 5), min(args.warmup, 2)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pw-bench-gpu-") as tmp:
        try:
            result = measure(args, Path(tmp), compile_model=not args.no_compile)
        except Exception as exc:  # report a compile failure with figures from eager mode instead of nothing
            if args.no_compile:
                raise
            logging.exception("compiled run failed (%s); measuring eager mode instead", exc)
            result = measure(args, Path(tmp) / "eager", compile_model=False)
    result["wall_s"] = time.perf_counter() - t0
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


def report(r: dict) -> None:
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a (no known peak for this device)"
    print(
        f"\n== bench_gpu: {r['preset']} ({r['params'] / 1e6:.1f}M params) on {r['device']}, bf16, "
        f"seq_len {r['seq_len']}, micro batch {r['micro_batch']}, ZeRO {r['zero_stage']}, "
        f"{'compiled' if r['compiled'] else 'eager'}{', activation checkpointing' if r['checkpointing'] else ''}"
    )
    print(f"tokens/s        {r['tokens_per_s']:,.0f}")
    print(f"MFU             {mfu}   (target >= 45% on H100/H200)")
    print(f"data wait       {r['data_wait_share']:.2%} of step time   (target < 2%)")
    print(f"step time       {r['step_time_s'] * 1e3:.1f} ms over {r['steps']} measured steps")
    if r["gpu_mem_gb"] is not None:
        print(f"peak GPU memory {r['gpu_mem_gb']:.1f} GiB")
    print(f"final loss      {r['final_loss']:.3f}   wall {r['wall_s']:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
