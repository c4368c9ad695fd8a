"""The GPU path, checked: one prepared run that proves kernels, engine and trainer on a CUDA card.

    python3 -m benchmarks.gpu_check --out DIR              # on the card (make gpu-check OUT=DIR)
    python -m benchmarks.gpu_check --dry-run --out DIR     # the same code on CPU, tiny shapes

Modules: ``stages`` (the list and budgets), ``runner`` (budgets, isolation), ``plan`` (sizes),
``gpu_tests`` (+ its pytest plugin ``pytest_log``) / ``kernel_stages`` / ``model_stages`` (what each
stage measures), ``report``, ``wheels`` (what travels to the card), ``card_only`` (the card's package
set, simulated). What a green run proves: docs/gpu.md.
"""
