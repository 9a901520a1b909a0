"""Chat messages to prompt text with the model's chat template, rendered as transformers' apply_chat_template does."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.serving.chat import BadChatTemplate, ChatError, ChatTemplates, NoChatTemplate, parse_messages
from agent.serving.tokenization import Tokenizers
from agent.workers.demo_tokenizer import train_bpe, write_llama_tokenizer

ROOT = Path(__file__).resolve().parents[3]

# Real-world templates, inline: Qwen2-style ChatML (default system prompt, whitespace control),
# Llama 3 Instruct's, Mistral 0.1's (raise_exception on roles that do not alternate) and one that uses
# namespace, loop controls, tojson, tools and {% generation %}.
CHATML = r"""{%- for message in messages %}
    {%- if loop.first and messages[0]['role'] != 'system' %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
    {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
FEATURES = """{%- set ns = namespace(system=none, turns=0) -%}
{%- for message in messages -%}
  {%- if message.role == 'system' -%}{%- set ns.system = message.content -%}{%- continue -%}{%- endif -%}
  {%- set ns.turns = ns.turns + 1 -%}
  {%- if message.role == 'assistant' %}
{% generation %}ASSISTANT: {{ message.content }}{{ eos_token }}{% endgeneration %}
  {% else %}
{{ message.role|upper }}{% if message.name is defined %} ({{ message.name }}){% endif %}: {{ message.content|tojson }}
  {% endif -%}
{%- endfor -%}
{%- if ns.system is not none %}SYSTEM: {{ ns.system }} TURNS: {{ ns.turns }}
{% endif -%}
{%- if tools is not none %}TOOLS{% endif -%}
{{ dict(a=1) | tojson }}
{%- if add_generation_prompt %}ASSISTANT:{% endif %}
"""

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one line."}
ONE_TURN = [{"role": "user", "content": "Hello world"}]
MULTI_TURN = [
    SYSTEM,
    {"role": "user", "content": "What is the weather like today?"},
    {"role": "assistant", "content": "  It is sunny and warm.  "},
    {"role": "user", "content": 'And tomorrow? <b>é</b> "quoted"', "name": "ada"},
]
ALTERNATING = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Tell me a story."},
]
ADDED_TOKEN = {"__type": "AddedToken", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def token(content):
    """A special token as older tokenizer_config.json files serialise it."""
    return {**ADDED_TOKEN, "content": content}


def model_dir(root, name, template, **config):
    """A model directory with the demo BPE tokenizer and `template` in its tokenizer_config.json."""
    path = root / name
    path.mkdir()
    train_bpe().save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **config}
    if template is not None:
        config["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-models")
    return {
        "demo": write_llama_tokenizer(root / "demo"),
        "chatml": model_dir(root, "chatml", CHATML, eos_token=token("<|im_end|>"), pad_token="<|endoftext|>"),
        "llama3": model_dir(root, "llama3", LLAMA3, bos_token="<|begin_of_text|>", eos_token=token("<|eot_id|>")),
        "mistral": model_dir(root, "mistral", MISTRAL, bos_token="<s>", eos_token="</s>", unk_token="<unk>"),
        "features": model_dir(root, "features", FEATURES, eos_token="</s>"),
        "plain": model_dir(root, "plain", None, bos_token="<s>"),
    }


def transformers_render(path, messages, tokenize=False):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return tokenizer.apply_chat_template(messages, tokenize=tokenize, add_generation_prompt=True, return_dict=False)


@pytest.mark.parametrize(
    ("model", "messages"),
    [
        ("demo", ONE_TURN),
        ("demo", MULTI_TURN),
        ("chatml", ONE_TURN),
        ("chatml", MULTI_TURN),
        ("llama3", ONE_TURN),
        ("llama3", MULTI_TURN),
        ("mistral", ALTERNATING),
        ("features", MULTI_TURN),
    ],
)
def test_it_renders_what_transformers_renders(models, model, messages):
    ours = ChatTemplates().render(str(models[model]), messages)
    assert ours == transformers_render(models[model], messages)


def test_the_demo_template_opens_the_assistant_turn_with_llamas_special_tokens(models):
    text = ChatTemplates().render(str(models["demo"]), [SYSTEM, *ONE_TURN])
    assert text == f"<s><|system|>\n{SYSTEM['content']}</s>\n<|user|>\nHello world</s>\n<|assistant|>\n"


def test_tokenizing_the_text_without_special_tokens_gives_transformers_ids(models):
    path = models["demo"]
    text = ChatTemplates().render(str(path), MULTI_TURN)
    ids = Tokenizers().get(str(path), truncate=False).encode_plain(text)
    assert ids == transformers_render(path, MULTI_TURN, tokenize=True)
    assert ids[0] == 1 and ids[1] != 1 and ids.count(2) == len(MULTI_TURN)  # one <s>, one </s> per message


def test_text_parts_are_joined_and_developer_is_the_system_role(models):
    templates, path = ChatTemplates(), str(models["chatml"])
    parts = [
        {"role": "developer", "content": [{"type": "text", "text": "Be terse."}]},
        {"role": "user", "content": [{"type": "text", "text": "line one"}, {"type": "text", "text": "line two"}]},
    ]
    plain = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "line one\nline two"}]
    assert templates.render(path, parts) == templates.render(path, plain)


