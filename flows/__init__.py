"""Prefect flows and the ``pileworks`` command line. Nothing outside ``flows`` imports this package."""

from flows.runtime import quiet_logs

quiet_logs.install()  # every process that runs our tasks (the flow's, a Dask worker's) imports this package
