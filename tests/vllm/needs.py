"""The skip marker of tests that run real vLLM (one-line reason when it cannot run here)."""

import pytest

from minirl.vllm.llm import unavailable_reason

REASON = unavailable_reason()
needs_vllm = pytest.mark.skipif(REASON is not None, reason=REASON or "")
