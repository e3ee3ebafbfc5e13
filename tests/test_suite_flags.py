"""The suite's XLA flags (tests/conftest.py) leave out a flag this jaxlib's XLA does not
know: XLA aborts every process that starts with one in ``XLA_FLAGS`` (a jaxlib that
retired one of the suite's flags ended every xdist worker at its start)."""

from tests.conftest import SUITE_XLA_FLAGS, WANTED_XLA_FLAGS, _accepted_flags, _xla_starts_with

UNKNOWN = "--xla_cpu_flag_no_jaxlib_has=true"


def test_a_flag_xla_does_not_know_is_left_out():
    assert not _xla_starts_with([UNKNOWN])  # XLA itself refuses it
    known = "--xla_backend_optimization_level=0"
    assert _accepted_flags((known, UNKNOWN)) == (known,)
    assert _accepted_flags((UNKNOWN,)) == ()


def test_the_suites_flags_are_ones_this_xla_accepts():
    assert set(SUITE_XLA_FLAGS) <= set(WANTED_XLA_FLAGS)
    assert _xla_starts_with(SUITE_XLA_FLAGS)
