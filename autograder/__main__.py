"""``python -m autograder ...``: see ``autograder.cli``."""
import sys

from .cli import install_stop_handlers, main

if __name__ == "__main__":
    install_stop_handlers()  # first: a SIGTERM during the heavy imports must still leave results
    sys.exit(main())
