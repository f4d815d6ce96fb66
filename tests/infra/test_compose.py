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


def test_ports_are_published_on_localhost_unless_opted_in(compose: dict) -> None:
    published = {}
    for name, svc in compose["services"].items():
        for spec in svc.get("ports", []):
            addr, host, container = interpolate(str(spec), SECRETS_FILLED).rsplit(":", 2)
            assert addr == "127.0.0.1", f"{name}: port {spec!r} is published on {addr!r}, not 127.0.0.1"
            assert host.isdigit() and container.isdigit(), f"{name}: bad port spec {spec!r}"
            assert host not in published, f"host port {host} published twice ({published.get(host)}, {name})"
            published[host] = name
            opted_in = interpolate(str(spec), SECRETS_FILLED | {"PILEWORKS_PUBLISH_ADDR": "0.0.0.0"})
            assert opted_in.startswith("0.0.0.0:"), f"{name}: {spec!r} ignores PILEWORKS_PUBLISH_ADDR"
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


def test_secrets_are_required_and_have_no_working_defaults(compose: dict) -> None:
    raw = (INFRA / "compose.yaml").read_text()
    text = "\n".join(
        line for line in raw.splitlines() if not line.lstrip().startswith("#")
    )  # as compose reads it
    example = _env_file(INFRA / ".env.example")
    for secret in SECRETS:
        uses = re.findall(r"\$\{" + secret + r"(:?[-?][^}]*)?\}", text)
        assert uses and all(u.startswith(":?") for u in uses), (
            f"{secret} must be ${{{secret}:?...}} everywhere"
        )
        assert example[secret] == "", f".env.example must not hold a working {secret}"
    assert not any("env_file" in svc for svc in compose["services"].values()), (
        "no env file with example values"
    )
    for secret in SECRETS:  # with the example as it stands (or any one secret left empty) compose stops
        with pytest.raises(ValueError, match=f"set {secret} "):
            interpolate(text, example | {k: v for k, v in SECRETS_FILLED.items() if k != secret})
    interpolate(text, example | SECRETS_FILLED)  # filled in: everything resolves
    documented = set(example)
    used = set(re.findall(r"(?<!\$)\$\{([A-Z][A-Z0-9_]*)", text))
    assert used <= documented, f".env.example does not document {used - documented}"
    assert not (INFRA / ".env").exists() or ".env" in (INFRA / "Dockerfile.dockerignore").read_text()


def test_commands_use_only_variables_their_service_sets(compose: dict) -> None:
    for name, svc in compose["services"].items():
        command = svc.get("command") or []
        text = " ".join(command) if isinstance(command, list) else command
        missing = set(re.findall(r"\$\$\{?([A-Z][A-Z0-9_]*)", text)) - set(svc.get("environment") or {})
        assert not missing, f"{name}: command uses {missing}, which its environment does not set"


def test_prefect_api_auth_on_the_server_and_every_client(compose: dict) -> None:
    services = compose["services"]
    server = services["prefect-server"]["environment"]
    assert server["PREFECT_SERVER_API_AUTH_STRING"].startswith("${PREFECT_API_AUTH_STRING:?")
    assert "PREFECT_SERVER_API_AUTH_STRING" in " ".join(services["prefect-server"]["healthcheck"]["test"])
    clients = [n for n, svc in services.items() if "PREFECT_API_URL" in (svc.get("environment") or {})]
    assert {"worker", "trainer"} <= set(clients)
    for name in clients:
        assert services[name]["environment"]["PREFECT_API_AUTH_STRING"].startswith(
            "${PREFECT_API_AUTH_STRING:?"
        )


def test_prefect_server_runs_the_prefect_the_image_installs(compose: dict) -> None:
    from packaging.specifiers import SpecifierSet

    tag = compose["services"]["prefect-server"]["image"].rsplit(":", 1)[1]
    server_version = tag.split("-")[0]
    dockerfile = (INFRA / "Dockerfile").read_text()
    pinned = re.search(r"^ARG PILEWORKS_PREFECT_VERSION=(\S+)$", dockerfile, flags=re.M)
    assert pinned and pinned.group(1) == server_version, (server_version, pinned and pinned.group(1))
    assert "PIP_CONSTRAINT" in dockerfile and "prefect==%s" in dockerfile  # the pin reaches pip
    spec = re.search(r'^\s*"prefect([<>=!~][^"]*)"', (ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert spec and server_version in SpecifierSet(spec.group(1)), spec and spec.group(1)


SECRETS = ("MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD", "PREFECT_API_AUTH_STRING")
SECRETS_FILLED = {
    "MINIO_ROOT_USER": "u",
    "MINIO_ROOT_PASSWORD": "p" * 12,
    "PREFECT_API_AUTH_STRING": "admin:x",
    "PILEWORKS_BUCKET": "b",
    "PILEWORKS_MANIFEST": "s3://b/m",
}


def _env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable substitution: ``$$`` escapes, ``${V}``, ``${V:-default}``, ``${V:?message}``."""

    def one(m: re.Match) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        value = env.get(name, "")
        if op == ":?" and not value:
            raise ValueError(f"required variable {name} is missing a value: {arg}")
        if op == ":-" and not value:
            return arg
        return value

    parts = text.split("$$")
    return "$".join(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:[-?])([^}]*))?\}", one, p) for p in parts)


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
    runs = " ".join(re.findall(r"^RUN\s+((?:.*\\\n)*.*)$", text, flags=re.M))  # with continuation lines
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
