"""The preflight (``pileworks doctor``): ``base`` (result types, DoctorConfig, the check-name registry), the checks
``host``, ``net``, ``dist``, ``store`` above it, and ``runner`` on top. ``training.monitor`` (the in-run view,
``doctor --during``) sits beside this package."""
