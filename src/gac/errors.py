"""User-facing errors: one line naming the problem and the fix, printed by the CLI without a traceback."""


class GacError(Exception):
    """A problem the user can fix; the message says what is wrong and what to do."""


def first_line(e: BaseException, limit: int | None = None) -> str:
    """An exception's first line of text (its type's name when it has none), cut at `limit` characters: what a
    one-line GacError quotes of a library's error."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:limit]


class InfeasibleBudget(GacError):
    """No choice of candidates fits the budget; `smallest` is the least budget that would."""

    def __init__(self, message: str, smallest: int):
        super().__init__(message)
        self.smallest = smallest
