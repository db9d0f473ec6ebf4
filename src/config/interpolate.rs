//! `${VAR}` and `${VAR:-default}` in configuration strings, replaced from the environment.
//! `$${` writes a literal `${`. The environment is a parameter so that tests never touch the
//! process environment.

/// Replaces every `${VAR}` / `${VAR:-default}` in `s` using `env`. Errors say what is wrong in
/// words that complete "expected ...".
pub(crate) fn interpolate(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    if !s.contains('$') {
        return Ok(s.to_string());
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let end = tail
                .find('}')
                .ok_or_else(|| format!("a closing '}}' for the variable in {s:?}"))?;
            let inner = &tail[..end];
            let (name, default) = match inner.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (inner, None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("a variable name of letters, digits and '_' in ${{{inner}}}"));
            }
            match (env(name), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(format!(
                        "the environment variable {name} to be set (or a default: ${{{name}:-value}})"
                    ))
                }
            }
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "KEY" => Some("sk-123".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn replaces_and_defaults() {
        assert_eq!(interpolate("Bearer ${KEY}", &env).unwrap(), "Bearer sk-123");
        assert_eq!(interpolate("${MISSING:-5s}", &env).unwrap(), "5s");
        assert_eq!(interpolate("${MISSING:-}", &env).unwrap(), "");
        assert_eq!(interpolate("${EMPTY:-x}", &env).unwrap(), "");
        assert_eq!(interpolate("a$b $${KEY}", &env).unwrap(), "a$b ${KEY}");
        assert_eq!(interpolate("${KEY}${KEY}", &env).unwrap(), "sk-123sk-123");
    }

    #[test]
    fn errors_name_the_variable() {
        assert!(interpolate("${MISSING}", &env).unwrap_err().contains("MISSING"));
        assert!(interpolate("${KEY", &env).is_err());
        assert!(interpolate("${BAD-NAME}", &env).is_err());
        assert!(interpolate("${}", &env).is_err());
    }
}
