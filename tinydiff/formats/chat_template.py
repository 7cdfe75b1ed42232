"""Chat templates: a conversation rendered to the text an instruct model was trained on.

A model's template is a Jinja2 program in its files: `chat_template.jinja` beside the tokenizer, or
tokenizer_config.json's "chat_template" (a string, or a list of {"name", "template"} whose
"default" is used), or GGUF's tokenizer.chat_template. It is rendered as transformers'
apply_chat_template renders it (utils/chat_template_utils.py), so the same conversation gives the
same text byte for byte (tests/test_chat_template.py against transformers' own output):
  - a sandboxed environment (ImmutableSandboxedEnvironment: a template is code from a download and
    must not reach Python's internals) with trim_blocks, lstrip_blocks and loop controls;
  - `tojson` that does not escape HTML (json.dumps, ensure_ascii=False), `raise_exception(msg)`,
    `strftime_now(fmt)`;
  - the variables messages, add_generation_prompt, tools (None), documents (None), the special
    tokens by name (bos_token, eos_token, unk_token, pad_token: tokenizer_config.json's strings)
    and any further keyword the caller gives (date_string, enable_thinking, ...).
The rendered text is tokenized without adding BOS/EOS (the template writes them), as transformers
does; the tokenizer cuts the template's special tokens out of the text (tokenizer.py).

Messages are checked before rendering: a list of {"role": ..., "content": str} with role system,
user, assistant or tool. A template that does not compile is a ModelError naming the file; one
that refuses the conversation (raise_exception: "roles must alternate", ...) is a UsageError with
its own message, since the conversation is the caller's.
"""
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ModelError, UsageError
from .files import show

ROLES = ("system", "user", "assistant", "tool", "ipython")   # ipython: Llama 3's tool results
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


class ChatTemplate:
    """source: the template's text; special_tokens: {"bos_token": "<s>", ...}; where: the file, for
    messages. Compiled at the first render, so a broken template stops a chat, never a model's
    loading for generate or info."""

    def __init__(self, source, special_tokens=None, where="chat template"):
        self.source, self.where = source, where
        self.special_tokens = dict(special_tokens or {})
        self._template = None

    def compiled(self):
        """self, compiled now rather than at its first rendering (a template the caller gives is
        checked before a conversation starts)."""
        self._template = self._template or _compile(self.source, self.where)
        return self

    def render(self, messages, add_generation_prompt=True, **variables):
        """The conversation as text, ending with the assistant's header if add_generation_prompt."""
        check_messages(messages)
        self.compiled()
        try:
            return self._template.render(messages=[dict(m) for m in messages], tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt,
                                         **{**self.special_tokens, **variables})
        except SecurityError as e:
            raise ModelError(f"{self.where}: the chat template reaches for what the sandbox forbids: "
                             f"{show(str(e))}") from None
        except jinja2.TemplateError as e:   # raise_exception(...), an undefined name used
            raise UsageError(f"{self.where}: the chat template refuses this conversation: {show(str(e))}") from None
        except Exception as e:   # the template's own bug (1/0, endless recursion, ...): a bad file
            raise ModelError(f"{self.where}: the chat template fails: {type(e).__name__}: {show(str(e))}") from None


class GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %} ... {% endgeneration %} (it marks the assistant's tokens for
    training masks); rendering, it is its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def check_messages(messages):
    if not isinstance(messages, (list, tuple)) or not messages:
        raise UsageError(f"messages must be a non-empty list of {{'role': ..., 'content': ...}}, got {show(repr(messages))}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise UsageError(f"message {i} must be a dict with 'role' and 'content', got {show(repr(m))}")
        if m["role"] not in ROLES:
            raise UsageError(f"message {i} has role {show(repr(m['role']))}; roles are {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            raise UsageError(f"message {i}: content must be text (str), got {type(m['content']).__name__}")


def check_variables(variables):
    """Extra template variables: a dict whose names are not the conversation's own."""
    if not isinstance(variables, dict):
        raise UsageError(f"variables must be a dict of template variables, got {type(variables).__name__}")
    clash = sorted({"messages", "add_generation_prompt"} & set(variables))
    if clash:
        raise UsageError(f"the template variable '{clash[0]}' is the conversation's own: give it another name")
    return variables


def _compile(source, where):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, GenerationTag])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ModelError(f"{where}: the chat template does not compile (line {e.lineno}): {show(e.message or '')}") from None


def load_chat_template(folder):
    """The folder's ChatTemplate (chat_template.jinja, else tokenizer_config.json's), or None.
    Its special tokens: tokenizer_config.json's, else special_tokens_map.json's (older repos)."""
    config_path = os.path.join(folder, "tokenizer_config.json")
    config = _read_json(config_path) if os.path.isfile(config_path) else {}
    map_path = os.path.join(folder, "special_tokens_map.json")
    tokens = {**(special_tokens(_read_json(map_path), map_path) if os.path.isfile(map_path) else {}),
              **special_tokens(config, config_path)}
    jinja_path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        try:
            with open(jinja_path, encoding="utf-8") as f:
                return ChatTemplate(f.read(), tokens, jinja_path)
        except (OSError, UnicodeDecodeError) as e:
            raise ModelError(f"{jinja_path}: cannot be read: {show(str(e))}") from None
    source = config.get("chat_template")
    if source is None:
        return None
    if isinstance(source, list):      # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        if "default" not in named:
            raise ModelError(f"{config_path}: chat_template lists templates {sorted(map(str, named))} but no 'default'")
        source = named["default"]
    if not isinstance(source, str):
        raise ModelError(f"{config_path}: chat_template should be a string, got {type(source).__name__}")
    return ChatTemplate(source, tokens, config_path)


def special_tokens(config, where):
    """{"bos_token": "<s>", ...} from tokenizer_config.json, where a token is a string or an
    AddedToken object {"content": ...}."""
    out = {}
    for name in SPECIAL_TOKENS:
        token = config.get(name)
        if isinstance(token, dict):
            token = token.get("content")
        if token is not None and not isinstance(token, str):
            raise ModelError(f"{where}: {name} should be a string or {{\"content\": ...}}, got {show(repr(token))}")
        if token is not None:
            out[name] = token
    return out


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}: cannot be read as JSON: {show(str(e))}") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: should hold a JSON object, got {type(data).__name__}")
    return data
