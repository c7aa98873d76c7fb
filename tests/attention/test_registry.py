"""Registration with transformers' attention registry, and the mask shortcut we rely on."""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface, Qwen2Config
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, create_causal_mask

from langchain_ascend.attention import registry


def test_register_is_idempotent_and_visible_to_transformers():
    name = registry.register()
    assert registry.register() == name == registry.ATTN_IMPLEMENTATION
    assert AttentionInterface()[name] is registry.paged_attention_forward
    assert name not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping


def test_transformers_builds_no_mask_for_our_implementation():
    """We register no mask function because create_causal_mask then returns None outright."""
    registry.register()
    config = Qwen2Config(hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                         num_hidden_layers=1, intermediate_size=64, vocab_size=50)
    config._attn_implementation = registry.ATTN_IMPLEMENTATION
    embeds = torch.zeros(1, 5, 32)
    positions = torch.tensor([[3, 4, 0, 1, 2]])  # two packed segments
    assert create_causal_mask(config=config, inputs_embeds=embeds, attention_mask=None,
                              past_key_values=None, position_ids=positions) is None
    config._attn_implementation = "sdpa"
    assert create_causal_mask(config=config, inputs_embeds=embeds, attention_mask=None,
                              past_key_values=None, position_ids=positions) is not None


def test_attention_outside_the_runner_fails_clearly():
    module = torch.nn.Module()
    module.layer_idx = 0
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="ModelRunner"):
        registry.paged_attention_forward(module, q, q, q, None)
