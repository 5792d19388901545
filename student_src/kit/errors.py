"""The one exception type the kit raises for problems a user can fix.

Anything raised as ``KitError`` is printed by the command-line entry points as a short
``error: ...`` line (no traceback) with a non-zero exit code, so its message must say what
went wrong *and* what to do about it, in one or two lines.
"""


class KitError(Exception):
    """A user-facing error: bad input, missing data, an unreachable master, ..."""
