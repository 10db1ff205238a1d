"""Thin integrations of `gpuq.runner` with training frameworks and launchers.

- `gpuq.runner.integrations.lightning`: ``GpuqCallback`` for PyTorch Lightning.
- `gpuq.runner.integrations.huggingface`: ``GpuqTrainerCallback`` for the
  Hugging Face ``Trainer``.
- `gpuq.runner.integrations.torchrun`: ``python -m
  gpuq.runner.integrations.torchrun`` runs torchrun and exits with
  `gpuq.runner.SUSPEND_EXIT_CODE` when its ranks suspended.

Each module imports its framework when it is imported itself; this package
imports nothing, so ``import gpuq.runner`` never loads Lightning or
transformers. Outside gpuq (no ``GPUQ_JOB_ID``) the callbacks do nothing.
"""
