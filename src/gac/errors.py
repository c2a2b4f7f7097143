"""User-facing errors: one line naming the problem and the fix, printed by the CLI without a traceback."""


class GacError(Exception):
    """A problem the user can fix; the message says what is wrong and what to do."""


class InfeasibleBudget(GacError):
    """No choice of candidates fits the budget; `smallest` is the least budget that would."""

    def __init__(self, message: str, smallest: int):
        super().__init__(message)
        self.smallest = smallest
