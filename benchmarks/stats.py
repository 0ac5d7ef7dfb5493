"""Summary statistics for repeated measurements on a noisy shared machine.

Medians and 95th percentiles (nearest-rank on linear interpolation, as numpy's
default) rather than means: one slow outlier caused by another process must
not move the headline figure.
"""
import math
from typing import Dict, List, Optional, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` by linear interpolation."""
    if not values:
        raise ValueError("percentile of an empty sample")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = (len(ordered) - 1) * q / 100.0
    lower = math.floor(pos)
    upper = math.ceil(pos)
    frac = pos - lower
    return float(ordered[lower] + (ordered[upper] - ordered[lower]) * frac)


def median(values: Sequence[float]) -> float:
    """The median of ``values``."""
    return percentile(values, 50.0)


def summarize(values: Sequence[float], digits: int = 4) -> Dict[str, float]:
    """``{n, min, median, p95, max, mean}`` of ``values``, rounded to ``digits``."""
    if not values:
        raise ValueError("summary of an empty sample")
    data: List[float] = [float(v) for v in values]
    return {
        "n": len(data),
        "min": round(min(data), digits),
        "median": round(median(data), digits),
        "p95": round(percentile(data, 95.0), digits),
        "max": round(max(data), digits),
        "mean": round(sum(data) / len(data), digits),
    }


def ratio(value: float, baseline: float, digits: int = 3) -> Optional[float]:
    """``value / baseline`` rounded, or None when the baseline is zero."""
    if baseline == 0:
        return None
    return round(value / baseline, digits)
