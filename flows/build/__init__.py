"""The build flow: its context and tasks, the passes over parts, decontamination."""
