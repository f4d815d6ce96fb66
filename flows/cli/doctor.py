"""``pileworks doctor``: the preflight (PASS/WARN/FAIL with fixes), or ``--during RUN`` for a running job."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator

from flows.cli.s3_flags import add_s3_arguments, resolve_s3


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="preflight checks for training (versions, GPU, master address/port, hostfile, all-reduce, S3, disk)",
        description="Each check prints PASS, WARN or FAIL with the fix; exit status 1 when any check fails. "
        "MASTER_ADDR, MASTER_PORT, NCCL_* and GLOO_* are read from the environment unless given here.",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--master-addr", help="rendezvous host (default: $MASTER_ADDR)")
    p.add_argument("--master-port", type=int, help="rendezvous port (default: $MASTER_PORT or 29500)")
    p.add_argument(
        "--expect-master",
        action="store_true",
        help="the rendezvous server should already be listening: a closed port is a FAIL",
    )
    p.add_argument(
        "--hostfile", help="DeepSpeed hostfile: every node must resolve and accept passwordless ssh"
    )
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto", help="all-reduce backend")
    p.add_argument("--allreduce-mib", type=float, help="all-reduce buffer size in MiB (default 4)")
    p.add_argument(
        "--timeout", type=float, dest="timeout_s", help="deadline of process checks in s (default 60)"
    )
    p.add_argument(
        "--connect-timeout",
        type=float,
        dest="connect_timeout_s",
        help="deadline of each name lookup and TCP connect in s (default 3)",
    )
    p.add_argument(
        "--store", help="object store to probe: s3://, gs://, az:// bucket/prefix or a local path/file:// URI"
    )
    add_s3_arguments(p)
    p.add_argument("--cache-dir", help="shard cache folder (default runs/train/shard-cache, the trainer's)")
    p.add_argument("--checkpoint-dir", help="checkpoint folder (default runs/train)")
    p.add_argument("--min-free-gib", type=float, help="FAIL below this much free disk (default 10)")
    p.add_argument(
        "--train-config",
        help="TrainConfig YAML: dry-run its DeepSpeed config, check its cache and output folders' disk",
    )
    p.add_argument("--deepspeed-config", help="a raw DeepSpeed JSON/YAML config to dry-run instead")
    p.add_argument(
        "--world-size", type=int, help="ranks the config must fit (default: hostfile slots, else 1)"
    )
    p.add_argument("--only", type=_csv, default=(), help="comma list of checks to run")
    p.add_argument("--skip", type=_csv, default=(), help="comma list of checks to skip")
    p.add_argument(
        "--during",
        metavar="RUN_DIR",
        help="instead of the preflight: read a running job's metrics and advise (GPU use, data wait, comm)",
    )
    p.add_argument("--last", type=int, default=50, help="with --during: steps to summarise (default 50)")
    p.add_argument(
        "--busbw",
        type=float,
        help="with --during: measured bus bandwidth in GB/s, to estimate the "
        "communication share when the trainer does not log it",
    )
    p.set_defaults(func=run)


def _config(args: argparse.Namespace):
    from training.preflight.base import DoctorConfig
    from training.preflight.net import parse_hostfile

    world = args.world_size
    if world is None and args.hostfile and os.path.exists(args.hostfile):
        try:
            with open(args.hostfile) as f:
                world = sum(h.slots for h in parse_hostfile(f.read()))
        except ValueError:
            world = None  # the hostfile check reports the bad line
    fields = (
        "master_addr",
        "master_port",
        "hostfile",
        "allreduce_mib",
        "timeout_s",
        "connect_timeout_s",
        "store",
        "cache_dir",
        "checkpoint_dir",
        "min_free_gib",
        "deepspeed_config",
    )
    overrides = {name: getattr(args, name) for name in fields}
    overrides["s3"] = resolve_s3(args)
    if args.train_config:
        from training.config import load_train_config

        train_cfg = load_train_config(args.train_config)
        overrides["s3"] = resolve_s3(args, train_cfg.s3)  # the flags over the training config's s3: section
        overrides["cache_dir"] = (
            overrides["cache_dir"] or train_cfg.cache_dir or f"{train_cfg.output_dir}/shard-cache"
        )
        overrides["checkpoint_dir"] = overrides["checkpoint_dir"] or train_cfg.output_dir
    return DoctorConfig.from_env(
        os.environ,
        expect_master=args.expect_master,
        backend=args.backend,
        world_size=world,
        train_config=args.train_config,
        only=args.only,
        skip=args.skip,
        **overrides,
    )


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """With --json, stdout carries only the JSON: library banners (DeepSpeed logs to stdout) and the check
    children's output go to stderr, at the file-descriptor level so spawned processes follow."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no real stdout descriptor (embedded use)
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            sys.stderr.flush()
            os.dup2(saved, 1)
            os.close(saved)


def run(args: argparse.Namespace) -> int:
    if args.during:
        from training.monitor import format_report, summarize_run

        report = summarize_run(args.during, last=args.last, busbw_gb_s=args.busbw)
        print(json.dumps(report.to_json(), indent=2) if args.json else format_report(report))
        return 0 if report.steps else 1
    from training.preflight import runner as doctor

    cfg = _config(args)
    if args.json:
        with _stdout_to_stderr():
            results = doctor.run_doctor(cfg)
        print(doctor.to_json(results))
    else:
        results = doctor.run_doctor(cfg, on_result=lambda r: print(doctor.format_result(r), flush=True))
    print(f"doctor: {doctor.summary(results)}", file=sys.stderr)
    return doctor.exit_code(results)
