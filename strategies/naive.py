"""No consolidation: the FwPKM paper's continual-learning protocol, the baseline to beat."""

from cl_platform.strategy import Strategy


class NaiveStrategy(Strategy):
    """Same as `Strategy`: every hook a no-op. Later domains overwrite earlier fast weights."""
