"""The ``pileworks`` command line, apart from the flows: ``main`` (the parser and the error handling) and one
module per command, listed in ``main.COMMANDS``."""
