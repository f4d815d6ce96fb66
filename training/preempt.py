"""A scheduler's SIGTERM in the middle of a run: the ranks finish their step, agree, save one checkpoint and exit.

Kubernetes (a drained node, a preempted pod), Slurm (``scancel``, a preemption, the end of the time limit) and
systemd stop a job with SIGTERM and kill it about 30 s later. Without a handler a rank dies at once and the run
loses every step since its last periodic checkpoint (up to ``checkpoint_interval`` steps). With one
(``checkpoint_on_sigterm``, on by default), as Megatron-LM's ``--exit-signal-handler`` does:

- the handler only notes the signal (:class:`StopFlag`); the step under way runs to its end;
- the note travels with the step's loss in the one all-reduce every step makes already
  (:func:`training.engine.reduce_step`), so every rank learns of it after the same step, also where only some
  ranks got the signal (one node of several drained, a rank signalled by hand);
- every rank then saves that step's checkpoint, the metrics get a ``stop`` record, and the ranks exit with
  :data:`EXIT_STOPPED` (143, 128 + SIGTERM, as a shell reports a process the signal ended). A rerun resumes
  from that step exactly, like any resume.

The launcher (``torchrun``, or DeepSpeed's) forwards its own SIGTERM to the ranks and waits 30 s for them. It
signals each rank's process group, and so do Slurm and ``pileworks train`` (``training.launch``): that reaches
the DataLoader's worker processes too, which PyTorch ends on a SIGTERM that their rank did not send. The rank
then fails on "DataLoader worker ... is killed by signal: Terminated" before it can save.
:func:`loader_worker_init` makes the workers ignore SIGTERM: their rank stops them as it always does (or they
exit when it is gone: PyTorch's watchdog in each worker), and SIGKILL still ends them.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

logger = logging.getLogger(__name__)

STOP_SIGNAL = signal.SIGTERM
EXIT_STOPPED = 128 + int(STOP_SIGNAL)  # 143, whichever signal stopped the ranks: they saved and stopped
# SIGHUP too: a launcher run from a terminal that closes (``python -m training.launch``, torchrun) forwards it to
# the ranks as it forwards SIGTERM. Not where it was ignored when the rank started (``nohup``: it goes on).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class StopFlag:
    """Whether this rank was sent SIGTERM (or SIGHUP); the handler notes it and nothing else (it runs between
    bytecodes of the main thread, wherever that is: inside a logging call, a save)."""

    def __init__(self) -> None:
        self.received = False
        self.signal = STOP_SIGNAL  # the first one received

    def install(self) -> StopFlag:
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) != signal.SIG_IGN:
                signal.signal(signum, self._note)
        return self

    def said(self) -> str:
        """What stopped the ranks, as this rank knows it (the flag of another rank came in the all-reduce)."""
        return self.signal.name if self.received else "another rank's signal"

    def _note(self, signum: int, frame: Any) -> None:
        if not self.received:
            self.signal = signal.Signals(signum)
        self.received = True


def loader_worker_init(worker_id: int) -> None:
    """A DataLoader worker ignores SIGTERM and SIGHUP (see the module's note): its rank decides when it stops."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
