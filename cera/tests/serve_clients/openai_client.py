"""The official `openai` Python client against `cera serve` (run by cera/tests/serve.rs).

Usage: python3 openai_client.py BASE_URL CHAT_PROMPT CHAT_TEXT RAW_PROMPT RAW_TEXT
where CHAT_TEXT and RAW_TEXT are `cera run --temp 0 -n 8` (and `--raw`) on the same prompts.
Exits non-zero with a message on the first mismatch.
"""
import sys

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
print("openai client: ok")
