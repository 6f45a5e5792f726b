"""Numbers with their units, and a dash where a value is missing or not a number."""

from __future__ import annotations

import math

from kvbench.report.html import units


def test_units():
    assert units.tok_s(1173.779) == "1,173.8 tok/s"
    assert units.ms(95.16) == "95.2 ms" and units.ms(3675.4) == "3,675 ms"
    assert units.pct(41.94) == "41.9%" and units.share(0.372) == "37.2%"
    assert units.signed_pct(37.4) == "+37%" and units.signed_pct(-7.7e-14) == "0%" and units.signed_pct(-4.2) == "-4%"
    assert units.times(1.3712) == "×1.37" and units.nbytes(1536) == "1.50 KiB"
    for missing in (None, math.nan, math.inf, True, "12"):
        assert units.num(missing) == units.MISSING == "–"
        assert units.sort_key(missing) is None
