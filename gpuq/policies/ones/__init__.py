"""ONES (SC '21): online evolutionary batch-size orchestration.

`policy` is the `ones` policy; `genome` encodes candidate schedules,
`operators` evolves them, `fitness` scores them and `limits` bounds each
job's batch-size growth.
"""
