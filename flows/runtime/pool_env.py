"""Imported first by the local workers' fork server (``flows/runtime/pool.py``): the one-thread env is in place
before numpy, OpenMP or the tokenizers' Rayon pool first read it, in the server and so in every worker forked
from it. The server ends with the command that started it, killed included (its workers end with it)."""

from __future__ import annotations

from flows.runtime.pool import set_one_thread_env
from flows.runtime.shutdown import die_with_command

set_one_thread_env()
die_with_command()
