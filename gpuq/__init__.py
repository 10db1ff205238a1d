"""gpuq: a GPU job manager for small ML labs.

Importing this package imports nothing heavy: only the version lives here.
"""

__version__ = "0.1.0"
