"""User-facing errors: one line naming the problem and the fix, printed by the CLI without a traceback."""

from __future__ import annotations

from collections.abc import Mapping
from string import Formatter


class GacError(Exception):
    """A problem the user can fix; the message says what is wrong and what to do."""


def first_line(e: BaseException, limit: int | None = None) -> str:
    """An exception's first line of text (its type's name when it has none), cut at `limit` characters: what a
    one-line GacError quotes of a library's error."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:limit]


class InfeasibleBudget(GacError):
    """No choice of candidates fits the budget; `smallest` is the least budget that would."""

    def __init__(self, message: str, smallest: int) -> None:
        super().__init__(message)
        self.smallest = smallest

    # pickled whole: under torchrun rank 0's error is raised on every rank
    def __reduce__(self) -> tuple[type[InfeasibleBudget], tuple[str, int]]:
        return type(self), (str(self), self.smallest)


class ConfigError(GacError):
    """A configuration value or combination the caller can fix, worded in the config's own names: in the message,
    `{field}` names a field (CompressConfig.ratio: "ratio") and `{field:VALUE}` a setting of it ("ratio=0.15"); literal
    braces are doubled. str() is the library's wording; a front end names its own options (worded: the CLI's flags)."""

    def __init__(self, template: str) -> None:
        self.template = template
        super().__init__(self.worded())

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str]]:
        return type(self), (self.template,)

    def worded(self, names: Mapping[str, str] | None = None) -> str:
        """The message with each field or setting as `names` calls it (a setting's own entry, "align=False", else its
        field's followed by the value, "--ratio 0.15"), and as the config does where `names` has no entry."""
        names = names or {}
        out = []
        for text, name, value, _ in Formatter().parse(self.template):
            out.append(text)
            if name is None:
                continue
            setting = f"{name}={value}" if value else name
            if setting in names:
                out.append(names[setting])
            elif value and name in names:
                out.append(f"{names[name]} {value}")
            else:
                out.append(setting)
        return "".join(out)


def literal(text: object) -> str:
    """`text` as literal words inside a ConfigError's message (its braces doubled)."""
    return str(text).replace("{", "{{").replace("}", "}}")
