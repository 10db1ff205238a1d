"""Nodes: the servers a daemon runs jobs on, behind one interface (`Node`).

`LocalNode` is this machine: its executor (shims, signals, job files), its
GPU backend and its per-job control sockets. The daemon reaches every job
and every GPU through a node, so a remote node (another server, over SSH)
fits behind the same interface.
"""
