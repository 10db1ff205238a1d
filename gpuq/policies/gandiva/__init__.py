"""Gandiva (OSDI '18): time-slicing, packing with introspection, migration.

`policy` is the `gandiva` policy; `book` keeps its per-server bookkeeping,
`packing` measures and reviews packs, `placement` places and suspends, and
`migration` moves jobs to lower server load and improve locality.
"""
