"""AFS (NSDI '21): apathetic future share.

`policy` holds the `afs` and `afs-p` policies; `core` is the algorithm on
throughput tables, `packing` network packing and placement.
"""
