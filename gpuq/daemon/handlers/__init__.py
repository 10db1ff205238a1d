"""One module per request kind; `gpuq.daemon.dispatch` routes to them."""
