"""The official `openai` Python client against `cera serve` (run by cera/tests/serve.rs).

Usage: python3 openai_client.py BASE_URL CHAT_PROMPT CHAT_TEXT RAW_PROMPT RAW_TEXT
where CHAT_TEXT and RAW_TEXT are `cera run --temp 0 -n 8` (and `--raw`) on the same prompts.
Exits non-zero with a message on the first mismatch.
"""
import sys

import json

import jsonschema
import openai

base, chat_prompt, chat_text, raw_prompt, raw_text = sys.argv[1:6]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
model = client.models.list().data[0].id
msgs = [{"role": "user", "content": chat_prompt}]


def check(cond, what):
    if not cond:
        sys.exit(f"openai client: {what}")


r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
check(r.choices[0].message.content == chat_text, f"chat text {r.choices[0].message.content!r} != {chat_text!r}")
check(r.choices[0].finish_reason == "length", f"finish_reason {r.choices[0].finish_reason}")
check(r.usage.completion_tokens == 8 and r.usage.total_tokens == r.usage.prompt_tokens + 8, f"usage {r.usage}")
lps = r.choices[0].logprobs.content
check(len(lps) == 8 and all(len(t.top_logprobs) == 2 and t.token == t.top_logprobs[0].token for t in lps), "chat logprobs")

stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True})
text, usage, finish = "", None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        text += c.delta.content or ""
        finish = c.finish_reason or finish
check(text == chat_text, f"streamed chat text {text!r} != {chat_text!r}")
check(finish == "length" and usage is not None and usage.completion_tokens == 8, f"streamed finish {finish}, usage {usage}")
check(usage.prompt_tokens_details.cached_tokens > 0, f"no cached tokens on a repeated prompt: {usage}")

r = client.completions.create(model=model, prompt=raw_prompt, max_tokens=8, temperature=0, logprobs=1)
check(r.choices[0].text == raw_text, f"completion text {r.choices[0].text!r} != {raw_text!r}")
check(len(r.choices[0].logprobs.tokens) == 8, "completion logprobs")
text = "".join(c.choices[0].text for c in client.completions.create(model=model, prompt=raw_prompt, max_tokens=8, temperature=0, stream=True) if c.choices)
check(text == raw_text, f"streamed completion text {text!r} != {raw_text!r}")

try:
    client.chat.completions.create(model=model, messages=msgs, temperature=9)
    check(False, "temperature 9 was accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "temperature" in str(e), f"bad temperature: {e}")
try:
    client.chat.completions.create(model="no-such-model", messages=msgs)
    check(False, "an unknown model was accepted")
except openai.NotFoundError as e:
    check(e.status_code == 404, f"unknown model: {e}")
# Structured output: five schemas (nested objects, arrays, enums, required and optional fields,
# numbers), each answer valid JSON that validates against its schema.
SCHEMAS = [
    {"type": "object", "properties": {"person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": False}}, "required": ["person"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 1, "maxItems": 4}}, "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}}, "required": ["color", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 24}, "year": {"type": "integer", "minimum": 1900, "maximum": 2100}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 2}}, "required": ["title", "year"], "additionalProperties": False},
    {"type": "object", "properties": {"points": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}, "y": {"type": "integer", "minimum": -9, "maximum": 9}}, "required": ["x", "y"], "additionalProperties": False}}}, "required": ["points"], "additionalProperties": False},
]
for i, schema in enumerate(SCHEMAS):
    fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
    ask = [{"role": "user", "content": "Answer with a JSON object."}]
    r = client.chat.completions.create(model=model, messages=ask, max_tokens=150, temperature=0, response_format=fmt)
    text = r.choices[0].message.content
    check(r.choices[0].finish_reason == "stop", f"schema {i}: finish_reason {r.choices[0].finish_reason}: {text!r}")
    jsonschema.validate(json.loads(text), schema)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(model=model, messages=ask, max_tokens=150, temperature=0, response_format=fmt, stream=True) if c.choices)
    check(streamed == text, f"schema {i}: streamed {streamed!r} != {text!r}")
try:
    client.chat.completions.create(model=model, messages=msgs, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "if": {"type": "object"}}}})
    check(False, "an unsupported schema keyword was accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "if" in str(e), f"unsupported schema keyword: {e}")
# Tools: `tool_choice: required` (and a named function, streamed) always gives a call whose
# arguments validate against the function's parameters; the call and its result go back in.
params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": False}
tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": params}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}}, "required": ["zone"], "additionalProperties": False}}}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
r = client.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice="required", max_tokens=80, temperature=0)
check(r.choices[0].finish_reason == "tool_calls", f"finish_reason {r.choices[0].finish_reason}")
call = r.choices[0].message.tool_calls[0]
check(call.function.name in ("get_weather", "get_time"), f"call {call}")
args = json.loads(call.function.arguments)
jsonschema.validate(args, tools[0]["function"]["parameters"] if call.function.name == "get_weather" else tools[1]["function"]["parameters"])
chunks = list(client.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=80, temperature=0, stream=True))
# The name comes first (with the id), then the arguments piece by piece, all at index 0.
deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
check(len(deltas) > 2 and deltas[0].function.name == "get_weather" and deltas[0].id, f"streamed tool calls {deltas}")
check(all(d.index == 0 and d.function.name is None for d in deltas[1:]), f"argument deltas {deltas}")
streamed_args = "".join(d.function.arguments or "" for d in deltas)
jsonschema.validate(json.loads(streamed_args), params)
check([c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls", "streamed finish_reason")
follow = ask + [{"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
                {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
r = client.chat.completions.create(model=model, messages=follow, tools=tools, max_tokens=8, temperature=0)
check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"after the tool: {r}")
print("openai client: ok")
