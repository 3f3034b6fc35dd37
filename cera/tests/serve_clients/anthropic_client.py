"""The official `anthropic` Python client against `cera serve`'s /v1/messages (run by
cera/tests/serve.rs).

Usage: python3 anthropic_client.py BASE_URL PROMPT TEXT
where TEXT is `cera run --temp 0 -n 8 PROMPT`. Exits non-zero with a message on the first mismatch.
"""
import sys

import anthropic

base, prompt, expected = sys.argv[1:4]
client = anthropic.Anthropic(base_url=base, api_key="sesame", max_retries=0)
msgs = [{"role": "user", "content": prompt}]
# This client version takes no `temperature` argument: it goes in the body as it is.


def check(cond, what):
    if not cond:
        sys.exit(f"anthropic client: {what}")


m = client.messages.create(model="smol", max_tokens=8, extra_body={"temperature": 0}, messages=msgs)
check(m.type == "message" and m.role == "assistant", f"message {m}")
check(m.content[0].type == "text" and m.content[0].text == expected, f"text {m.content[0].text!r} != {expected!r}")
check(m.stop_reason == "max_tokens" and m.usage.output_tokens == 8, f"stop {m.stop_reason}, usage {m.usage}")

events, text = [], ""
with client.messages.stream(model="smol", max_tokens=8, extra_body={"temperature": 0}, messages=msgs) as s:
    for e in s:
        events.append(e.type)
        if e.type == "content_block_delta":
            text += e.delta.text
    final = s.get_final_message()
check(text == expected and final.content[0].text == expected, f"streamed {text!r} != {expected!r}")
check(events[0] == "message_start" and events[-1] == "message_stop" and "content_block_start" in events and "message_delta" in events, f"events {events}")
check(final.stop_reason == "max_tokens" and final.usage.output_tokens == 8, f"final {final.stop_reason} {final.usage}")

# A system prompt (top-level) and a stop sequence.
m = client.messages.create(model="smol", max_tokens=8, extra_body={"temperature": 0}, system="You are terse.", messages=msgs, stop_sequences=[expected.split(" ")[1]] if " " in expected else ["\n"])
check(m.stop_reason in ("stop_sequence", "end_turn", "max_tokens"), f"stop {m.stop_reason}")
try:
    client.messages.create(model="smol", max_tokens=8, extra_body={"temperature": 3}, messages=msgs)
    check(False, "temperature 3 was accepted")
except anthropic.BadRequestError as e:
    check(e.status_code == 400 and "temperature" in str(e), f"bad temperature: {e}")
try:
    anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(model="smol", max_tokens=8, messages=msgs)
    check(False, "a wrong key was accepted")
except anthropic.AuthenticationError as e:
    check(e.status_code == 401, f"wrong key: {e}")
print("anthropic client: ok")
