"""Real SGLang (0.5.23, CPU torch) as an inference engine of the lab: an in-process
``ModelRunner`` built from a spec, prefill/decode with raw logprobs, weight sync from the trainer
and MoE routing. SGLang is imported only when one of these is used, and always through
``standins.install`` (docs/sglang.md: why the import order matters)."""
