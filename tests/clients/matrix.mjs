// The Node half of the client matrix (tests/e2e/test_clients_node.py runs it): one client, as an
// app makes it (a base URL, a dummy key, the library's defaults: retries included), makes one
// kind of call through a rebound route, and prints what the app saw as one JSON line.
//
//   node tests/clients/matrix.mjs CLIENT ACTION BASE_URL KEY [API_KEY]
//
// CLIENT: `openai` (the OpenAI SDK, chat completions), `anthropic` (the Anthropic SDK, messages),
// `ai-openai` (the Vercel AI SDK with @ai-sdk/openai: its default model, the Responses API),
// `ai-anthropic` (the Vercel AI SDK with @ai-sdk/anthropic). The AI SDK's OpenAI stream goes
// through Chat Completions (`openai.chat(model)`): the fake provider's Responses API stream lacks
// `response.created_at` in its `response.created` event, which @ai-sdk/openai's schema requires.
// ACTION:
//   call    one call (generateText for the AI SDK);
//   stream  one streamed call, its text assembled (streamText for the AI SDK);
//   replay  the same call twice with the same `Idempotency-Key` (KEY-idem);
//   reuse   a call with `Idempotency-Key` KEY-reuse, then one with the same key and another body
//           (rebound's own 422 `idempotency_key_reused`).
// KEY is sent as `x-fake-key` on every request (the fake provider's scripts, counts, records);
// API_KEY is the client's (dummy) API key, `test-key-KEY` by default.
//
// Prints {"client", "action", "calls": [result, ...]}, a result per call in order:
//   {"ok": true, "text", "headers": {...}} or {"ok": false, "error": {...}};
// `headers` are the response's `x-rebound-*`, `idempotent-*`, `x-should-retry` and `retry-after*`
// headers where the client exposes them (null where it does not), and an error is what the app
// can read off the exception: its constructor, `name`, `message`, status, the client's type and
// code fields, the same headers, and for the AI SDK's RetryError its reason and every attempt's
// error.

import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { generateText, streamText } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";

const [client, action, baseURL, key, apiKeyArg] = process.argv.slice(2);
if (!client || !action || !baseURL || !key) {
  console.error("usage: node matrix.mjs CLIENT ACTION BASE_URL KEY");
  process.exit(2);
}

const TIMEOUT_MS = 30_000;
const PROMPT = "Say hello";
const OTHER_PROMPT = "Say goodbye";
const HEADER_PATTERN = /^(x-rebound-|idempotent-|x-should-retry$|retry-after)/i;

// Headers of interest from a fetch `Headers` or a plain record.
function pick(headers) {
  if (headers == null) return null;
  const entries = typeof headers.entries === "function" ? [...headers.entries()] : Object.entries(headers);
  const out = {};
  for (const [k, v] of entries) {
    if (HEADER_PATTERN.test(k)) out[k.toLowerCase()] = v;
  }
  return out;
}

function describe(e) {
  if (e == null || typeof e !== "object") return { constructor: typeof e, message: String(e) };
  const out = {
    constructor: e.constructor?.name ?? null,
    name: e.name ?? null,
    message: String(e.message ?? ""),
    // openai, @anthropic-ai/sdk: `status`; the AI SDK's APICallError: `statusCode`.
    status: e.status ?? e.statusCode ?? null,
  };
  if (e.type !== undefined) out.type = e.type; // openai: the error's type; anthropic: its type
  if (e.code !== undefined) out.code = e.code; // openai
  if (e.error !== undefined) out.body = e.error; // openai, anthropic: the parsed error body
  if (e.headers !== undefined) out.headers = pick(e.headers);
  if (e.responseHeaders !== undefined) out.headers = pick(e.responseHeaders);
  if (e.responseBody !== undefined) out.body = e.responseBody;
  if (e.isRetryable !== undefined) out.isRetryable = e.isRetryable;
  if (e.reason !== undefined) out.reason = e.reason; // the AI SDK's RetryError
  if (Array.isArray(e.errors)) out.errors = e.errors.map(describe);
  if (e.lastError !== undefined) out.lastError = describe(e.lastError);
  if (e.cause !== undefined && e.cause !== e) out.cause = describe(e.cause);
  return out;
}

