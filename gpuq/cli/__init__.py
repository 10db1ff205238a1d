"""The gpuq command line: parse, call the daemon, render."""
