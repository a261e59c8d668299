"""Reads results (and TensorBoard logs) only: metrics, tables, plots. Needs no torch or model code.

    from analysis.metrics import summary
    from analysis.table import format_table
"""
