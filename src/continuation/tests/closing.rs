//! A stream cut after its message ended (a finish or stop reason came, its last event did not):
//! nothing to continue, its last event added so that it ends as a whole stream does.

use super::{claude, cut, gpt, sdk};
use crate::continuation::{Dialect, Plan, Refusal};

#[test]
fn a_stream_cut_after_its_message_ended_gets_its_last_event_and_nothing_else() {
    let chunk = |content: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let chat = format!("{}{}", chunk("Hello ", "null"), chunk("world", "\"stop\""));
    let (mut app, t) = cut(Dialect::Chat, &chat);
    assert_eq!(
        t.decide(gpt(false).to_string().as_bytes(), true),
        Plan::Refuse(Refusal::Ended)
    );
    app.extend_from_slice(t.closing().unwrap());
    assert_eq!(app, format!("{chat}data: [DONE]\n\n").into_bytes());
    let (_, whole) = cut(Dialect::Chat, &format!("{chat}data: [DONE]\n\n"));
    assert_eq!(whole.closing(), None, "nothing is missing");
    let (_, open) = cut(Dialect::Chat, &chunk("Hello ", "null"));
    assert_eq!(
        open.closing(),
        None,
        "the message had not ended: a continuation's business"
    );

    let anthropic = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"c\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello world\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":2}}\n\n",
    );
    let (mut app, t) = cut(Dialect::Messages, anthropic);
    assert_eq!(
        t.decide(claude().to_string().as_bytes(), true),
        Plan::Refuse(Refusal::Ended)
    );
    app.extend_from_slice(t.closing().unwrap());
    assert_eq!(sdk::anthropic(&app).text, "Hello world");
    let stopped = format!("{anthropic}event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n");
    assert_eq!(cut(Dialect::Messages, &stopped).1.closing(), None);
}
