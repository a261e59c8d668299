"""The results-matrix image: measured values and their change since row 0, NaN rows left blank."""
import math

from analysis.plots import heatmap_figure
from cl_platform.results import ResultsMatrix


def test_heatmap_annotates_values_and_change_since_row_zero():
    m = ResultsMatrix.empty(["math", "law"], ["math", "law", "math"])
    for t, row in enumerate([(4.0, 5.0), (3.5, 5.25), (3.75, 4.5)]):
        for d, v in zip(m.domains, row):
            m.record(t, d, v)  # row 3 (second math experience) not measured yet
    fig = heatmap_figure(m)
    image_axes = [ax for ax in fig.axes if ax.get_xlabel() == "evaluated domain"]
    assert len(image_axes) == 2
    measured = sorted(t.get_text() for t in image_axes[0].texts)
    change = sorted(t.get_text() for t in image_axes[1].texts)
    assert measured == sorted(["4.00", "5.00", "3.50", "5.25", "3.75", "4.50"])
    assert change == sorted(["+0.000", "+0.000", "-0.500", "+0.250", "-0.250", "-0.500"])
    # the change panel's colour scale is symmetric around 0 (white = unchanged)
    low, high = image_axes[1].images[0].get_clim()
    assert math.isclose(low, -high) and math.isclose(high, 0.5)
