"""The daemon's scheduler: from the store and the runner's samples to started jobs.

- `readiness`: which pending jobs may run now (holds, begin times,
  dependencies, array limits), and why the others wait;
- `view`: the policy's `ClusterState` of this server;
- `binding`: a policy's decision turned into GPU UUIDs and memory shares;
- `tick`: one pass, calling the policy off the event loop when it is large
  and starting jobs in slices, so clients are never kept waiting.

The same policy objects run in the simulator (`gpuq.sim`).
"""
