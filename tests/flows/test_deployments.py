"""Deployments: the served ones and infra/prefect.yaml point at real flows with valid parameters and schedules."""

from __future__ import annotations

import argparse
import importlib
import inspect
from pathlib import Path

import pytest
import yaml
from cronsim import CronSim

ROOT = Path(__file__).resolve().parents[2]


def _flow(entrypoint: str):
    path, name = entrypoint.split(":")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    return getattr(module, name)


def test_prefect_yaml_deployments_are_valid() -> None:
    spec = yaml.safe_load((ROOT / "infra" / "prefect.yaml").read_text())
    names = {d["name"] for d in spec["deployments"]}
    assert names == {"scheduled-rebuild", "one-click"}
    for dep in spec["deployments"]:
        flow = _flow(dep["entrypoint"])
        params = set(inspect.signature(flow.fn).parameters)
        assert set(dep.get("parameters", {})) <= params, f"{dep['name']}: unknown parameters"
        flow.validate_parameters(dep.get("parameters", {}))
        for sched in dep.get("schedules", []):
            CronSim(sched["cron"], __import__("datetime").datetime(2026, 1, 1))  # raises on a bad expression


def test_serve_builds_a_cron_rebuild_and_a_one_click_deployment() -> None:
    from flows.build.flow import build_corpus
    from flows.cli.serve import build_deployments
    from flows.train.flow import prepare_and_train

    args = argparse.Namespace(
        cron="*/30 * * * *",
        timezone="UTC",
        config=None,
        output="/tmp/x",
        train_config=None,
        set=["dedup.near.threshold=0.7", "train.lr=1e-3"],
    )
    rebuild, one_click = build_deployments(args)
    assert rebuild.name == "scheduled-rebuild" and rebuild.parameters["output"] == "/tmp/x"
    assert rebuild.parameters["overrides"] == {"dedup.near.threshold": 0.7}  # one --set feeds both configs
    assert one_click.parameters["train_overrides"] == {"lr": "1e-3"}
    for deployment, flow in ((rebuild, build_corpus), (one_click, prepare_and_train)):
        flow.validate_parameters(deployment.parameters)
    assert rebuild.schedules[0].schedule.cron == "*/30 * * * *"
    assert one_click.name == "one-click" and not one_click.schedules


def test_serve_rejects_a_bad_config_before_serving(tmp_path: Path) -> None:
    from flows.cli.serve import build_deployments

    bad = tmp_path / "bad.yaml"
    bad.write_text("dedup:\n  near:\n    treshold: 0.5\n")
    args = argparse.Namespace(
        cron="0 3 * * *", timezone="UTC", config=str(bad), output=None, train_config=None, set=[]
    )
    with pytest.raises(ValueError, match=r"dedup\.near\.treshold"):
        build_deployments(args)


def test_flow_parameters_are_validated() -> None:
    from flows.build.flow import build_corpus

    with pytest.raises(Exception, match="inputs"):
        build_corpus.validate_parameters({"inputs": 5})
