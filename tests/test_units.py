"""Numbers as kvbench writes them: with their units, and a dash where a value is missing or not a number."""

from __future__ import annotations

import math

import pytest

from kvbench import units
from kvbench.units import human_bytes

NOT_NUMBERS = (None, math.nan, math.inf, True, "12", 10**400)


def test_units():
    assert units.ms(95.16) == "95.2 ms" and units.ms(3675.4) == "3,675 ms"
    assert units.pct(41.94) == "41.9%" and units.share(0.372) == "37.2%"
    assert units.times(1.3712) == "×1.37" and human_bytes(1536) == "1.50 KiB"
    for missing in NOT_NUMBERS:
        assert units.num(missing) == units.MISSING == "–"
        assert units.sort_key(missing) is None


def test_throughput_and_a_share_under_a_percent_header():
    assert units.tok_s(1234.56) == "1,234.6 tok/s" and units.tok_s(12.4, 0) == "12 tok/s"
    assert units.share_number(0.372) == "37.2" and units.share_number(0.5, 0) == "50"
    assert units.share_number(12.5) == "1,250.0"  # a share past 10 keeps the house's thousands separator


FORMATTERS = (
    units.num,
    units.count,
    units.ms,
    units.ms_number,
    units.seconds,
    units.tok_s,
    units.pct,
    units.share,
    units.share_number,
    units.times,
    human_bytes,
    units.ms_text,
)


@pytest.mark.parametrize("formatter", FORMATTERS, ids=lambda f: f.__name__)
def test_every_formatter_writes_the_missing_mark_its_output_asks_for(formatter):
    for missing in NOT_NUMBERS:
        assert formatter(missing, missing="-") == "-"
        assert formatter(missing, missing="?") == "?"


def test_default_marks_are_the_page_s_en_dash_and_the_console_s_dash():
    """report.html's formatters default to the en dash; the two written mostly on the console to "-"."""
    defaults = {f.__name__: f(None) for f in FORMATTERS}
    assert defaults.pop("human_bytes") == defaults.pop("ms_text") == "-"
    assert set(defaults.values()) == {units.MISSING}


def test_digits_and_mark_go_together():
    assert units.num(1234.5678, 3, missing="-") == "1,234.568" and units.num(None, 3, missing="-") == "-"
    assert units.share(0.25, 0, missing="?") == "25%" and units.pct(7.25, 2) == "7.25%"
    assert units.count(1234.4) == "1,234" and units.seconds(3.14159) == "3.14 s"


def test_bytes_in_the_fitting_unit_or_a_fixed_one():
    assert human_bytes(None) == "-" and human_bytes(512) == "512 B" and human_bytes(1536) == "1.50 KiB"
    assert human_bytes(3 * 1024**3) == "3.00 GiB" and human_bytes(2 * 1024**5) == "2,048.00 TiB"
    assert human_bytes(512 * 1024**2, "GiB") == "0.50 GiB" and human_bytes(6 * 1024**3, "GiB") == "6.00 GiB"
    assert human_bytes(2048, "B") == "2,048 B"
    assert human_bytes(None, missing=units.MISSING) == units.MISSING


def test_milliseconds_keep_three_significant_digits():
    assert units.ms_text(0.4123) == "0.412" and units.ms_text(4.123) == "4.12" and units.ms_text(41.23) == "41.2"
    assert units.ms_text(412.3) == "412" and units.ms_text(4123) == "4,123" and units.ms_text(None) == "-"
