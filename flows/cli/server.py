"""``pileworks server start|stop|status``: the local Prefect server that flow commands start and reuse."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "server",
        help="start, stop or show the local Prefect server (the UI) that flow commands use",
        description="Flow commands start a local Prefect server in the background on first use (SQLite under "
        "PREFECT_HOME) and reuse it, so runs persist and the UI is one URL away; such a server stops itself after "
        "PILEWORKS_SERVER_IDLE_MINUTES (default 30) without API use. `server start` keeps it up until `server "
        "stop`. Either stops once its PREFECT_HOME folder is deleted. PREFECT_API_URL (the environment's or a "
        "Prefect profile's), when set, wins over it.",
    )
    p.add_argument("action", choices=("start", "stop", "status"), help="what to do with the server")
    p.add_argument("--json", action="store_true", help="print the server's state as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from flows.runtime.local_server import configured_api_url, server_status, start_server, stop_server

    if args.action == "start":
        state = start_server(on_wait=logging.getLogger("pileworks").info, idle_s=0)  # up until `server stop`
        out = {"running": True, "ui_url": state.url, "api_url": state.api_url, "pid": state.pid}
        line = (
            f"Prefect server running: UI {state.url} (pid {state.pid}); stop it with `pileworks server stop`"
        )
    elif args.action == "stop":
        stopped = stop_server()
        out = {"running": False, "stopped_pid": stopped.pid if stopped else None}
        line = (
            f"stopped the Prefect server at {stopped.url}"
            if stopped
            else "no local Prefect server was running"
        )
    else:
        found, ok = server_status()
        out = {"running": ok, "ui_url": found.url if found else None, "pid": found.pid if found else None}
        out["idle_stop_s"] = found.idle_stop_s if found else None
        line = (
            f"Prefect server running: UI {found.url} (pid {found.pid}); {stops(found.idle_stop_s)}"
            if found and ok
            else "no local Prefect server runs; flow commands start one (or `pileworks server start`)"
        )
    configured = configured_api_url()
    if configured:
        out["PREFECT_API_URL"] = configured
        line += f"\nnote: PREFECT_API_URL={configured} is set, so flow commands use that server instead"
    print(json.dumps(out) if args.json else line)
    return 0


def stops(idle_stop_s: float) -> str:
    """How the server ends, as the commands say it."""
    if not idle_stop_s:
        return "it runs until `pileworks server stop`"
    return (
        f"it stops itself after {idle_stop_s / 60:g} min without use "
        "(`pileworks server stop` now, `pileworks server start` keeps it up)"
    )
