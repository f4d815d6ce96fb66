"""Plumbing: the local Prefect server, task runners, heartbeats and the reaper, logs, the profile."""
