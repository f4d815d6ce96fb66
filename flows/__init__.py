"""Prefect flows and the ``pileworks`` command line. Nothing imports this package."""
