"""How a command ends: what it produced, where to look (the run's UI URL), and the exact commands to run next.

Text goes to stdout as plain lines (never cut to a table's width, so a URI can be copied whole); ``--json``
prints the same facts as one JSON object instead.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from typing import Any


def prog() -> str:
    """How the user called us: ``pileworks`` when that is on PATH, else the path they typed (``.venv/bin/…``)."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "pileworks"
    if os.path.basename(argv0) != "pileworks":
        return "pileworks"
    found = shutil.which("pileworks")
    if found and os.path.realpath(found) == os.path.realpath(argv0):
        return "pileworks"
    return os.path.relpath(argv0) if os.path.isabs(argv0) else argv0


def command(*words: Any) -> str:
    """A copyable command line: ``pileworks`` (as called) and the words, each quoted for a POSIX shell."""
    return " ".join([prog(), *(shlex.quote(str(w)) for w in words)])


def flow_run_outcome(state: Any) -> tuple[Any, str | None]:
    """A flow's return value (raising its exception when it failed) and its flow run id."""
    run_id = state.state_details.flow_run_id
    return state.result(), (str(run_id) if run_id else None)


def finish(facts: dict[str, Any], lines: list[str], next_commands: list[str], as_json: bool) -> None:
    """Print the end of a command: ``lines`` then ``next:`` commands, or everything as one JSON object."""
    if as_json:
        print(json.dumps({**facts, "next": next_commands}, indent=1, default=str))
        return
    for line in lines:
        print(line)
    if next_commands:
        print("next:")
        for cmd in next_commands:
            print(f"  {cmd}")
    sys.stdout.flush()
