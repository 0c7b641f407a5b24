"""Fixtures shared by the Python tests (tests/reports, tests/scripts); run with
`python3 -m pytest tests` (tests/pytest.ini puts reports/ and scripts/ on the import path)."""

import pytest


class Checks:
    """Soft checks: every failed check is recorded, and the test fails at its end listing all of
    them (one broken output does not hide the others)."""

    def __init__(self):
        self.failed = []

    def __call__(self, cond, msg):
        if not cond:
            self.failed.append(str(msg))
        return bool(cond)


@pytest.fixture
def check():
    return Checks()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test whose body ran through but recorded failed checks is a failed test."""
    outcome = yield
    rep = outcome.get_result()
    c = getattr(item, "funcargs", {}).get("check")
    if rep.when == "call" and c is not None and c.failed:
        text = f"{len(c.failed)} check(s) failed:\n" + "\n".join(c.failed)
        rep.outcome = "failed"
        rep.longrepr = text if rep.longrepr is None else f"{rep.longrepr}\n{text}"
