"""Fixtures of the report tests: the planted run directory of planted.py."""

import pytest
from kvarn_report import figures, style
from planted import write_planted_run


@pytest.fixture
def drawn_figures(monkeypatch):
    """The matplotlib figures the report builders save, in order (they are still written)."""
    drawn = []
    save = style.save
    monkeypatch.setattr(figures.style, "save", lambda fig, d, stem: (drawn.append(fig), save(fig, d, stem))[1])
    return drawn


@pytest.fixture
def planted_run(tmp_path):
    """Path of a planted run directory (effective bits recorded)."""
    return write_planted_run(str(tmp_path / "planted"))


@pytest.fixture
def planted_run_steady(tmp_path):
    """The planted run as an older engine wrote it: no effective_bits column."""
    return write_planted_run(str(tmp_path / "planted_steady"), with_effective_bits=False)
