"""User-facing errors: one line naming the problem and the fix, printed by the CLI without a traceback."""


class GacError(Exception):
    """A problem the user can fix; the message says what is wrong and what to do."""
