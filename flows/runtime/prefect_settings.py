"""The few Prefect settings a command needs before it runs a flow (the API URL, the UI URL, ``PREFECT_HOME``),
read without importing Prefect when that is safe.

``import prefect`` costs about 1.2 CPU-s, most of a rebuild that finds its dataset published. Prefect resolves a
setting from, highest first: the environment, ``.env``, ``prefect.toml`` and ``[tool.prefect]`` of
``pyproject.toml`` in the working folder, then the active profile of ``profiles.toml``. :func:`setting` reads the
environment and the profile itself when none of the working-folder files can take part (none exists or names
Prefect) and Prefect is not in test mode; otherwise, or once Prefect is imported anyway (its in-process
temporary settings then count), it asks Prefect.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (
    3,
    11,
):  # Python 3.10: no TOML reader in the standard library, Prefect reads the files
    import tomllib

# setting -> (environment variable and profile key, attribute path in Prefect's settings object)
SETTINGS = {
    "api_url": ("PREFECT_API_URL", ("api", "url")),
    "ui_url": ("PREFECT_UI_URL", ("ui_url",)),
    "home": ("PREFECT_HOME", ("home",)),
}
DEFAULT_HOME = "~/.prefect"


def setting(name: str) -> str | None:
    """The value Prefect would use for ``name`` (a key of :data:`SETTINGS`; "" counts as unset)."""
    env, path = SETTINGS[name]
    quick = None if "prefect.settings" in sys.modules else quick_settings()
    if quick is None:
        return prefect_setting(path)
    value = quick.get(env)
    if name == "home" and not value:
        value = DEFAULT_HOME
    return str(value) if value else None


def prefect_setting(path: tuple[str, ...]) -> str | None:
    from prefect.settings import get_current_settings

    value: Any = get_current_settings()
    for attr in path:
        value = getattr(value, attr)
    return str(value) if value else None


def quick_settings() -> dict[str, Any] | None:
    """The environment over the active profile, for the variables of :data:`SETTINGS`; None when another source
    may set Prefect's settings (ask Prefect)."""
    if sys.version_info < (3, 11) or os.environ.get("PREFECT_TEST_MODE", "").lower() in ("1", "true"):
        return None
    if not working_folder_silent():
        return None
    profile = active_profile()
    if profile is None:
        return None
    out = {env: profile.get(env) for env, _ in SETTINGS.values()}
    out.update({env: os.environ[env] for env, _ in SETTINGS.values() if env in os.environ})
    return out


def working_folder_silent() -> bool:
    """No ``.env`` or ``prefect.toml`` here, and no ``[tool.prefect]`` in ``pyproject.toml``."""
    if Path(".env").exists() or Path("prefect.toml").exists():
        return False
    try:
        with open("pyproject.toml", "rb") as f:
            return "prefect" not in tomllib.load(f).get("tool", {})
    except FileNotFoundError:
        return True
    except (OSError, tomllib.TOMLDecodeError):
        return False


def active_profile() -> dict[str, Any] | None:
    """The active profile's settings ({} for Prefect's default profile, which sets none of ours); None when the
    profiles file cannot be read."""
    home = os.environ.get("PREFECT_HOME")
    if os.environ.get("PREFECT_PROFILES_PATH"):
        path = Path(os.environ["PREFECT_PROFILES_PATH"])
    else:
        path = Path(home or DEFAULT_HOME).expanduser() / "profiles.toml"
    try:
        with path.open("rb") as f:
            profiles = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active")
    found = profiles.get("profiles", {}).get(active)
    return dict(found) if isinstance(found, dict) else {}
