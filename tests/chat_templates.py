"""Chat templates of the tiny test tokenizers: plain ChatML, ChatML with <think>, Qwen2.5/Hermes
style tool calls (with and without a tool round trip), Qwen3's reasoning history, gpt-oss's
harmony, Qwen3-Coder's XML calls, Granite 3.3's and Mistral's tools, GLM-4.5's <arg_key> calls,
MiniMax-M2's <invoke> calls, with the special tokens each needs."""
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# ChatML whose assistant turn opens the reasoning (Qwen3's convention: enable_thinking=False writes
# an empty one instead), for the reasoning parser's tests.
THINK_CHATML = CHATML.replace("{{ '<|im_start|>assistant\n' }}",
                              "{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and not "
                              "enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{% else %}{{ '<think>\n' }}"
                              "{% endif %}")

# ChatML that renders tools as Qwen2.5 / Hermes templates do (a system turn listing them and the
# <tool_call> format, which selects the hermes parser), for the tool-call streaming tests.
HERMES_CHATML = ("{% if tools %}{{ '<|im_start|>system\nCall a function as <tool_call>{\"name\": ..., "
                 "\"arguments\": ...}</tool_call>. Functions:\n' }}{% for tool in tools %}{{ tool | tojson }}"
                 "{{ '\n' }}{% endfor %}{{ '<|im_end|>\n' }}{% endif %}" + CHATML)

