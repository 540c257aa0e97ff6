"""Ape-X's per-actor exploration ladder (Horgan et al. 2018, arXiv:1803.00933, section 4.1).

NumPy-free and torch-free: agent processes read their epsilon from it.
"""

from __future__ import annotations

__all__ = ["annealed_epsilon", "epsilon_ladder"]


def epsilon_ladder(num_actors: int, epsilon: float = 0.4, alpha: float = 7.0) -> list[float]:
    """Epsilon of each of N actors: epsilon_i = epsilon ** (1 + alpha * i / (N - 1)), i = 0 .. N-1.

    Actor 0 explores most (``epsilon``), actor N-1 least (``epsilon ** (1 + alpha)``); one actor gets
    ``epsilon``. Defaults are the paper's (epsilon = 0.4, alpha = 7).

    Args:
        num_actors: N >= 1 (an int).
        epsilon: base exploration rate in [0, 1].
        alpha: exponent spread >= 0.

    Returns:
        N host floats in [0, 1], non-increasing in i.

    Raises:
        ValueError: ``num_actors`` < 1, ``epsilon`` outside [0, 1] or ``alpha`` < 0.
        TypeError: ``num_actors`` is not an int.

    Example:
        >>> [round(e, 6) for e in epsilon_ladder(3, epsilon=0.4, alpha=7.0)]
        [0.4, 0.016191, 0.000655]
    """
    if isinstance(num_actors, bool) or not isinstance(num_actors, int):
        raise TypeError(f"num_actors must be an int, got {type(num_actors).__name__}")
    if num_actors < 1:
        raise ValueError(f"num_actors must be >= 1, got {num_actors}")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    if not alpha >= 0.0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if num_actors == 1:
        return [float(epsilon)]
    return [float(epsilon) ** (1.0 + alpha * i / (num_actors - 1)) for i in range(num_actors)]


def annealed_epsilon(start: float, end: float, updates: int, anneal_updates: int) -> float:
    """An actor's epsilon after ``updates`` learner updates: linear from ``start`` to ``end`` over ``anneal_updates``,
    then ``end``: ``start + (end - start) * min(1, updates / anneal_updates)`` (``end`` when ``anneal_updates`` is 0).

    The DQN's in-process schedule (Mnih et al. 2015) run on the learner's update count, which an Ape-X agent reads
    with every answer (the version of the weights that answered), so a resumed run continues its schedule.

    Args:
        start, end: epsilons in [0, 1] at update 0 and from ``anneal_updates`` on.
        updates: learner updates so far (>= 0); anneal_updates: >= 0.

    Returns:
        A host float between ``start`` and ``end``.

    Example:
        >>> [annealed_epsilon(1.0, 0.0, u, 100) for u in (0, 25, 100, 900)]
        [1.0, 0.75, 0.0, 0.0]
    """
    if anneal_updates <= 0 or updates >= anneal_updates:
        return float(end)
    return float(start) + (float(end) - float(start)) * (max(updates, 0) / anneal_updates)
