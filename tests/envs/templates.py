"""Chat templates that behave like two real tool-calling families, and tokenizers built on the tiny one.

Written for these tests (nothing is downloaded): each reproduces what ``relayrl.envs.chat`` depends on in
its family, quirks included, so the three formats are exercised the way real checkpoints exercise them.

* ``QWEN_TEMPLATE``: ChatML as in Qwen2.5. With ``tools=`` the system turn gets a ``# Tools`` section (one JSON
  schema per line inside ``<tools></tools>``, then how to write a ``<tool_call>``); without a system message
  a default one is written. ``tool`` messages are shown inside a ``user`` turn, consecutive ones sharing it,
  each wrapped in ``<tool_response>``; an assistant's ``tool_calls`` come out as ``<tool_call>`` JSON.
* ``LLAMA_TEMPLATE``: Llama 3.1 headers (``<|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>``), always
  a system turn, the tools as indented JSON at the head of the first user message with the instruction to
  answer ``{"name": ..., "parameters": ...}``; ``tool`` messages become ``ipython`` turns whose content is
  JSON-encoded (the real template's ``is iterable`` test is true for strings too, so a string result is
  shown quoted); one tool call per assistant turn.
* ``relayrl.models.tiny.CHAT_TEMPLATE``: plain ChatML without a tools section (the ``default`` format).
"""

from __future__ import annotations

from typing import Any

QWEN_DEFAULT_SYSTEM = "You are a careful assistant."

QWEN_TEMPLATE = (
    "{%- set has_system = messages and messages[0].role == 'system' -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    f"{{{{- messages[0].content if has_system else '{QWEN_DEFAULT_SYSTEM}' -}}}}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'"
    " ~ 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for t in tools -%}{{- '\\n' ~ (t | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '"
    " ~ 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    ' ~ \'{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- else -%}"
    f"{{{{- '<|im_start|>system\\n' ~ (messages[0].content if has_system else '{QWEN_DEFAULT_SYSTEM}')"
    " ~ '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' and loop.first -%}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' ~ m.content ~ '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}"
    "{{- '<|im_start|>assistant' -}}"
    "{%- if m.content -%}{{- '\\n' ~ m.content -}}{%- endif -%}"
    "{%- for c in m.tool_calls -%}"
    "{%- set f = c.function if c.function is defined else c -%}"
    "{%- set args = f.arguments if f.arguments is string else (f.arguments | tojson) -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' ~ f.name ~ '\", \"arguments\": ' ~ args ~ '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

LLAMA_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]

LLAMA_TEMPLATE = (
    "{%- macro header(role) -%}{{- '<|start_header_id|>' ~ role ~ '<|end_header_id|>\\n\\n' -}}{%- endmacro -%}"
    "{%- set has_system = messages and messages[0].role == 'system' -%}"
    "{%- set rest = messages[1:] if has_system else messages -%}"
    "{{- bos_token -}}"
    "{{- header('system') -}}"
    "{%- if tools -%}{{- 'Environment: ipython\\n' -}}{%- endif -%}"
    "{{- 'Cutting Knowledge Date: December 2023\\n\\n' -}}"
    "{{- (messages[0].content if has_system else '') ~ '<|eot_id|>' -}}"
    "{%- set ns = namespace(tools_shown=false) -%}"
    "{%- for m in rest -%}"
    "{%- if m.role == 'user' and tools and not ns.tools_shown -%}"
    "{%- set ns.tools_shown = true -%}"
    "{{- header('user') -}}"
    "{{- 'Given the following functions, please respond with a JSON for a function call with its proper '"
    " ~ 'arguments that best answers the given prompt.\\n\\nRespond in the format {\"name\": function name, '"
    " ~ '\"parameters\": dictionary of argument name and its value}. Do not use variables.\\n\\n' -}}"
    "{%- for t in tools -%}{{- (t | tojson(indent=4)) ~ '\\n\\n' -}}{%- endfor -%}"
    "{{- m.content ~ '<|eot_id|>' -}}"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}"
    "{%- if m.tool_calls | length != 1 -%}{{- raise_exception('one tool call per turn') -}}{%- endif -%}"
    "{%- set c = m.tool_calls[0] -%}"
    "{%- set f = c.function if c.function is defined else c -%}"
    "{{- header('assistant') -}}"
    "{{- '{\"name\": \"' ~ f.name ~ '\", \"parameters\": ' ~ (f.arguments | tojson) ~ '}<|eot_id|>' -}}"
    "{%- elif m.role in ('tool', 'ipython') -%}"
    "{{- header('ipython') -}}"
    "{%- if m.content is mapping or m.content is iterable -%}{{- m.content | tojson -}}"
    "{%- else -%}{{- m.content -}}{%- endif -%}"
    "{{- '<|eot_id|>' -}}"
    "{%- else -%}"
    "{{- header(m.role) ~ m.content ~ '<|eot_id|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- header('assistant') -}}{%- endif -%}"
)


def tiny_tokenizer(template: str) -> Any:
    """The tiny byte-level BPE tokenizer (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``) with ``template``."""
    from relayrl.models.tiny import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = template
    return tok


def llama_tokenizer() -> Any:
    """The tiny tokenizer with the Llama 3.1 header tokens, ``LLAMA_TEMPLATE`` and ``<|eot_id|>`` as EOS."""
    tok = tiny_tokenizer(LLAMA_TEMPLATE)
    tok.add_special_tokens({"additional_special_tokens": LLAMA_SPECIAL})
    tok.eos_token, tok.bos_token = "<|eot_id|>", "<|begin_of_text|>"
    return tok
