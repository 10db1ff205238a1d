"""`gpuq top`: a Textual terminal UI over the daemon's client protocol.

Layers, from the bottom: `model`, `gpumodel` and `series` are pure functions
and classes that turn protocol results into rows, bars and chart series (no
Textual); `source` reaches the daemon through `gpuq.client` only, and
`replay` serves recorded payloads instead (screenshots, benchmarks, snapshot
tests); `widgets`, `screens`, `detail` and `app` are the Textual side.
Importing this package imports nothing; `gpuq.tui.app` pulls in Textual.
"""

from __future__ import annotations
