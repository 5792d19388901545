"""``python -m autograder ...``: see ``autograder.cli``."""
import os
import signal
import sys

# OpenMP's idle threads sleep instead of spinning, in this process and in the sandbox's (which inherit it): the
# grader's few multi-threaded torch ops (building the references' models) left libgomp's workers spinning on the
# cores the ranks need, 11% of all CPU samples of a grading (benchmarks/grading/README.md, ninth session). Read by
# libgomp once, when torch loads it: it must be set before anything imports torch. A caller's own value wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# A signal that comes while the CLI itself imports is held, then handed to its real handler.
_held = []
for _sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(_sig, lambda signum, frame: _held.append(signum))

from .cli import install_stop_handlers, main  # noqa: E402
from .grading.helper_threads import end  # noqa: E402

if __name__ == "__main__":
    install_stop_handlers()  # before anything heavy: a SIGTERM during torch's import still leaves results
    if _held:
        os.kill(os.getpid(), _held[0])
    sys.exit(end(main()))  # end: no grader thread may still be inside torch when the interpreter shuts down
