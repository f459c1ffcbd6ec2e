"""Keep torch.profiler's own log lines out of the user's cell output.

When its trace starts and stops, torch's profiler (Kineto's ``SyncActivityProfilerHandler``)
writes ``USDT:<date> <pid>:<tid> SyncActivityProfilerHandler.cpp:52] profiler_start`` (and
``…:59] profiler_stop``) straight to file descriptor 2, even for a CPU-only trace (seen with
torch 2.13.0+cpu). In a notebook that lands in a red stderr box under the user's cell and
reads like an error. Around the few profiler calls ``%%gpuprofile --ops`` makes, descriptor 2
goes to a temporary file; afterwards every line except those two is written back, in order,
so anything else said at that moment (a real warning) still reaches the user.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

NOISE = re.compile(rb"^USDT:.*\] profiler_(?:start|stop)\s*$")
_KEEP_AT_MOST = 1 << 20  # bytes written back; a profiler call never says more than a few lines


@contextmanager
def quiet_profiler_log(fd: int = 2) -> Iterator[None]:
    """Run the body with ``fd``'s profiler log lines dropped (see the module doc)."""
    try:
        sys.stderr.flush()
        saved = os.dup(fd)
    except (OSError, ValueError, AttributeError):  # no descriptor to borrow: say everything
        yield
        return
    with tempfile.TemporaryFile() as caught:
        try:
            os.dup2(caught.fileno(), fd)
        except OSError:
            os.close(saved)
            yield
            return
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            caught.seek(0)
            said = caught.read(_KEEP_AT_MOST)
            kept = b"".join(line for line in said.splitlines(keepends=True) if not NOISE.match(line))
            if kept:
                os.write(fd, kept)
