// The Anthropic TypeScript SDK, unchanged, through a rebound route (tests/e2e/test_hosts.py runs it):
// a message and a streamed message (`.finalMessage()`), as an app makes them, with a dummy key.
//
//   REBOUND_BASE_URL=http://127.0.0.1:PORT/claude FAKE_KEY=KEY node tests/clients/anthropic_hosts.mjs
//   node tests/clients/anthropic_hosts.mjs BASE_URL KEY
//
// FAKE_KEY is sent as `x-fake-key`, the fake provider's key (its scripts, counts, records).
// Prints one JSON object: for each call, the `x-rebound-upstream` that answered, the text, the
// usage, and for the stream its events' types and text deltas in order; an error as
// {"error": {"name", "status", "message"}} in that call's place.

import Anthropic from "@anthropic-ai/sdk";

const baseURL = process.argv[2] ?? process.env.REBOUND_BASE_URL;
const key = process.argv[3] ?? process.env.FAKE_KEY ?? "default";
if (!baseURL) {
  console.error("usage: node anthropic_hosts.mjs BASE_URL [KEY] (or REBOUND_BASE_URL, FAKE_KEY)");
  process.exit(2);
}

const client = new Anthropic({
  baseURL,
  apiKey: `sk-ant-test-${key}`,
  defaultHeaders: { "x-fake-key": key },
  timeout: 30_000,
});

const request = {
  model: "claude-fake",
  max_tokens: 64,
  messages: [{ role: "user", content: "Say hello" }],
};

function failure(e) {
  return { error: { name: e?.constructor?.name ?? typeof e, status: e?.status ?? null, message: String(e?.message ?? e) } };
}

async function message() {
  const { data, response } = await client.messages.create(request).withResponse();
  return {
    upstream: response.headers.get("x-rebound-upstream"),
    text: data.content.map((b) => b.text ?? "").join(""),
    usage: data.usage,
    stop_reason: data.stop_reason,
  };
}

async function streamed() {
  const stream = client.messages.stream(request);
  const events = [];
  const deltas = [];
  stream.on("streamEvent", (event) => {
    events.push(event.type);
    if (event.type === "content_block_delta" && event.delta.type === "text_delta") {
      deltas.push(event.delta.text);
    }
  });
  const { response } = await stream.withResponse();
  const final = await stream.finalMessage();
  return {
    upstream: response.headers.get("x-rebound-upstream"),
    events,
    deltas,
    text: final.content.map((b) => b.text ?? "").join(""),
    usage: final.usage,
    stop_reason: final.stop_reason,
  };
}

const out = {};
for (const [name, call] of [
  ["message", message],
  ["stream", streamed],
]) {
  try {
    out[name] = await call();
  } catch (e) {
    out[name] = failure(e);
  }
}
console.log(JSON.stringify(out));
