"""Training, evaluation and the doctor as Prefect flows (DeepSpeed runs in a subprocess)."""