def test_parsed_messages_keep_name_and_tool_call_id_and_drop_other_fields():
    raw = [
        {"role": "user", "content": "hi", "name": "ada", "audio": None, "extra": 1},
        {"role": "tool", "content": "42", "tool_call_id": "call_1", "name": None},
    ]
    assert parse_messages(raw) == [
        {"role": "user", "content": "hi", "name": "ada"},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        (None, "'messages' must be a non-empty list of messages"),
        ([], "'messages' must be a non-empty list of messages"),
        ({"role": "user", "content": "hi"}, "'messages' must be a non-empty list of messages"),
        (["hi"], "messages[0] must be an object with 'role' and 'content'"),
        ([{"content": "hi"}], "messages[0].role must be one of 'system', 'user', 'assistant', 'tool', 'developer'"),
        ([{"role": "robot", "content": "hi"}], "messages[0].role must be one of"),
        ([*ALTERNATING[:2], {"role": "user"}], "messages[2].content must be a string or a list of text parts"),
        ([*ALTERNATING[:2], {"role": "user", "content": 7}], "messages[2].content must be a string or a list of text"),
        ([{"role": "user", "content": []}], "messages[0].content must be a string or a list of text parts"),
        ([{"role": "user", "content": ["hi"]}], "messages[0].content[0] must be an object with a 'type' ('text')"),
        ([{"role": "user", "content": [{"type": "text", "text": None}]}], "messages[0].content[0].text must be a str"),
        (
            [{"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {}}]}],
            "messages[0].content[1] is a 'image_url' part: this endpoint serves text models and takes 'text' parts",
        ),
        ([{"role": "user", "content": "hi", "name": 3}], "messages[0].name must be a string"),
        (
            [{"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}],
            "messages[0].tool_calls: tool calls are not supported",
        ),
    ],
)
def test_bad_messages_are_refused_naming_the_field(models, messages, error):
    with pytest.raises(ChatError) as refused:
        ChatTemplates().render(str(models["demo"]), messages)
    assert error in str(refused.value)
    assert not isinstance(refused.value, NoChatTemplate) and refused.value.param == "messages"
    assert isinstance(refused.value, ValueError)


def test_a_model_without_a_chat_template_points_at_completions(models, tmp_path):
    for path in (models["plain"], tmp_path):  # a config without the key; no tokenizer_config.json at all
        with pytest.raises(NoChatTemplate) as refused:
            ChatTemplates().render(str(path), ONE_TURN)
        message = str(refused.value)
        assert "no chat template in its tokenizer_config.json" in message and "/v1/completions" in message
        assert isinstance(refused.value, ChatError) and refused.value.param == "model"


def test_the_default_of_named_templates_is_used_and_chat_template_jinja_wins(tmp_path):
    named = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "{{ messages[0].content }}!"}]
    path = model_dir(tmp_path, "named", named)
    assert ChatTemplates().render(str(path), ONE_TURN) == transformers_render(path, ONE_TURN) == "Hello world!"

    (path / "chat_template.jinja").write_text("FILE {{ messages | length }}")  # as save_pretrained writes it now
    assert ChatTemplates().render(str(path), ONE_TURN) == transformers_render(path, ONE_TURN) == "FILE 1"

    no_default = model_dir(tmp_path, "no-default", named[:1])
    with pytest.raises(NoChatTemplate, match=r"names chat templates \('tool_use'\) but no 'default' one"):
        ChatTemplates().render(str(no_default), ONE_TURN)


def test_a_template_that_raises_refuses_with_its_own_message(models):
    with pytest.raises(ChatError, match="Conversation roles must alternate user/assistant") as refused:
        ChatTemplates().render(str(models["mistral"]), [SYSTEM, *ONE_TURN])
    assert type(refused.value) is ChatError


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__ }}",
        "{% if raise_exception.__globals__ %}leak{% endif %}",
        "{{ messages.append({'role': 'user', 'content': 'injected'}) }}",
        "{% set ns = namespace(_private=1) %}{{ ns._private }}",
        "{{ dict.__call__.__globals__ }}",
    ],
)
def test_the_sandbox_refuses_what_a_template_must_not_reach(tmp_path, template):
    path = model_dir(tmp_path, "evil", template)
    with pytest.raises(ChatError, match="sandbox forbids|failed on these messages"):
        ChatTemplates().render(str(path), ONE_TURN)


def test_a_broken_template_or_config_blames_the_model_directory(tmp_path):
    broken = model_dir(tmp_path, "broken", "{% for message in messages %}never closed")
    with pytest.raises(BadChatTemplate, match="cannot be compiled"):
        ChatTemplates().render(str(broken), ONE_TURN)
    (tmp_path / "bad-json").mkdir()
    (tmp_path / "bad-json" / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(BadChatTemplate, match="tokenizer_config.json cannot be read"):
        ChatTemplates().render(str(tmp_path / "bad-json"), ONE_TURN)


def test_each_template_is_read_and_compiled_once(tmp_path):
    path = model_dir(tmp_path, "cached", "{{ messages[0].content }}")
    templates = ChatTemplates()
    first = templates.get(str(path))
    (path / "tokenizer_config.json").unlink()
    assert templates.get(str(path)) is first
    assert templates.render(str(path), ONE_TURN) == "Hello world"


def test_rendering_imports_neither_torch_nor_transformers(models):
    code = (
        "import sys; from agent.serving.chat import ChatTemplates;"
        f"print(ChatTemplates().render({str(models['demo'])!r}, [{{'role': 'user', 'content': 'hi'}}]));"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("<s><|user|>\nhi</s>\n<|assistant|>\n")
