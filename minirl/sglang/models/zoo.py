"""``EntryClass``: SGLang's classes for the zoo's architectures (labs/zoo_specs.py): Llama
(tiny-llama, smollm2), Qwen2, Qwen3, Qwen3-MoE, Mixtral, OLMoE."""

from sglang.srt.models.llama import LlamaForCausalLM
from sglang.srt.models.mixtral import MixtralForCausalLM
from sglang.srt.models.olmoe import OlmoeForCausalLM
from sglang.srt.models.qwen2 import Qwen2ForCausalLM
from sglang.srt.models.qwen3 import Qwen3ForCausalLM
from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM

EntryClass = [LlamaForCausalLM, MixtralForCausalLM, OlmoeForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
              Qwen3MoeForCausalLM]