# ChatML that writes a conversation's tool round trip as Qwen3 / Hermes templates do: the tools in a
# system turn, an assistant's calls as <tool_call> blocks of JSON (arguments as given: JSON text,
# or an object written with tojson), a tool result as a user turn in <tool_response>; for the
# pipeline's tool round trip.
HERMES_ROUND_TRIP = (
    "{% if tools %}{{ '<|im_start|>system\\nCall a function as <tool_call>{\"name\": ..., \"arguments\": ...}"
    "</tool_call>. Functions:\\n' }}{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'assistant' and message.tool_calls %}{{ '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{% for call in message.tool_calls %}{{ '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{% if call.function.arguments is string %}{{ call.function.arguments }}{% else %}"
    "{{ call.function.arguments | tojson }}{% endif %}{{ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% elif message.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + message.content + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# Qwen3's template as it treats reasoning: an assistant turn's `reasoning_content` (else what its
# content holds before </think>) is written in <think> only after the last user query (a tool-call
# loop), earlier reasoning is dropped; the answer's turn opens at <|im_start|>assistant (the model
# writes <think>), enable_thinking=False writes an empty one. Calls and results as HERMES_ROUND_TRIP.
QWEN3 = (
    "{% if tools %}{{ '<|im_start|>system\\nCall a function as <tool_call>{\"name\": ..., \"arguments\": ...}"
    "</tool_call>. Functions:\\n' }}{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
    "{% set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{% for message in messages[::-1] %}{% set index = (messages|length - 1) - loop.index0 %}"
    "{% if ns.multi_step_tool and message.role == 'user' and message.content is string and "
    "not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}"
    "{% set ns.multi_step_tool = false %}{% set ns.last_query_index = index %}{% endif %}{% endfor %}"
    "{% for message in messages %}{% set content = message.content if message.content is string else '' %}"
    "{% if message.role == 'assistant' %}{% set reasoning_content = '' %}"
    "{% if message.reasoning_content is string %}{% set reasoning_content = message.reasoning_content %}"
    "{% elif '</think>' in content %}"
    "{% set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{% if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}"
    "{{ '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + "
    "content.lstrip('\\n') }}{% else %}{{ '<|im_start|>assistant\\n' + content }}{% endif %}"
    "{% for call in message.tool_calls or [] %}{% if content or not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{% if call.function.arguments is string %}{{ call.function.arguments }}{% else %}"
    "{{ call.function.arguments | tojson }}{% endif %}{{ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% elif message.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + content + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% endif %}{% endif %}")

# gpt-oss's harmony format, written small: a system turn with the reasoning effort, the tools as a
# developer turn's TypeScript-like namespace, past calls on the commentary channel to
# functions.NAME (after their reasoning on the analysis channel: the message's `thinking`, or its
# content, never both, as gpt-oss's template takes them, until a final answer follows),
# results from functions.NAME; the answer opens at <|start|>assistant. Its markers
# are special tokens of the tokenizer (HARMONY_TOKENS; tiny_with_template(..., HARMONY_TOKENS)).
HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
HARMONY = (
    "{{ '<|start|>system<|message|>You are a tiny model.\\nReasoning: ' + (reasoning_effort if reasoning_effort "
    "is defined else 'medium') + '\\n# Valid channels: analysis, commentary, final.<|end|>' }}"
    "{% if tools %}{{ '<|start|>developer<|message|># Tools\\nnamespace functions {\\n' }}{% for tool in tools %}"
    "{{ '// ' + (tool.function.description or '') + '\\ntype ' + tool.function.name + ' = (_: ' }}"
    "{{ tool.function.parameters | tojson }}{{ ') => any;\\n' }}{% endfor %}{{ '} // namespace functions<|end|>' }}"
    "{% endif %}{% for message in messages %}"
    "{% if message.role == 'assistant' and message.tool_calls %}{% set answered = namespace(found=false) %}"
    "{% for later in messages[loop.index:] %}{% if later.role == 'assistant' and 'tool_calls' not in later %}"
    "{% set answered.found = true %}{% endif %}{% endfor %}"
    "{% if message.content and message.thinking %}{{ raise_exception('Cannot pass both content and thinking in an "
    "assistant message with tool calls!') }}{% elif (message.content or message.thinking) and not answered.found %}"
    "{{ '<|start|>assistant<|channel|>analysis<|message|>' + (message.content or message.thinking) + '<|end|>' }}"
    "{% endif %}{% for call in message.tool_calls %}"
    "{{ '<|start|>assistant<|channel|>commentary to=functions.' + call.function.name + ' <|constrain|>json<|message|>' }}"
    "{% if call.function.arguments is string %}{{ call.function.arguments }}{% else %}"
    "{{ call.function.arguments | tojson }}{% endif %}{{ '<|call|>' }}{% endfor %}"
    "{% elif message.role == 'tool' %}{{ '<|start|>functions.' + message.name + ' to=assistant<|channel|>commentary"
    "<|message|>' + message.content + '<|end|>' }}"
    "{% elif message.role == 'assistant' %}{{ '<|start|>assistant<|channel|>final<|message|>' + message.content + "
    "'<|end|>' }}"
    "{% else %}{{ '<|start|>' + message.role + '<|message|>' + message.content + '<|end|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}")

# Qwen3-Coder's template as it treats tools, written small: the tools as <tools> XML in the system turn
# (each parameter's name, type, description, then its other keys through a render_extra_keys macro:
# mappings and lists as JSON, anything else as text), past calls as <tool_call><function=NAME>
# <parameter=ARG> blocks (a mapping or list value as JSON, anything else as text: True, 3), their
# arguments read with |items (a mapping, not JSON text), a run of results in one user turn. Its
# <function= and <parameter= markers select the qwen3_coder parser.
QWEN3_CODER = (
    "{% macro render_extra_keys(json_dict, handled_keys) %}{%- if json_dict is mapping %}"
    "{%- for json_key in json_dict if json_key not in handled_keys %}"
    "{%- if json_dict[json_key] is mapping or (json_dict[json_key] is sequence and json_dict[json_key] is not string) %}"
    "{{- '\\n<' ~ json_key ~ '>' ~ (json_dict[json_key] | tojson | safe) ~ '</' ~ json_key ~ '>' }}"
    "{%- else %}{{- '\\n<' ~ json_key ~ '>' ~ (json_dict[json_key] | string) ~ '</' ~ json_key ~ '>' }}{%- endif %}"
    "{%- endfor %}{%- endif %}{% endmacro %}"
    "{%- if messages[0].role == 'system' %}{%- set system_message = messages[0].content %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- if not tools is defined %}{%- set tools = [] %}{%- endif %}"
    "{%- if system_message is defined %}{{- '<|im_start|>system\\n' + system_message }}"
    "{%- elif tools | length > 0 %}{{- '<|im_start|>system\\nYou are Qwen, a coding agent.' }}{%- endif %}"
    "{%- if tools | length > 0 %}{{- '\\n\\n# Tools\\n\\n<tools>' }}{%- for tool in tools %}"
    "{%- if tool.function is defined %}{%- set tool = tool.function %}{%- endif %}"
    "{{- '\\n<function>\\n<name>' ~ tool.name ~ '</name>' }}"
    "{%- if tool.description is defined %}{{- '\\n<description>' ~ (tool.description | trim) ~ '</description>' }}{%- endif %}"
    "{{- '\\n<parameters>' }}{%- for param_name, param_fields in tool.parameters.properties|items %}"
    "{{- '\\n<parameter>\\n<name>' ~ param_name ~ '</name>' }}"
    "{%- if param_fields.type is defined %}{{- '\\n<type>' ~ (param_fields.type | string) ~ '</type>' }}{%- endif %}"
    "{%- if param_fields.description is defined %}{{- '\\n<description>' ~ (param_fields.description | trim) ~ "
    "'</description>' }}{%- endif %}{{- render_extra_keys(param_fields, ['name', 'type', 'description']) }}"
    "{{- '\\n</parameter>' }}{%- endfor %}{{- render_extra_keys(tool.parameters, ['type', 'properties']) }}"
    "{{- '\\n</parameters>\\n</function>' }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:\\n\\n"
    "<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n"
    "</function>\\n</tool_call>' }}{%- endif %}"
    "{%- if system_message is defined or tools | length > 0 %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls is defined and message.tool_calls | length > 0 %}"
    "{{- '<|im_start|>' + message.role }}"
    "{%- if message.content is string and message.content | trim | length > 0 %}"
    "{{- '\\n' + message.content | trim + '\\n' }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
    "{%- for args_name, args_value in tool_call.arguments|items %}{{- '<parameter=' + args_name + '>\\n' }}"
    "{%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and "
    "args_value is not string) else args_value | string %}{{- args_value }}{{- '\\n</parameter>\\n' }}{%- endfor %}"
    "{{- '</function>\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}{%- if loop.previtem and loop.previtem.role != 'tool' %}"
    "{{- '<|im_start|>user\\n' }}{%- endif %}{{- '<tool_response>\\n' + message.content + '\\n</tool_response>\\n' }}"
    "{%- if not loop.last and loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}"
    "{%- elif loop.last %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

# Granite 3.3's template as it treats tools, written small: `tools` aliased to available_tools and
# written as JSON (indent 4) in an available_tools turn after the system turn (a default one naming the
# <|tool_call|> format when the conversation brings none); every message, a call's turn and a tool
# result included, as its role and its content only (the template writes no calls); `thinking` (a
# template kwarg) asks in the default system turn for <think></think> and <response></response>, as
# 3.3's does. Its markers are special tokens of the tokenizer (GRANITE_TOKENS).
GRANITE_TOKENS = ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<|tool_call|>")
GRANITE = (
    "{%- if tools and not available_tools -%}{%- set available_tools = tools -%}{%- endif -%}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set system_message = 'You are Granite, developed by IBM.' %}"
    "{%- if available_tools %}{%- set system_message = system_message + ' You are a helpful assistant with access to "
    "the following tools. When a tool is required to answer the user\\'s query, respond only with <|tool_call|> "
    "followed by a JSON list of tools used.' %}{%- endif %}{%- if thinking %}{%- set system_message = system_message + "
    "' Write your thoughts between <think></think> and write your response between <response></response> for each "
    "user query.' %}{%- endif %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_of_text|>\\n' }}"
    "{%- if available_tools %}{{- '<|start_of_role|>available_tools<|end_of_role|>' }}"
    "{{- available_tools | tojson(indent=4) }}{{- '<|end_of_text|>\\n' }}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content'] + '<|end_of_text|>\\n' }}"
    "{%- if loop.last and add_generation_prompt %}{{- '<|start_of_role|>assistant<|end_of_role|>' }}{%- endif %}"
    "{%- endfor %}")

# Mistral's v0.3 template as it treats tools, written small: the tools as JSON in [AVAILABLE_TOOLS]
# before the last user turn, past calls as [TOOL_CALLS] and a JSON list of {"name", "arguments"}, a
# result in [TOOL_RESULTS]; the answer follows [/INST]. Its markers are special tokens of the
# tokenizer (MISTRAL_TOKENS), [TOOL_CALLS] selecting the mistral parser.
MISTRAL_TOKENS = ("[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]",
                  "[/TOOL_RESULTS]")
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message.role == 'user' %}{% if loop.last and tools %}{{ '[AVAILABLE_TOOLS] ' + (tools | tojson) + "
    "'[/AVAILABLE_TOOLS]' }}{% endif %}{{ '[INST] ' + message.content + '[/INST]' }}"
    "{% elif message.role == 'assistant' and message.tool_calls %}{{ '[TOOL_CALLS] [' }}"
    "{% for call in message.tool_calls %}{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}"
    "{% if not loop.last %}{{ ', ' }}{% endif %}{% endfor %}{{ ']' + eos_token }}"
    "{% elif message.role == 'tool' %}{{ '[TOOL_RESULTS] ' + ({'content': message.content} | tojson) + "
    "'[/TOOL_RESULTS]' }}{% else %}{{ ' ' + message.content + eos_token }}{% endif %}{% endfor %}")

# GLM-4.5's template as it treats tools and reasoning, written small: [gMASK]<sop>, then the tools as
# JSON lines in <tools> in a system turn that shows the call format; <|system|>, <|user|> (with
# /nothink when enable_thinking is false), <|assistant|>, whose reasoning after the last user turn is
# kept in <think>...</think> and is an empty <think></think> elsewhere; its calls as <tool_call>NAME
# and <arg_key>/<arg_value> lines (a string value as it is, any other as JSON, arguments read with
# .items(): a mapping); a run of tool results in one <|observation|> turn, each in <tool_response>.
# The answer opens at <|assistant|> (the model writes <think>); enable_thinking=False closes an empty
# one. Its <arg_key> selects the glm45 parser, its <think> the think reasoning parser.
GLM45_SPECIAL = ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")
GLM45_ADDED = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
GLM45 = (
    "[gMASK]<sop>"
    "{%- if tools %}{{- '<|system|>\\n# Tools\\n\\nYou may call functions. Their signatures, one a line, in '"
    "'<tools></tools>:\\n<tools>\\n' }}{%- for tool in tools %}{{- tool | tojson(ensure_ascii=False) }}{{- '\\n' }}"
    "{%- endfor %}{{- '</tools>\\n\\nWrite a call as:\\n<tool_call>{function-name}\\n<arg_key>{arg-key-1}</arg_key>\\n'"
    "'<arg_value>{arg-value-1}</arg_value>\\n...\\n</tool_call>' }}{%- endif %}"
    "{%- set ns = namespace(last_user=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{%- set content = m.content if m.content is string else '' %}"
    "{%- if m.role == 'user' %}{{- '<|user|>\\n' + content }}"
    "{%- if enable_thinking is defined and not enable_thinking and not content.endswith('/nothink') %}"
    "{{- '/nothink' }}{%- endif %}"
    "{%- elif m.role == 'assistant' %}{{- '<|assistant|>' }}{%- set reasoning = '' %}"
    "{%- if m.reasoning_content is string %}{%- set reasoning = m.reasoning_content %}"
    "{%- elif '</think>' in content %}{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}"
    "{%- set content = content.split('</think>')[-1] %}{%- endif %}"
    "{%- if loop.index0 > ns.last_user and reasoning.strip() %}{{- '\\n<think>' + reasoning.strip() + '</think>' }}"
    "{%- else %}{{- '\\n<think></think>' }}{%- endif %}"
    "{%- if content.strip() %}{{- '\\n' + content.strip() }}{%- endif %}"
    "{%- for tc in m.tool_calls or [] %}{%- set tc = tc.function if tc.function is defined else tc %}"
    "{{- '\\n<tool_call>' + tc.name + '\\n' }}{%- for k, v in tc.arguments.items() %}"
    "{{- '<arg_key>' + k + '</arg_key>\\n<arg_value>' }}{{- v if v is string else v | tojson(ensure_ascii=False) }}"
    "{{- '</arg_value>\\n' }}{%- endfor %}{{- '</tool_call>' }}{%- endfor %}"
    "{%- elif m.role == 'tool' %}{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|observation|>' }}{%- endif %}{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- elif m.role == 'system' %}{{- '<|system|>\\n' + content }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{- '\\n<think></think>' }}{%- endif %}{%- endif %}")

# MiniMax-M2's template (M2.1's is the same) as it treats tools and reasoning, written small: ]~!b[ (its BOS)
# and the role markers ]~b]system, ]~b]user, ]~b]ai, ]~b]tool, each turn ended by [e~[ and a newline;
# the system turn (a default one when the conversation brings none) lists the tools, each function's
# JSON in <tool></tool> within <tools>, and shows the call format; an assistant turn's reasoning
# (`reasoning_content`, else what its content holds before </think>, which MiniMax's clients send
# back in the content) is written back in <think> only after the last user turn (a tool-call loop);
# its calls as one <minimax:tool_call> block of <invoke name="..."> lines, each argument a
# <parameter name="..."> (a string value as it is, any other as JSON, read with .items(): a
# mapping); a run of tool results in one ]~b]tool turn, each in <response>. The answer opens inside
# <think> (]~b]ai then <think> and a newline: M2 always reasons). Its <minimax:tool_call> selects the
# minimax_m2 parser, its <think> the think reasoning parser.
MINIMAX_SPECIAL = ("]~!b[", "]~b]", "[e~[")
MINIMAX_ADDED = ("<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>")
MINIMAX_M2 = (
    "{%- if messages and messages[0].role == 'system' %}{%- set system = messages[0].content %}"
    "{%- set conversation = messages[1:] %}{%- else %}{%- set system = 'You are a helpful assistant.' %}"
    "{%- set conversation = messages %}{%- endif %}"
    "{%- set ns = namespace(last_user=-1) %}{%- for m in conversation %}{%- if m.role == 'user' %}"
    "{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{{- ']~!b[]~b]system\\n' + system }}"
    "{%- if tools %}{{- '\\n\\n# Tools\\nYou may call one or more tools to assist with the user query.\\nHere are the '"
    "'tools available in JSONSchema format:\\n\\n<tools>\\n' }}{%- for tool in tools %}"
    "{{- '<tool>' + (tool.function | tojson(ensure_ascii=False)) + '</tool>\\n' }}{%- endfor %}"
    "{{- '</tools>\\n\\nWhen making tool calls, use XML format to invoke tools and pass parameters:\\n\\n'"
    "'<minimax:tool_call>\\n<invoke name=\"tool-name-1\">\\n<parameter name=\"param-key-1\">param-value-1</parameter>\\n'"
    "'<parameter name=\"param-key-2\">param-value-2</parameter>\\n...\\n</invoke>\\n</minimax:tool_call>' }}{%- endif %}"
    "{{- '[e~[\\n' }}"
    "{%- set last = namespace(called=false) %}{%- for m in conversation %}"
    "{%- set content = m.content if m.content is string else '' %}"
    "{%- if m.role == 'assistant' %}{{- ']~b]ai\\n' }}{%- set reasoning = '' %}"
    "{%- if m.reasoning_content is string %}{%- set reasoning = m.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].strip('\\n').split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].strip('\\n') %}{%- endif %}"
    "{%- if reasoning and loop.index0 > ns.last_user %}{{- '<think>\\n' + reasoning + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- content }}{%- if m.tool_calls %}{{- '\\n<minimax:tool_call>\\n' }}{%- for tc in m.tool_calls %}"
    "{%- set tc = tc.function if tc.function is defined else tc %}{{- '<invoke name=\"' + tc.name + '\">\\n' }}"
    "{%- for k, v in tc.arguments.items() %}{{- '<parameter name=\"' + k + '\">' }}"
    "{{- v if v is string else v | tojson(ensure_ascii=False) }}{{- '</parameter>\\n' }}{%- endfor %}"
    "{{- '</invoke>\\n' }}{%- endfor %}{{- '</minimax:tool_call>' }}{%- endif %}"
    "{%- set last.called = m.tool_calls is defined and m.tool_calls %}{{- '[e~[\\n' }}"
    "{%- elif m.role == 'tool' %}{%- if not last.called %}"
    "{{- raise_exception('Message has tool role, but there was no previous assistant message with a tool call!') }}"
    "{%- endif %}{%- if loop.first or conversation[loop.index0 - 1].role != 'tool' %}{{- ']~b]tool' }}{%- endif %}"
    "{{- '\\n<response>' + content + '</response>' }}"
    "{%- if loop.last or conversation[loop.index0 + 1].role != 'tool' %}{{- '[e~[\\n' }}{%- endif %}"
    "{%- elif m.role == 'user' %}{{- ']~b]user\\n' + content + '[e~[\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- ']~b]ai\\n<think>\\n' }}{%- endif %}")
