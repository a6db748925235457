"""How a run answers SIGINT and SIGTERM: unwind at once (test, set-up), or stop at the next
consistent point and save (training)."""
from __future__ import annotations

import signal
from contextlib import contextmanager

from tqdm.auto import tqdm


@contextmanager
def terminate_as_interrupt():
    """SIGTERM unwinds like Ctrl+C, so env workers and game processes are closed on the way out.
    SIGINT is set to raise as well: a process started in the background by a non-interactive shell
    (a script's ``marlkit ... &``, a CI job under make) inherits SIGINT ignored, and Python then
    installs no Ctrl+C handler; a run must stop on SIGINT however it was started, as training does."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, handler),
                    signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


class StopRequest:
    """While training, Ctrl+C or SIGTERM asks for a stop at the next rollout boundary, where the
    agents, envs and counters agree and a checkpoint is consistent; an update in progress ends at
    its next minibatch to get there quickly. A second signal stops at once."""

    def __init__(self):
        self.signum: int | None = None

    def __bool__(self) -> bool:
        return self.signum is not None

    @contextmanager
    def deferred(self):
        def handler(signum, frame):
            if self.signum is not None:
                raise KeyboardInterrupt(f"signal {signum}")
            self.signum = signum
            tqdm.write("marlkit: stopping at the end of this rollout (or update) to save a checkpoint "
                       "(press Ctrl+C again to stop at once, without saving)")

        try:
            previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        except ValueError:  # not the main thread: signals stay as they are
            yield
            return
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
