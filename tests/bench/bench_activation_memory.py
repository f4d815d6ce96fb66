"""Peak CPU memory of one training forward + backward with and without activation checkpointing.

    .venv/bin/python tests/bench/bench_activation_memory.py [--d-model 512] [--layers 8] [--seq-len 1024]
        [--batch 4]

Each setting runs in a fresh process (so one's allocations cannot hide the other's): it builds the model, takes
the process's peak RSS (``resource.getrusage``'s ``ru_maxrss``), runs the loss forward and backward, and reports
the rise of the peak: activations kept for backward, gradients and the logits. No GPU is needed; the GPU figure
comes from ``bench_gpu.py --activation-checkpointing`` on a machine that has one.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from training.model import GPT, ModelConfig


def one_setting(args: argparse.Namespace) -> dict[str, float]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = ModelConfig(
        vocab_size=8192, n_layer=args.layers, n_head=8, d_model=args.d_model, max_seq_len=args.seq_len
    )
    model = GPT(cfg, activation_checkpointing=args.checkpointing).train()
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"rise_mib": (peak - before) / 1024, "seconds": seconds, "loss": loss.item()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)  # one child's setting
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(one_setting(args)))
        return 0
    shape = ["--d-model", str(args.d_model), "--layers", str(args.layers), "--seq-len", str(args.seq_len)]
    shape += ["--batch", str(args.batch)]
    results = {}
    for checkpointing in (False, True):
        cmd = [sys.executable, __file__, "--child", *shape] + (["--checkpointing"] if checkpointing else [])
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results[checkpointing] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"d_model {args.d_model}, {args.layers} layers, seq_len {args.seq_len}, batch {args.batch}, fp32, CPU"
    )
    for checkpointing, r in results.items():
        name = "activation checkpointing" if checkpointing else "plain"
        print(
            f"{name:25s} peak RSS rise {r['rise_mib']:8.0f} MiB   fwd+bwd {r['seconds']:.2f}s   loss {r['loss']:.6f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
