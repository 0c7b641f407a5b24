"""Fixtures of the report tests: the planted run directory of planted.py."""

import pytest
from planted import write_planted_run


@pytest.fixture
def planted_run(tmp_path):
    """Path of a planted run directory (effective bits recorded)."""
    return write_planted_run(str(tmp_path / "planted"))


@pytest.fixture
def planted_run_steady(tmp_path):
    """The planted run as an older engine wrote it: no effective_bits column."""
    return write_planted_run(str(tmp_path / "planted_steady"), with_effective_bits=False)
