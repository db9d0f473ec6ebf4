//! `[upstreams.NAME]`: the URL, TLS trust, headers set on every request, circuit and cooldown.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

use super::super::raw::*;
use super::super::*;
use super::{names, Validator};

/// What `api` and the keys of its hosts say.
struct HostApi {
    api: ApiOf,
    gcp_project: Option<String>,
    gcp_location: Option<String>,
    azure_api_version: Option<String>,
}

impl Validator<'_> {
    pub(super) fn upstream(
        &mut self,
        name: &str,
        u: &RawUpstream,
        circuits: &BTreeMap<String, Arc<CircuitPolicy>>,
    ) -> Option<UpstreamConfig> {
        let key = |k: &str| format!("upstreams.{name}.{k}");
        let (scheme, authority, base_path) = self.upstream_url(name, u)?;
        let circuit = u.circuit.clone();
        if let Some(c) = &circuit {
            if !circuits.contains_key(c) {
                self.err(
                    &key("circuit"),
                    format!(
                        "expected the name of a [circuit.*] table ({}), found {c:?}",
                        names(circuits)
                    ),
                );
            }
        }
        let cooldown = self.choice(&key("cooldown"), &u.cooldown, CooldownMode::Wait, CooldownMode::CHOICES);
        let rate_limit_scope = self.choice(
            &key("rate_limit_scope"),
            &u.rate_limit_scope,
            RateLimitScope::Model,
            RateLimitScope::CHOICES,
        );
        let pacing = self.choice(&key("pacing"), &u.pacing, PacingMode::Wait, PacingMode::CHOICES);
        let pacing_reserve = self.int(&key("pacing_reserve"), u.pacing_reserve, 0, 0, 1_000_000);
        let ca_file = self.ca_file(&key("ca_file"), u.ca_file.as_deref());
        let set_headers = self.set_headers(name, u);
        let auth = self.auth(name, u, &authority, &set_headers);
        let sets_credential =
            auth != Auth::Static || set_headers.iter().any(|(h, _)| self.credentials.headers().contains(h));
        let api = self.api(name, u, &authority);
        let concurrency = self.upstream_concurrency(&key("concurrency"), u.concurrency.as_ref());
        Some(UpstreamConfig {
            name: name.to_string(),
            scheme,
            authority,
            base_path,
            connect_timeout: self.positive_duration(
                &key("connect_timeout"),
                &u.connect_timeout,
                Duration::from_secs(5),
            ),
            keepalive: self.keepalive(&key("keepalive"), &u.keepalive),
            circuit,
            cooldown,
            rate_limit_scope,
            pacing,
            pacing_reserve,
            ca_file,
            sets_credential,
            set_headers,
            auth,
            api: api.api,
            gcp_project: api.gcp_project,
            gcp_location: api.gcp_location,
            azure_api_version: api.azure_api_version,
            concurrency,
        })
    }

    /// `api` (else the host's) and the keys of the hosts whose paths name the model:
    /// `gcp_project` and `gcp_location` (Vertex AI; else `GOOGLE_CLOUD_PROJECT` and the host's
    /// region), `azure_api_version` (Azure OpenAI).
    fn api(&mut self, name: &str, u: &RawUpstream, authority: &http::uri::Authority) -> HostApi {
        let key = |k: &str| format!("upstreams.{name}.{k}");
        let api = match &u.api {
            Some(_) => ApiOf::Known(self.choice(&key("api"), &u.api, Api::OpenAi, Api::CHOICES)),
            None => ApiOf::of_host(authority.host()),
        };
        let vertex = matches!(
            api,
            ApiOf::Vertex | ApiOf::Known(Api::VertexAnthropic | Api::VertexGemini)
        );
        let azure = api == ApiOf::Known(Api::AzureOpenAi);
        let only = |v: &mut Self, k: &str, set: bool, expected: &str| {
            if set {
                v.err(&key(k), format!("expected only with {expected}"));
            }
        };
        let vertex_apis = "api = \"vertex-anthropic\" or \"vertex-gemini\" (or a Vertex AI host)";
        only(self, "gcp_project", !vertex && u.gcp_project.is_some(), vertex_apis);
        only(self, "gcp_location", !vertex && u.gcp_location.is_some(), vertex_apis);
        only(
            self,
            "azure_api_version",
            !azure && u.azure_api_version.is_some(),
            "api = \"azure-openai\" (or an Azure OpenAI host)",
        );
        let segment = |v: &mut Self, k: &str, raw: Option<&str>, example: &str| {
            let value = v.string(&key(k), raw)?;
            let fits = !value.is_empty()
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !fits {
                v.err(
                    &key(k),
                    format!("expected letters, digits, '-', '_' or '.' (e.g. {example}), found {value:?}"),
                );
            }
            fits.then_some(value)
        };
        let gcp_project = segment(self, "gcp_project", u.gcp_project.as_deref(), "\"my-project\"").or_else(|| {
            vertex
                .then(|| (self.env)("GOOGLE_CLOUD_PROJECT"))
                .flatten()
                .filter(|p| !p.is_empty())
        });
        let gcp_location = segment(self, "gcp_location", u.gcp_location.as_deref(), "\"us-east5\"")
            .or_else(|| vertex_location_of(authority.host()).map(str::to_string));
        let azure_api_version = segment(
            self,
            "azure_api_version",
            u.azure_api_version.as_deref(),
            "\"2024-10-21\"",
        );
        HostApi {
            api,
            gcp_project,
            gcp_location,
            azure_api_version,
        }
    }

    /// `auth` and the keys of the cloud it names: `aws_region` (else the host's, else
    /// `AWS_REGION`), `aws_service` (else the host's signing name) and `aws_role_arn` only with
    /// `auth = "aws"`; a cloud's credential is rebound's to set, never `set_headers`'.
    fn auth(
        &mut self,
        name: &str,
        u: &RawUpstream,
        authority: &http::uri::Authority,
        set_headers: &[(HeaderName, HeaderValue)],
    ) -> Auth {
        let key = |k: &str| format!("upstreams.{name}.{k}");
        let kind = self.choice(&key("auth"), &u.auth, AuthKind::Static, AuthKind::CHOICES);
        if kind != AuthKind::Aws {
            for (k, v) in [
                ("aws_region", &u.aws_region),
                ("aws_service", &u.aws_service),
                ("aws_role_arn", &u.aws_role_arn),
            ] {
                if v.is_some() {
                    self.err(
                        &key(k),
                        format!("expected only with auth = \"aws\", found auth = \"{}\"", kind.as_str()),
                    );
                }
            }
        }
        if kind != AuthKind::Static {
            let own = set_headers.iter().find(|(h, _)| {
                h == http::header::AUTHORIZATION
                    || h.as_str().starts_with("x-amz-")
                    || h == "x-api-key"
                    || h == "api-key"
                    || h == "x-goog-api-key"
            });
            if let Some((h, _)) = own {
                self.err(
                    &key("set_headers"),
                    format!("expected no `{h}`: auth = \"{}\" sets the credential", kind.as_str()),
                );
            }
        }
        match kind {
            AuthKind::Static => Auth::Static,
            AuthKind::Gcp => Auth::Gcp,
            AuthKind::Azure => Auth::Azure,
            AuthKind::Aws => {
                let host = authority.host();
                let region = self
                    .string(&key("aws_region"), u.aws_region.as_deref())
                    .or_else(|| aws_region_of(host).map(str::to_string))
                    .or_else(|| (self.env)("AWS_REGION").filter(|r| !r.is_empty()))
                    .or_else(|| (self.env)("AWS_DEFAULT_REGION").filter(|r| !r.is_empty()));
                let Some(region) = region else {
                    self.err(
                        &key("aws_region"),
                        "expected a region (e.g. \"us-east-1\"): the host names none, and AWS_REGION is not set",
                    );
                    return Auth::Static;
                };
                let service = self
                    .string(&key("aws_service"), u.aws_service.as_deref())
                    .unwrap_or_else(|| aws_service_of(host).to_string());
                let role_arn = self.string(&key("aws_role_arn"), u.aws_role_arn.as_deref());
                if let Some(arn) = role_arn.as_deref().filter(|a| !a.starts_with("arn:")) {
                    self.err(
                        &key("aws_role_arn"),
                        format!("expected a role ARN (arn:aws:iam::ACCOUNT:role/NAME), found {arn:?}"),
                    );
                }
                Auth::Aws(AwsAuth {
                    region,
                    service,
                    role_arn,
                })
            }
        }
    }

    /// `url`: an absolute http(s) URL without query or credentials; its path is a base prepended
    /// to forwarded paths.
    fn upstream_url(
        &mut self,
        name: &str,
        u: &RawUpstream,
    ) -> Option<(http::uri::Scheme, http::uri::Authority, String)> {
        let key = format!("upstreams.{name}.url");
        let Some(url) = self.string(&key, u.url.as_deref()) else {
            if u.url.is_none() {
                self.err(
                    &format!("upstreams.{name}"),
                    "expected a `url` key (e.g. url = \"https://api.openai.com\"), found none",
                );
            }
            return None;
        };
        let absolute = || format!("expected an absolute http:// or https:// URL, found {url:?}");
        let Ok(uri) = url.parse::<http::Uri>() else {
            self.err(&key, absolute());
            return None;
        };
        let (Some(scheme), Some(authority)) = (uri.scheme().cloned(), uri.authority().cloned()) else {
            self.err(&key, absolute());
            return None;
        };
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            self.err(&key, format!("expected an http:// or https:// URL, found {url:?}"));
            return None;
        }
        if uri.query().is_some() || authority.as_str().contains('@') {
            self.err(
                &key,
                format!("expected a URL without query or credentials, found {url:?}"),
            );
            return None;
        }
        let base_path = uri.path().trim_end_matches('/').to_string();
        Some((scheme, authority, base_path))
    }

    /// `ca_file`: a readable PEM file (relative to the config file when not found as given).
    pub(super) fn ca_file(&mut self, key: &str, raw: Option<&str>) -> Option<PathBuf> {
        let ca_file = self.string(key, raw).map(|p| {
            let p = PathBuf::from(p);
            if p.is_relative() && !p.exists() {
                self.base_dir.join(p)
            } else {
                p
            }
        });
        if let Some(p) = &ca_file {
            if !p.is_file() {
                self.err(
                    key,
                    format!("expected a readable PEM file, found {:?} (no such file)", p.display()),
                );
            }
        }
        ca_file
    }

    /// `set_headers`: valid names, visible-ASCII values (never echoed: usually credentials).
    fn set_headers(&mut self, name: &str, u: &RawUpstream) -> Vec<(HeaderName, HeaderValue)> {
        let mut set_headers = Vec::new();
        for (h, raw_value) in &u.set_headers {
            let k = format!("upstreams.{name}.set_headers.{h}");
            let Ok(header) = HeaderName::from_bytes(h.as_bytes()) else {
                self.err(&k, format!("expected a valid HTTP header name, found {h:?}"));
                continue;
            };
            let Some(value) = self.string(&k, Some(raw_value)) else {
                continue;
            };
            match HeaderValue::from_str(&value) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    set_headers.push((header, v));
                }
                // Never echo the value: it is usually a credential.
                Err(_) => self.err(
                    &k,
                    "expected a header value of visible ASCII characters (the value is not shown)",
                ),
            }
        }
        set_headers
    }
}
