"""OpenAI chat messages to prompt text, with the chat template in the model's own directory.

Rendered as transformers' `apply_chat_template(..., add_generation_prompt=True)` renders it: a jinja2
ImmutableSandboxedEnvironment with the same options, filters and globals, and the special tokens from
tokenizer_config.json as variables. Chat templates come with downloaded models, so they are untrusted code:
the sandbox applies, and reaching for an unsafe attribute fails the request instead of rendering nothing.
No torch, no transformers: this runs in the daemon.

The text keeps the template's special tokens (`<s>`, `<|im_start|>`, ...) as text; tokenize it WITHOUT
adding special tokens again (`TextCodec.encode_plain`), as apply_chat_template(tokenize=True) does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

ROLES = ("system", "user", "assistant", "tool", "developer")
# The named special tokens transformers passes to every template (PreTrainedTokenizerBase.special_tokens_map).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class ChatError(ValueError):
    """The chat cannot be turned into a prompt; the message says why (a 400 for the client)."""

    param = "messages"


class NoChatTemplate(ChatError):
    """The model directory has no chat template: it takes plain prompts only."""

    param = "model"


class BadChatTemplate(ChatError):
    """The model's template or tokenizer_config.json cannot be read or compiled: the model directory is at fault."""

    param = "model"


@dataclass(frozen=True)
class ChatTemplate:
    """One model's compiled template and the special-token variables it is rendered with."""

    template: jinja2.Template
    special_tokens: dict[str, str]

    def render(self, messages: list[dict[str, str]]) -> str:
        """Prompt text for already-parsed `messages`, ending with the assistant's turn opened."""
        try:
            # tools and documents are None, not undefined, as transformers passes them: templates test `is not none`.
            return self.template.render(
                messages=messages, tools=None, documents=None, add_generation_prompt=True, **self.special_tokens
            )
        except _TemplateRefusal as e:
            raise ChatError(f"the model's chat template refuses these messages: {e.message}") from None
        except SecurityError as e:
            raise ChatError(f"the model's chat template did something the sandbox forbids: {e}") from None
        except Exception as e:  # a template is code from the model's authors: any error is about these messages
            raise ChatError(f"the model's chat template failed on these messages: {type(e).__name__}: {e}") from None


class ChatTemplates:
    """Each model directory's chat template, read and compiled once."""

    def __init__(self) -> None:
        self._environment = _environment()
        self._templates: dict[str, ChatTemplate] = {}

    def get(self, model_path: str) -> ChatTemplate:
        """The template of `model_path`; NoChatTemplate or BadChatTemplate when there is none to use."""
        if model_path not in self._templates:
            self._templates[model_path] = _load(Path(model_path), self._environment)
        return self._templates[model_path]

    def render(self, model_path: str, messages: Any) -> str:
        """Prompt text for OpenAI chat `messages` (the request's raw JSON value). The model is checked first
        (NoChatTemplate, BadChatTemplate), then the messages and the rendering (ChatError)."""
        template = self.get(model_path)
        return template.render(parse_messages(messages))


def parse_messages(raw: Any) -> list[dict[str, str]]:
    """OpenAI chat messages as the plain dicts a template reads; ChatError naming the first bad field.

    Text parts are joined with newlines (as vLLM does); `developer`, OpenAI's newer name for the system
    role, becomes `system`, the role chat templates know. Other fields of a message are ignored.
    """
    if not isinstance(raw, list) or not raw:
        raise ChatError("'messages' must be a non-empty list of messages")
    return [_message(i, m) for i, m in enumerate(raw)]


def _message(index: int, raw: Any) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise ChatError(f"{where} must be an object with 'role' and 'content'")
    role = raw.get("role")
    if role not in ROLES:
        raise ChatError(f"{where}.role must be one of {', '.join(repr(r) for r in ROLES)}")
    if raw.get("tool_calls"):
        raise ChatError(f"{where}.tool_calls: tool calls are not supported; send the assistant's text as content")
    message = {"role": "system" if role == "developer" else role, "content": _content(raw.get("content"), where)}
    for key in ("name", "tool_call_id"):
        value = raw.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise ChatError(f"{where}.{key} must be a string")
            message[key] = value
    return message


