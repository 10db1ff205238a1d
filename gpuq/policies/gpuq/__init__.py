"""gpuq's own default policy, `gpuq`: Pollux's goodput allocation with honest restart costs.

`policy` is the policy; `estimates` estimates a job's remaining time from
what is known of it.
"""
