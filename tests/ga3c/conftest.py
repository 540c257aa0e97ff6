"""Fixtures of the GA3C tests: the messages of the ``lightning_per.ga3c`` logger, as logged (the CLI turns its
propagation off, so caplog misses them)."""

from __future__ import annotations

import logging

import pytest


class _Lines(logging.Handler):
    """The messages of a logger at or above ``level``."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _attached(level: int):
    handler, logger = _Lines(level), logging.getLogger("lightning_per.ga3c")
    before = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


@pytest.fixture
def ga3c_warnings():
    """The warnings the ``lightning_per.ga3c`` logger logs during the test."""
    yield from _attached(logging.WARNING)


@pytest.fixture
def ga3c_info():
    """The messages at INFO and above the ``lightning_per.ga3c`` logger logs during the test."""
    yield from _attached(logging.INFO)