def _content(raw: Any, where: str) -> str:
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list) or not raw:
        raise ChatError(f"{where}.content must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(raw):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise ChatError(f"{where}.content[{j}] must be an object with a 'type' ('text')")
        if kind != "text":
            raise ChatError(
                f"{where}.content[{j}] is a {kind[:40]!r} part: this endpoint serves text models and takes "
                "'text' parts only"
            )
        if not isinstance(part.get("text"), str):
            raise ChatError(f"{where}.content[{j}].text must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


def _load(directory: Path, environment: jinja2.Environment) -> ChatTemplate:
    config_file = directory / "tokenizer_config.json"
    config = _read_json(config_file)
    source = _template_source(directory, config)
    try:
        template = environment.from_string(source)
    except TemplateError as e:
        raise BadChatTemplate(f"the model's chat template cannot be compiled: {e}") from None
    return ChatTemplate(template, _special_tokens(directory, config))


def _template_source(directory: Path, config: dict[str, Any]) -> str:
    # As transformers loads it: chat_template.jinja (what save_pretrained writes now) wins over the
    # "chat_template" key; the key is a string, or a list of named templates of which "default" is used.
    file = directory / "chat_template.jinja"
    if file.is_file():
        try:
            return file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise BadChatTemplate(f"{file.name} cannot be read ({e})") from None
    value = config.get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if "default" not in named:
            names = ", ".join(repr(n) for n in named if isinstance(n, str)) or "none"
            raise NoChatTemplate(
                f"the model's tokenizer_config.json names chat templates ({names}) but no 'default' one; "
                "send the prompt text to /v1/completions instead"
            )
        value = named["default"]
    if value is None:
        raise NoChatTemplate(
            "the model has no chat template in its tokenizer_config.json ('chat_template'), so it cannot take chat "
            "messages; send the prompt text to /v1/completions instead"
        )
    if not isinstance(value, str):
        raise BadChatTemplate("'chat_template' in the model's tokenizer_config.json must be a string")
    return value


def _special_tokens(directory: Path, config: dict[str, Any]) -> dict[str, str]:
    values = {key: config.get(key) for key in SPECIAL_TOKENS}
    legacy = directory / "special_tokens_map.json"
    if "added_tokens_decoder" not in config and legacy.is_file():
        # transformers still reads this older file then, and lets it override the config's tokens.
        values.update({k: v for k, v in _read_json(legacy).items() if k in SPECIAL_TOKENS})
    tokens = {}
    for key, value in values.items():
        if isinstance(value, dict):  # a serialised AddedToken: {"content": "<s>", "lstrip": false, ...}
            value = value.get("content")
        if isinstance(value, str):
            tokens[key] = value
    return tokens


def _read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        return {}
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadChatTemplate(f"the model's {file.name} cannot be read ({e})") from None
    if not isinstance(value, dict):
        raise BadChatTemplate(f"the model's {file.name} must hold a JSON object")
    return value


class _TemplateRefusal(TemplateError):
    """What `raise_exception(message)` raises: the template's own words about the messages."""


class _Sandbox(ImmutableSandboxedEnvironment):
    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        # Jinja renders an unsafe attribute as an empty undefined; a template that reaches for `__class__` is not
        # one to trust with the rest of the prompt either.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering keeps the text."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_keep"), [], [], body).set_lineno(lineno)

    def _keep(self, caller: Any) -> str:
        return caller()


class _TemplateDict:
    # `dict(...)` and `dict.fromkeys(...)` without handing the template the dict type itself.
    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(Namespace):
    # Like jinja's namespace, but it refuses underscore names, which lead to CPython internals (as transformers).
    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's signature, so namespace(self=...) works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template cannot store the underscore name {name!r} on a namespace")


def _raise_exception(message: Any) -> None:
    raise _TemplateRefusal(str(message))


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Unlike jinja's own tojson, no HTML escaping: the output is a prompt, not a web page.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> jinja2.Environment:
    environment = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["dict"] = _TemplateDict()
    environment.globals["namespace"] = _TemplateNamespace
    return environment
