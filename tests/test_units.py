"""Numbers as kvbench writes them: with their units, and a dash where a value is missing or not a number."""

from __future__ import annotations

import math

from kvbench import units
from kvbench.units import human_bytes


def test_units():
    assert units.ms(95.16) == "95.2 ms" and units.ms(3675.4) == "3,675 ms"
    assert units.pct(41.94) == "41.9%" and units.share(0.372) == "37.2%"
    assert units.times(1.3712) == "×1.37" and units.nbytes(1536) == "1.50 KiB"
    for missing in (None, math.nan, math.inf, True, "12"):
        assert units.num(missing) == units.MISSING == "–"
        assert units.sort_key(missing) is None


def test_bytes_in_the_fitting_unit_or_a_fixed_one():
    assert human_bytes(None) == "-" and human_bytes(512) == "512 B" and human_bytes(1536) == "1.50 KiB"
    assert human_bytes(3 * 1024**3) == "3.00 GiB" and human_bytes(2 * 1024**5) == "2,048.00 TiB"
    assert human_bytes(512 * 1024**2, "GiB") == "0.50 GiB" and human_bytes(6 * 1024**3, "GiB") == "6.00 GiB"
    assert human_bytes(2048, "B") == "2,048 B"


def test_milliseconds_keep_three_significant_digits():
    assert units.ms_text(0.4123) == "0.412" and units.ms_text(4.123) == "4.12" and units.ms_text(41.23) == "41.2"
    assert units.ms_text(412.3) == "412" and units.ms_text(4123) == "4,123" and units.ms_text(None) == "-"
