"""pileworks' lighter Prefect task-run bookkeeping (``flows.runners.lighter_task_runs``): the settings context
serialised once per settings and validated once per serialised form, one verifying TLS context per CA file
for Prefect's API clients; same values as Prefect's own path, and an environment switch that leaves Prefect
as it is. (That task runs in Dask workers report to the flow's API with it on is ``test_dask``'s build.)"""

from __future__ import annotations

import copy
import os
import ssl
import subprocess
import sys
from typing import Any

import certifi
import pytest
from prefect.context import SettingsContext
from prefect.settings import (
    PREFECT_API_SSL_CERT_FILE,
    PREFECT_API_TLS_INSECURE_SKIP_VERIFY,
    PREFECT_API_URL,
    temporary_settings,
)

from flows import runners


def test_settings_context_is_serialised_once_and_validated_once() -> None:
    runners.lighter_task_runs()
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        ctx = SettingsContext.get()
        first = ctx.serialize()
        assert ctx.serialize() is first  # the same context: its serialised form once
        with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:10/api"}):
            other = SettingsContext.get().serialize()
        assert other is not first and other["settings"]["api"]["url"] == "http://127.0.0.1:10/api"
    assert first["settings"]["api"]["url"] == "http://127.0.0.1:9/api"

    # a worker rebuilding contexts from the serialised form: validated once, then the same objects reused,
    # with exactly the values Prefect's own validation gives
    one, two = SettingsContext(**copy.deepcopy(first)), SettingsContext(**copy.deepcopy(first))
    reference = SettingsContext.model_validate(copy.deepcopy(first))
    assert one is not two and two.settings is one.settings and two.profile is one.profile
    assert one.settings == reference.settings and one.profile == reference.profile
    assert str(one.settings.api.url) == "http://127.0.0.1:9/api"
    third = SettingsContext(**copy.deepcopy(other))  # another serialised form: validated on its own
    assert third.settings is not one.settings and str(third.settings.api.url) == "http://127.0.0.1:10/api"
    # contexts built from objects are left to pydantic as before
    assert SettingsContext(profile=one.profile, settings=third.settings).settings is third.settings


def test_prefect_clients_share_one_verifying_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    import prefect.client.orchestration as orchestration
    from prefect.client.orchestration import SyncPrefectClient

    runners.lighter_task_runs()
    assert isinstance(orchestration.ssl, runners._SharedTls)
    made: list[Any] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    monkeypatch.setattr(orchestration.ssl, "contexts", {})
    clients = [SyncPrefectClient("http://127.0.0.1:9/api") for _ in range(3)]
    cafile = PREFECT_API_SSL_CERT_FILE.value() or certifi.where()
    assert made == [{"cafile": cafile}]  # three clients, one context parsed from the CA bundle
    shared = orchestration.ssl.contexts[cafile]
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname

    with temporary_settings({PREFECT_API_TLS_INSECURE_SKIP_VERIFY: True}):
        clients.append(SyncPrefectClient("http://127.0.0.1:9/api"))
        clients.append(SyncPrefectClient("http://127.0.0.1:9/api"))
    assert made[1:] == [{}, {}]  # the insecure context, which Prefect edits, is still made fresh each time
    # and the shared one is untouched
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname
    for client in clients:
        client._client.close()


def test_the_switch_leaves_prefect_as_it_is() -> None:
    code = (
        "import prefect.client.orchestration as o; from prefect.context import SettingsContext as S; "
        "from flows import runners; runners.lighter_task_runs(); "
        "print(type(o.ssl).__name__, getattr(S.serialize, 'pileworks', False))"
    )
    env = os.environ | {"PILEWORKS_PREFECT_PATCHES": "0", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["module", "False"]
