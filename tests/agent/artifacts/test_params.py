"""The config formulas count exactly what transformers instantiates (checked on the meta device)."""

import json

import pytest
import torch
import transformers

from agent.artifacts.config import ModelConfig
from agent.artifacts.params import count_parameters

transformers.logging.set_verbosity_error()

_DEC = dict(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
_BERT = dict(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64)
_ROBERTA = _BERT | dict(max_position_embeddings=66, type_vocab_size=1)
_DISTIL = dict(vocab_size=100, dim=32, hidden_dim=48, n_layers=2, n_heads=4, max_position_embeddings=64)
_T5 = dict(vocab_size=100, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4)
_VIT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, image_size=32,
            patch_size=8)
_RESNET = dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 2])

CASES = [
    ("LlamaConfig", "LlamaForCausalLM", _DEC | dict(num_key_value_heads=2)),
    ("LlamaConfig", "LlamaModel", _DEC | dict(attention_bias=True, mlp_bias=True)),
    ("LlamaConfig", "LlamaForCausalLM", _DEC | dict(tie_word_embeddings=True, head_dim=16)),
    ("MistralConfig", "MistralForCausalLM", _DEC | dict(num_key_value_heads=2, head_dim=16)),
    ("Qwen2Config", "Qwen2ForCausalLM", _DEC | dict(num_key_value_heads=2, tie_word_embeddings=True)),
    ("GemmaConfig", "GemmaForCausalLM", _DEC | dict(num_key_value_heads=1, head_dim=16)),
    ("MixtralConfig", "MixtralForCausalLM", _DEC | dict(num_key_value_heads=2, num_local_experts=4)),
    ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", _DEC | dict(num_hidden_layers=4, num_key_value_heads=2, num_experts=4,
                                                          moe_intermediate_size=16, shared_expert_intermediate_size=24,
                                                          mlp_only_layers=[1], decoder_sparse_step=1)),
    ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", _DEC | dict(num_experts=4, moe_intermediate_size=16,
                                                          shared_expert_intermediate_size=24, decoder_sparse_step=2,
                                                          qkv_bias=False)),
    ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                           bos_token_id=0, eos_token_id=0)),
    ("GPT2Config", "GPT2Model", dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_inner=40, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)),
    ("GPTNeoXConfig", "GPTNeoXForCausalLM", _DEC),
    ("BertConfig", "BertModel", _BERT),
    ("BertConfig", "BertForMaskedLM", _BERT),
    ("BertConfig", "BertForSequenceClassification", _BERT | dict(num_labels=3)),
    ("RobertaConfig", "RobertaModel", _ROBERTA),
    ("RobertaConfig", "RobertaForMaskedLM", _ROBERTA),
    ("RobertaConfig", "RobertaForSequenceClassification", _ROBERTA),
    ("DistilBertConfig", "DistilBertModel", _DISTIL),
    ("DistilBertConfig", "DistilBertForMaskedLM", _DISTIL),
    ("DistilBertConfig", "DistilBertForSequenceClassification", _DISTIL),
    ("T5Config", "T5ForConditionalGeneration", _T5 | dict(num_decoder_layers=3)),
    ("T5Config", "T5ForConditionalGeneration", _T5 | dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
    ("T5Config", "T5Model", _T5),
    ("T5Config", "T5EncoderModel", _T5),
    ("ViTConfig", "ViTModel", _VIT),
    ("ViTConfig", "ViTForImageClassification", _VIT | dict(num_labels=10, qkv_bias=False)),
    ("ResNetConfig", "ResNetForImageClassification", _RESNET | dict(num_labels=10)),
    ("ResNetConfig", "ResNetModel", _RESNET | dict(layer_type="basic", downsample_in_first_stage=True)),
    ("MobileNetV2Config", "MobileNetV2ForImageClassification", dict(depth_multiplier=0.35, num_labels=10)),
    ("MobileNetV2Config", "MobileNetV2Model", dict(depth_multiplier=1.4, first_layer_is_expansion=False)),
]


@pytest.mark.parametrize(("config_class", "architecture", "kwargs"), CASES,
                         ids=[f"{a}-{i}" for i, (_, a, _) in enumerate(CASES)])
def test_it_counts_exactly_what_transformers_instantiates(config_class, architecture, kwargs):
    config = getattr(transformers, config_class)(architectures=[architecture], **kwargs)
    with torch.device("meta"):
        model = getattr(transformers, architecture)(config)
    exact = sum(p.numel() for p in model.parameters())
    state = model.state_dict()
    exact_buffers = sum(b.numel() for name, b in model.named_buffers() if name in state)

    # what save_pretrained writes: only the fields that differ from the config class's defaults
    count = count_parameters(ModelConfig(json.loads(config.to_json_string(use_diff=True))))

    assert count.parameters == exact
    assert count.float_buffers + count.int64_buffers == exact_buffers
    assert count.notes == []


def test_it_says_when_a_head_has_no_formula():
    cfg = ModelConfig({"model_type": "bert", "architectures": ["BertForTokenClassification"]})
    assert "has no formula" in count_parameters(cfg).notes[0]
