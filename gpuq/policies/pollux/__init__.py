"""Pollux (OSDI '21): goodput-driven elastic allocation.

`policy` is the `pollux` policy; `search` is its genetic search over
allocation matrices, `greedy` its seed allocation, and `tables` the speedup
tables and fair shares it searches with.
"""
