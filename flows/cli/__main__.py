"""``python -m flows.cli``: the ``pileworks`` command."""

import sys

from flows.cli.main import main

sys.exit(main())
