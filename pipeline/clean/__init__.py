"""The clean stage as a package: ``config`` (CleanConfig, BoilerplateConfig), ``quality`` (the document
rules and QualityConfig), ``normalize`` (text repair), ``boilerplate`` (corpus-wide repeated lines), ``stage``
(``clean_batch``, ``run_clean_part``)."""
