"""Ingest as a package: ``config`` (formats, IngestConfig, plan types), ``encoding`` (charset detection),
``streams`` (decompressing and ranged readers), ``readers`` (one generator per format), ``stage`` (list, plan,
run a part)."""
