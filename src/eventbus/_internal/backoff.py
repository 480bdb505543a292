"""The one retry backoff of EventBus: capped exponential, with jitter.

Every retry loop waits :meth:`Backoff.delay` between tries: a source's event retries
(``delivery.backoff``), its dispatch and sink retries, the dedupe claim waiting for Redis, the
gateway's calls into a pipeline, and the client's retry rounds and cluster mark-downs. Try
``n`` (1, 2, ...) waits at most ``min(initial_s * 2 ** (n - 1), max_s)`` (the *ceiling*); the
``jitter`` fraction of it is drawn at random. ``jitter=1`` is "full jitter" (a delay anywhere
in ``(0, ceiling]``, AWS's recommendation, the default): processes that failed together (every
source of a broker after a shared outage) spread their retries over the whole interval
instead of coming back in lockstep.

The loops themselves stay where they are: each has its own give-up rule (a time budget, a
per-event retry count, a ``Retry-After`` floor, a batch split in halves) that no retry
library's loop expresses; what they share is this schedule.

Example:
    >>> b = Backoff(initial_s=0.1, max_s=0.3)
    >>> [b.ceiling(n) for n in (1, 2, 3, 4)]
    [0.1, 0.2, 0.3, 0.3]
    >>> 0 < b.delay(3) <= 0.3
    True
    >>> Backoff(0.1, 0.3, jitter=0).delay(2)
    0.2
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["FULL_JITTER", "Backoff"]

#: ``jitter`` of a delay drawn anywhere in ``(0, ceiling]``.
FULL_JITTER = 1.0
# 2 ** 63 times any positive initial_s is past every max_s a config allows: no float overflow
# for a loop that counted its attempts for days.
_MAX_EXPONENT = 63


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with jitter.

    Args:
        initial_s: the ceiling of the first delay (seconds, >= 0).
        max_s: the largest ceiling (seconds, >= 0; below ``initial_s`` every delay's ceiling
            is ``max_s``).
        jitter: the fraction of each delay drawn at random, 0 to 1: 0 waits exactly the
            ceiling, 0.2 waits 80-100 % of it, 1 (the default) anywhere up to it.

    Raises:
        ValueError: a bound that is not a finite number >= 0, or a jitter outside 0-1.
    """

    initial_s: float = 0.1
    max_s: float = 5.0
    jitter: float = FULL_JITTER

    def __post_init__(self) -> None:
        for name in ("initial_s", "max_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                msg = f"backoff {name} must be a finite number of seconds >= 0; got {value!r}"
                raise ValueError(msg)
        if not (isinstance(self.jitter, int | float) and 0 <= self.jitter <= 1):
            msg = f"backoff jitter must be a fraction from 0 to 1 (1: full jitter); got {self.jitter!r}"
            raise ValueError(msg)

    def ceiling(self, attempt: int) -> float:
        """The longest wait after failed try number ``attempt`` (1, 2, ...)."""
        exponent = min(max(attempt, 1) - 1, _MAX_EXPONENT)
        return float(min(self.initial_s * 2.0**exponent, self.max_s))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed try number ``attempt`` (1, 2, ...): the
        :meth:`ceiling` less a random part of at most ``jitter`` of it.

        Args:
            attempt: the failed tries so far.
            rng: the random source (default: the ``random`` module's; tests pass a seeded
                one).
        """
        # [0, 1): the delay stays above 0 at full jitter
        draw = random.random() if rng is None else rng.random()
        return self.ceiling(attempt) * (1.0 - self.jitter * draw)
