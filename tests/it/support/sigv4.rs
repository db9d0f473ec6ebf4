//! A SigV4 verifier written from AWS's specification, independent of the signer rebound uses: the
//! cloud tests check every signature the fake provider received with it, and the fake provider's
//! Bedrock host (`fake_hosts.rs`) refuses a request it does not verify, as AWS does. Its own file so
//! that the fake provider's example (`bench/fake_provider.rs`) includes it as it includes the
//! fake provider.

#![allow(dead_code)]

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(data: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, data).as_ref())
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    ring::hmac::sign(&key, data.as_bytes()).as_ref().to_vec()
}

/// SigV4's URI encoding of one path segment or query component (RFC 3986 unreserved kept).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Whether `authorization` is a valid SigV4 signature, with `secret`, of the request the fake
/// provider recorded (method, path, query, headers, body), per AWS's "Create a signed AWS API
/// request": the canonical request, the string to sign, the derived key.
pub fn sigv4_valid(
    secret: &str,
    method: &str,
    path: &str,
    query: Option<&str>,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<(), String> {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let auth = header("authorization").ok_or("no authorization header")?;
    let rest = auth.strip_prefix("AWS4-HMAC-SHA256 ").ok_or("not AWS4-HMAC-SHA256")?;
    let field = |name: &str| {
        rest.split(", ")
            .find_map(|p| p.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .map(str::to_string)
            .ok_or(format!("no {name}"))
    };
    let credential = field("Credential")?;
    let signed_headers = field("SignedHeaders")?;
    let signature = field("Signature")?;
    let scope: Vec<&str> = credential.split_once('/').ok_or("no scope")?.1.split('/').collect();
    let [date, region, service, "aws4_request"] = scope[..] else {
        return Err(format!("scope {scope:?}"));
    };
    let amz_date = header("x-amz-date").ok_or("no x-amz-date")?;
    // Every service but S3 encodes the path as sent once more ("double" encoding).
    let canonical_path = path.split('/').map(encode).collect::<Vec<_>>().join("/");
    let mut pairs: Vec<(String, String)> = query
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (encode(&k), encode(&v)))
                .collect()
        })
        .unwrap_or_default();
    pairs.sort();
    let canonical_query = pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let mut canonical_headers = String::new();
    for name in signed_headers.split(';') {
        let value = header(name).ok_or(format!("signed header {name} not sent"))?;
        canonical_headers.push_str(&format!("{name}:{}\n", value.trim()));
    }
    let canonical = format!(
        "{method}\n{canonical_path}\n{canonical_query}\n{canonical_headers}\n{signed_headers}\n{}",
        sha256(body)
    );
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{date}/{region}/{service}/aws4_request\n{}",
        sha256(canonical.as_bytes())
    );
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), date);
    for part in [region, service, "aws4_request"] {
        key = hmac(&key, part);
    }
    let expected = hex(&hmac(&key, &to_sign));
    match expected == signature {
        true => Ok(()),
        false => Err(format!(
            "signature {signature} != {expected}\ncanonical request:\n{canonical}"
        )),
    }
}
