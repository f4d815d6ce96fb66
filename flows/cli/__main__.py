"""``python -m flows.cli``: the ``pileworks`` command."""

from flows.cli.main import entry

entry()
