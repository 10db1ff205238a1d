"""Sia (SOSP '23): heterogeneity-aware goodput scheduling over GPU types.

`policy` is the `sia` policy; `configs` its configuration set, `goodputs`
each job's goodput on a configuration, `matrix` the normalized goodput
matrix G (over a decision's `columns`), `problem` the ILP's rows, `solve`
the ILP (scipy's HiGHS) and `placement` the placer.
"""
