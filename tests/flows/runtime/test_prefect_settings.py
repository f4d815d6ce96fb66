"""The API URL and home read without Prefect are the ones Prefect itself resolves, or the reader says it cannot
tell (a working-folder file that Prefect reads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.runtime.prefect_settings import quick_settings

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="Python 3.10 always asks Prefect (no tomllib)"
)


def _prefect_says(env: dict[str, str], cwd: Path) -> dict[str, str | None]:
    code = (
        "import json; from prefect.settings import get_current_settings as g; s = g(); "
        "print(json.dumps({'PREFECT_API_URL': s.api.url, 'PREFECT_HOME': str(s.home)}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, check=True
    ).stdout
    return dict(json.loads(out.splitlines()[-1]))


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return env | {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **extra}


def _quick(env: dict[str, str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> dict | None:
    with monkeypatch.context() as m:
        for key in [k for k in os.environ if k.startswith("PREFECT_")]:
            m.delenv(key)
        for key, value in env.items():
            m.setenv(key, value)
        m.chdir(cwd)
        return quick_settings()


def test_the_environment_and_the_active_profile_are_read_as_prefect_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "profiles.toml").write_text(
        'active = "mine"\n[profiles.mine]\nPREFECT_API_URL = "http://127.0.0.1:4321/api"\n'
        '[profiles.other]\nPREFECT_API_URL = "http://127.0.0.1:9999/api"\n'
    )
    cases = [
        _env(home),  # the profile the file makes active
        _env(home, PREFECT_PROFILE="other"),  # the one the environment picks
        _env(home, PREFECT_API_URL="http://127.0.0.1:5555/api"),  # the environment over the profile
    ]
    for env in cases:
        quick = _quick(env, tmp_path, monkeypatch)
        assert quick is not None
        prefect = _prefect_says(env, tmp_path)
        assert quick["PREFECT_API_URL"] == prefect["PREFECT_API_URL"]
        assert str(Path(quick["PREFECT_HOME"]).expanduser()) == prefect["PREFECT_HOME"]


def test_working_folder_files_prefect_reads_make_the_reader_ask_prefect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert _quick(env, tmp_path, monkeypatch) is not None  # a pyproject without [tool.prefect] says nothing
    (tmp_path / "pyproject.toml").write_text('[tool.prefect]\napi.url = "http://127.0.0.1:1/api"\n')
    assert _quick(env, tmp_path, monkeypatch) is None
    (tmp_path / "pyproject.toml").unlink()
    (tmp_path / ".env").write_text("PREFECT_API_URL=http://127.0.0.1:1/api\n")
    assert _quick(env, tmp_path, monkeypatch) is None
    (tmp_path / ".env").unlink()
    assert _quick(env | {"PREFECT_TEST_MODE": "1"}, tmp_path, monkeypatch) is None
