"""Prefect's settings are read through Prefect (``get_current_settings``), so they are whatever Prefect makes of
them, ``PREFECT_TEST_MODE`` however Prefect reads it; and the profile Prefect names as active counts, one it
bundles too (``PREFECT_PROFILE=local`` with no user profiles file). No code of ours parses them."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

OURS_AND_PREFECTS = (
    "import json, prefect.context as c, prefect.settings as s; from flows.runtime import local_server as l; "
    "p, named = s.get_current_settings(), c.get_settings_context().profile; "
    "print(json.dumps({'ours': [l.configured_api_url(), str(l.prefect_home())], "
    "'prefect': [p.api.url, str(p.home)], "
    "'named': [named.name, named.settings.get(s.PREFECT_API_URL)]}))"
)


def _read(home: Path, cwd: Path, **env: str) -> dict[str, list]:
    """The API URL and home as pileworks reads them and as Prefect alone does, in a fresh process."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    base |= {"PREFECT_HOME": str(home), "PYTHONPATH": str(REPO), **env}
    out = subprocess.run(
        [sys.executable, "-c", OURS_AND_PREFECTS],
        env=base,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return dict(json.loads(out.splitlines()[-1]))


def _profiles(home: Path) -> None:
    home.mkdir()
    (home / "profiles.toml").write_text(
        'active = "mine"\n[profiles.mine]\nPREFECT_API_URL = "http://127.0.0.1:4321/api"\n'
    )


def test_the_active_profile_is_read_as_prefect_reads_it(tmp_path: Path) -> None:
    _profiles(tmp_path / "home")
    found = _read(tmp_path / "home", tmp_path)
    assert found["ours"] == found["prefect"] and found["ours"][0] == "http://127.0.0.1:4321/api"
    found = _read(tmp_path / "home", tmp_path, PREFECT_API_URL="http://127.0.0.1:5555/api")
    assert found["ours"] == found["prefect"] and found["ours"][0] == "http://127.0.0.1:5555/api"  # env wins


def test_a_profile_prefect_bundles_counts_without_a_user_profiles_file(tmp_path: Path) -> None:
    """Prefect names ``local`` as the active profile (``prefect config view`` shows its API URL), though its
    settings fall back to its default profile when no user profiles file holds it: pileworks uses the server
    the named profile gives, the environment still over it."""
    found = _read(tmp_path / "empty-home", tmp_path, PREFECT_PROFILE="local")
    assert found["named"] == ["local", "http://127.0.0.1:4200/api"]
    assert found["ours"] == ["http://127.0.0.1:4200/api", found["prefect"][1]]
    found = _read(
        tmp_path / "empty-home", tmp_path, PREFECT_PROFILE="local", PREFECT_API_URL="http://h:1/api"
    )
    assert found["ours"][0] == found["prefect"][0] == "http://h:1/api"
    assert _read(tmp_path / "empty-home", tmp_path)["ours"][0] is None  # Prefect's default profile: no URL


@pytest.mark.parametrize("value", ["1", "true", "True", "yes", "on", "0", "false"])
def test_prefect_test_mode_is_read_as_prefect_reads_it(tmp_path: Path, value: str) -> None:
    """Whatever Prefect makes of the value (in 3.9: any non-empty value skips the profiles file), pileworks
    makes the same; and a test mode Prefect parses as on reads no bundled profile either."""
    _profiles(tmp_path / "home")
    found = _read(tmp_path / "home", tmp_path, PREFECT_TEST_MODE=value)
    assert found["ours"] == found["prefect"]
    if value not in ("0", "false"):
        found = _read(tmp_path / "empty-home", tmp_path, PREFECT_TEST_MODE=value, PREFECT_PROFILE="local")
        assert found["ours"] == found["prefect"]


def test_no_code_of_ours_reads_prefects_variables_itself() -> None:
    """Prefect's settings are Prefect's to resolve: no code of ours names PREFECT_TEST_MODE, PREFECT_PROFILE or
    the profiles file as a value (to read them itself)."""
    names = {"PREFECT_TEST_MODE", "PREFECT_PROFILE", "PREFECT_PROFILES_PATH", "profiles.toml"}
    readers = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for room in ("flows", "pipeline", "training")
        for path in (REPO / room).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in names
    ]
    assert readers == []