const fakeHeaders = { "x-fake-key": key };
const apiKey = apiKeyArg ?? `test-key-${key}`;

function makeClient() {
  switch (client) {
    case "openai":
      return new OpenAI({ baseURL, apiKey, defaultHeaders: fakeHeaders, timeout: TIMEOUT_MS });
    case "anthropic":
      return new Anthropic({ baseURL, apiKey, defaultHeaders: fakeHeaders, timeout: TIMEOUT_MS });
    case "ai-openai":
      return createOpenAI({ baseURL, apiKey, headers: fakeHeaders });
    case "ai-anthropic":
      return createAnthropic({ baseURL, apiKey, headers: fakeHeaders });
    default:
      console.error(`unknown client ${client}`);
      process.exit(2);
  }
}

const sdk = makeClient();

// One call; `headers` are the call's extra request headers (an Idempotency-Key).
async function call(prompt, headers = {}) {
  const messages = [{ role: "user", content: prompt }];
  switch (client) {
    case "openai": {
      const { data, response } = await sdk.chat.completions
        .create({ model: "gpt-fake", messages }, { headers })
        .withResponse();
      return { text: data.choices[0].message.content, headers: pick(response.headers) };
    }
    case "anthropic": {
      const { data, response } = await sdk.messages
        .create({ model: "claude-fake", max_tokens: 64, messages }, { headers })
        .withResponse();
      return { text: data.content.map((b) => b.text ?? "").join(""), headers: pick(response.headers) };
    }
    default: {
      const model = client === "ai-openai" ? sdk("gpt-fake") : sdk("claude-fake");
      const result = await generateText({
        model,
        prompt,
        maxOutputTokens: 64,
        headers,
        abortSignal: AbortSignal.timeout(TIMEOUT_MS * 3),
      });
      return { text: result.text, headers: pick(result.response?.headers) };
    }
  }
}

async function stream(prompt) {
  const messages = [{ role: "user", content: prompt }];
  switch (client) {
    case "openai": {
      const { data, response } = await sdk.chat.completions
        .create({ model: "gpt-fake", messages, stream: true })
        .withResponse();
      let text = "";
      for await (const chunk of data) text += chunk.choices[0]?.delta?.content ?? "";
      return { text, headers: pick(response.headers) };
    }
    case "anthropic": {
      const s = sdk.messages.stream({ model: "claude-fake", max_tokens: 64, messages });
      let text = "";
      s.on("text", (delta) => {
        text += delta;
      });
      const { response } = await s.withResponse();
      await s.finalMessage();
      return { text, headers: pick(response.headers) };
    }
    default: {
      const model = client === "ai-openai" ? sdk.chat("gpt-fake") : sdk("claude-fake");
      // streamText does not throw: an error is a part of the stream (and `onError`).
      let failure;
      const result = streamText({
        model,
        prompt,
        maxOutputTokens: 64,
        abortSignal: AbortSignal.timeout(TIMEOUT_MS * 3),
        onError: ({ error }) => {
          failure ??= error;
        },
      });
      let text = "";
      for await (const part of result.fullStream) {
        if (part.type === "text-delta") text += part.text;
        if (part.type === "error") failure ??= part.error;
      }
      if (failure !== undefined) throw failure;
      const response = await result.response;
      return { text, headers: pick(response.headers) };
    }
  }
}

async function settle(p) {
  try {
    return { ok: true, ...(await p) };
  } catch (e) {
    return { ok: false, error: describe(e) };
  }
}

const calls = [];
switch (action) {
  case "call":
    calls.push(await settle(call(PROMPT)));
    break;
  case "stream":
    calls.push(await settle(stream(PROMPT)));
    break;
  case "replay": {
    const headers = { "Idempotency-Key": `${key}-idem` };
    calls.push(await settle(call(PROMPT, headers)));
    calls.push(await settle(call(PROMPT, headers)));
    break;
  }
  case "reuse": {
    const headers = { "Idempotency-Key": `${key}-reuse` };
    calls.push(await settle(call(PROMPT, headers)));
    calls.push(await settle(call(OTHER_PROMPT, headers)));
    break;
  }
  default:
    console.error(`unknown action ${action}`);
    process.exit(2);
}
console.log(JSON.stringify({ client, action, calls }));
