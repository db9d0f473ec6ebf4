//! Streams read as an SDK reads them: their events, and the text of a whole answer (`None` for
//! anything that is not one valid stream).

/// One SSE event: its name and its JSON data (comments and keep-alives dropped).
fn events(body: &str) -> Vec<(String, serde_json::Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .filter_map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event:")).unwrap_or("").trim();
            let data: Vec<&str> = e.lines().filter_map(|l| l.strip_prefix("data:")).collect();
            let data = data.join("\n");
            let data = data.trim();
            if data.is_empty() {
                return None;
            }
            let json = serde_json::from_str(data).unwrap_or(serde_json::Value::String(data.to_string()));
            Some((name.to_string(), json))
        })
        .collect()
}

/// The text of an Anthropic stream that is one message: one `message_start`, one
/// `message_delta`, one `message_stop` (last), no error, every block started is stopped, every
/// delta in block 0.
pub fn anthropic_text(body: &[u8]) -> Option<String> {
    let events = events(std::str::from_utf8(body).ok()?);
    let count = |t: &str| events.iter().filter(|(_, d)| d["type"] == t).count();
    let one = ["message_start", "message_delta", "message_stop"]
        .iter()
        .all(|t| count(t) == 1);
    let last = events.last().is_some_and(|(_, d)| d["type"] == "message_stop");
    if !one || !last || count("error") > 0 || count("content_block_start") != count("content_block_stop") {
        return None;
    }
    let mut text = String::new();
    for (_, d) in events.iter().filter(|(_, d)| d["type"] == "content_block_delta") {
        if d["index"] != 0 {
            return None;
        }
        text.push_str(d["delta"]["text"].as_str()?);
    }
    Some(text)
}

/// The text of a chat stream that is one completion: no error, one `finish_reason`, on its last
/// chunk, then `[DONE]`.
pub fn chat_text(body: &[u8]) -> Option<String> {
    let events = events(std::str::from_utf8(body).ok()?);
    let (done, chunks) = events.split_last()?;
    if chunks.is_empty() || done.1 != "[DONE]" || chunks.iter().any(|(_, d)| d.get("error").is_some()) {
        return None;
    }
    let finishes: Vec<usize> = (0..chunks.len())
        .filter(|&i| !chunks[i].1["choices"][0]["finish_reason"].is_null())
        .collect();
    if finishes != [chunks.len() - 1] {
        return None;
    }
    Some(
        chunks
            .iter()
            .filter_map(|(_, d)| d["choices"][0]["delta"]["content"].as_str())
            .collect(),
    )
}

/// The stream's last event is an error (Anthropic's `event: error`, OpenAI's `data: {"error":..}`).
pub fn ends_with_error(body: &[u8]) -> bool {
    let Ok(body) = std::str::from_utf8(body) else {
        return false;
    };
    events(body)
        .last()
        .is_some_and(|(name, data)| name == "error" || data.get("error").is_some())
}
