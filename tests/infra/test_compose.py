"""infra/compose.yaml and infra/Dockerfile, checked without a Docker engine: services, ports, volumes, env files,
build paths, pinned images, and that the commands they run exist in this repository."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from flows.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((INFRA / "compose.yaml").read_text())


def _pinned(image: str) -> bool:
    """A release tag or digest: not floating ("latest", a bare major like "3", or no tag at all)."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return (
        bool(name)
        and "/" not in tag
        and tag not in ("latest", "stable", "edge")
        and bool(re.search(r"\d+\.\d+|\d{4}-", tag))
    )


def test_services_present(compose: dict) -> None:
    assert {"prefect-server", "worker", "minio", "trainer"} <= set(compose["services"])


def test_images_are_pinned(compose: dict) -> None:
    for name, svc in compose["services"].items():
        assert "image" in svc, f"{name}: no image"
        if "build" not in svc:
            assert _pinned(svc["image"]), f"{name}: image {svc['image']!r} is not pinned to a release"
    froms = re.findall(r"^FROM\s+(\S+)", (INFRA / "Dockerfile").read_text(), flags=re.M)
    assert froms and all(_pinned(f) for f in froms), froms
    assert not _pinned("minio/minio:latest") and not _pinned("python") and not _pinned("python:3")


def test_ports(compose: dict) -> None:
    published = {}
    for name, svc in compose["services"].items():
        for spec in svc.get("ports", []):
            host, container = str(spec).split(":")
            assert host.isdigit() and container.isdigit(), f"{name}: bad port spec {spec!r}"
            assert host not in published, f"host port {host} published twice ({published.get(host)}, {name})"
            published[host] = name
    assert published == {"4200": "prefect-server", "9000": "minio", "9001": "minio"}


def test_volumes_declared_and_bind_paths_exist(compose: dict) -> None:
    declared = set(compose.get("volumes") or {})
    used = set()
    for name, svc in compose["services"].items():
        for spec in svc.get("volumes", []):
            source = spec.split(":")[0]
            if source.startswith((".", "/")):
                assert (INFRA / source).exists(), f"{name}: bind mount {source} does not exist"
            else:
                assert source in declared, f"{name}: named volume {source!r} not declared at top level"
                used.add(source)
    assert used == declared, f"declared but unused volumes: {declared - used}"


def test_env_files_exist_and_define_what_commands_use(compose: dict) -> None:
    example = (INFRA / ".env.example").read_text()
    defined = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", example, flags=re.M))
    for name, svc in compose["services"].items():
        for entry in svc.get("env_file", []):
            path, required = (
                (entry, True) if isinstance(entry, str) else (entry["path"], entry.get("required", True))
            )
            assert not required or (INFRA / path).is_file(), f"{name}: required env file {path} missing"
        command = svc.get("command") or []
        text = " ".join(command) if isinstance(command, list) else command
        missing = (
            set(re.findall(r"\$\$\{?([A-Z][A-Z0-9_]*)", text)) - defined - set(svc.get("environment") or {})
        )
        assert not missing, f"{name}: command uses {missing}, which .env.example does not define"
    assert "AWS_SECRET_ACCESS_KEY" in defined and "MINIO_ROOT_PASSWORD" in defined
    assert not (INFRA / ".env").exists() or ".env" in (INFRA / "Dockerfile.dockerignore").read_text()


def test_dependencies_and_build_paths(compose: dict) -> None:
    services = compose["services"]
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        for dep, cond in deps.items() if isinstance(deps, dict) else ((d, {}) for d in deps):
            assert dep in services, f"{name} depends on unknown service {dep}"
            condition = cond.get("condition", "service_started")
            assert condition in ("service_started", "service_healthy", "service_completed_successfully")
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], (
                    f"{name} waits for {dep} to be healthy: it has no healthcheck"
                )
        build = svc.get("build")
        if build:
            context = (INFRA / build["context"]).resolve()
            assert context == ROOT, f"{name}: build context should be the repository root"
            assert (context / build["dockerfile"]).is_file()
    assert services["trainer"].get("shm_size"), "DataLoader workers need more than Docker's 64 MB /dev/shm"


def test_dockerfile_builds_with_the_setup_script() -> None:
    text = (INFRA / "Dockerfile").read_text()
    for src in re.findall(r"^COPY\s+(?!--)(\S+)\s+\S+", text, flags=re.M):
        assert (ROOT / src).exists(), f"COPY source {src} missing"
    runs = " ".join(re.findall(r"^RUN\s+(.+)$", text, flags=re.M))
    assert "infra/setup_env.sh" in runs and (INFRA / "setup_env.sh").stat().st_mode & 0o111
    ignore = (INFRA / "Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignore), "the build context must not ship the venv or git history"


def _commands(compose: dict) -> list[list[str]]:
    out = []
    for svc in compose["services"].values():
        command = svc.get("command")
        if not command:
            continue
        if isinstance(command, list) and command[:2] == ["/bin/sh", "-c"]:
            command = command[2]
        if isinstance(command, str):
            for part in re.split(r"&&|;", command):
                out.append(shlex.split(part.replace("$$", "$")))
        else:
            out.append(list(command))
    return out


def test_commands_name_real_entry_points(compose: dict) -> None:
    subcommands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    seen = set()
    for argv in _commands(compose):
        if argv and argv[0] == "pileworks":
            assert argv[1] in subcommands, f"`pileworks {argv[1]}` is not a pileworks subcommand"
            seen.add(argv[1])
        if "-m" in argv:
            module = argv[argv.index("-m") + 1]
            assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), f"module {module} missing"
        for arg in argv:
            if arg.startswith(("training/configs/", "infra/")):
                assert (ROOT / arg).exists(), f"{arg} missing"
    assert "doctor" in seen
