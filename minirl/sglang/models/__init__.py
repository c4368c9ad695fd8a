"""The SGLang model classes of the architectures the lab runs, registered up front so SGLang's
start-up skips importing every one of its ~200 model modules (4.7 s of CPU here; docs/sglang.md).
SGLang reads this package through ``SGLANG_EXTERNAL_MODEL_PACKAGE``; an architecture not listed
here makes SGLang import its whole registry as before, so nothing is lost, only slower."""
