//! Entra ID tokens for Azure OpenAI (scope `https://cognitiveservices.azure.com/.default`), on
//! rebound's own client, from the sources of the Azure SDKs' default chain: a client secret,
//! workload identity (AKS: the federated token file, re-read at each refresh, as the client
//! assertion), and managed identity, through App Service's endpoint (App Service, Container
//! Apps, Functions) or the instance metadata service (a VM's or a node's identity).
//!
//! Which source applies is decided once, from the environment ([`CloudEnv::azure_source`]), as
//! the SDKs do: a source that fails is an error to see, not a reason to try the next one.

use futures_util::future::BoxFuture;
use http::{HeaderName, HeaderValue};

use super::fetch::{Fetch, TokenCall};
use super::{oauth, read, secret, Issued, Source, SourceError};
use crate::config::{AzureSource, CloudEnv};

/// The scope of every token rebound asks Entra ID for (Azure OpenAI's, and the other Azure AI
/// services').
pub(crate) const SCOPE: &str = "https://cognitiveservices.azure.com/.default";
/// The same, as a resource: what the managed identity endpoints take.
const RESOURCE: &str = "https://cognitiveservices.azure.com";
/// Entra ID, where `AZURE_AUTHORITY_HOST` does not say.
const AUTHORITY: &str = "https://login.microsoftonline.com/";
/// The instance metadata service, where `AZURE_POD_IDENTITY_AUTHORITY_HOST` does not say.
const IMDS: &str = "http://169.254.169.254";
const CLIENT_ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// The chain in `env`.
pub(crate) fn source(env: &CloudEnv) -> Box<dyn Source> {
    Box::new(Chain {
        kind: env.azure_source(),
        env: env.clone(),
    })
}

struct Chain {
    kind: AzureSource,
    env: CloudEnv,
}

impl Source for Chain {
    fn fetch<'a>(&'a self, http: &'a Fetch) -> BoxFuture<'a, Result<Issued, SourceError>> {
        Box::pin(async move {
            let env = &self.env;
            let var = |name: &str| env.get(name).unwrap_or_default();
            match self.kind {
                AzureSource::ClientSecret => {
                    entra_id(http, env, &[("client_secret", var("AZURE_CLIENT_SECRET"))]).await
                }
                AzureSource::WorkloadIdentity => {
                    let assertion = read(var("AZURE_FEDERATED_TOKEN_FILE"))?;
                    let credential = [
                        ("client_assertion_type", CLIENT_ASSERTION_TYPE),
                        ("client_assertion", assertion.trim()),
                    ];
                    entra_id(http, env, &credential).await
                }
                AzureSource::AppService | AzureSource::InstanceMetadata => managed_identity(http, env, self.kind).await,
            }
        })
    }
}

/// Entra ID's token endpoint for the tenant: `AZURE_AUTHORITY_HOST` (else the public cloud's),
/// then `{tenant}/oauth2/v2.0/token`.
fn token_url(env: &CloudEnv) -> String {
    let authority = env.get("AZURE_AUTHORITY_HOST").unwrap_or(AUTHORITY);
    let tenant = env.get("AZURE_TENANT_ID").unwrap_or_default();
    format!("{}/{tenant}/oauth2/v2.0/token", authority.trim_end_matches('/'))
}

/// The application's token (client credentials grant) with `credential`: its secret, or the
/// federated token as its assertion.
async fn entra_id(http: &Fetch, env: &CloudEnv, credential: &[(&str, &str)]) -> Result<Issued, SourceError> {
    const WHAT: &str = "Entra ID's token endpoint";
    let url = token_url(env);
    let mut form = vec![
        ("grant_type", "client_credentials"),
        ("client_id", env.get("AZURE_CLIENT_ID").unwrap_or_default()),
        ("scope", SCOPE),
    ];
    form.extend_from_slice(credential);
    let now = crate::time::wall_now();
    let (_, body) = http.send(TokenCall::form(WHAT, &url, &form)).await?;
    oauth::token(WHAT, &body, now)
}

/// A managed identity's token: App Service's endpoint (`IDENTITY_ENDPOINT`, with
/// `IDENTITY_HEADER` as `x-identity-header`), else the instance metadata service (with
/// `metadata: true`); a user-assigned identity by `AZURE_CLIENT_ID`.
async fn managed_identity(http: &Fetch, env: &CloudEnv, kind: AzureSource) -> Result<Issued, SourceError> {
    let (what, base, version, header) = match kind {
        AzureSource::AppService => {
            const WHAT: &str = "the App Service managed identity endpoint";
            let header = secret(env.get("IDENTITY_HEADER").unwrap_or_default(), WHAT)?;
            let base = env.get("IDENTITY_ENDPOINT").unwrap_or_default().to_string();
            (
                WHAT,
                base,
                "2019-08-01",
                (HeaderName::from_static("x-identity-header"), header),
            )
        }
        // The instance metadata service: the chain's last source.
        _ => {
            let host = env.get("AZURE_POD_IDENTITY_AUTHORITY_HOST").unwrap_or(IMDS);
            let base = format!("{}/metadata/identity/oauth2/token", host.trim_end_matches('/'));
            let header = (HeaderName::from_static("metadata"), HeaderValue::from_static("true"));
            ("the instance metadata service", base, "2018-02-01", header)
        }
    };
    let query = {
        let mut query = form_urlencoded::Serializer::new(String::new());
        query
            .append_pair("api-version", version)
            .append_pair("resource", RESOURCE);
        if let Some(id) = env.get("AZURE_CLIENT_ID") {
            query.append_pair("client_id", id);
        }
        query.finish()
    };
    let joint = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{joint}{query}");
    let now = crate::time::wall_now();
    let (_, body) = http.send(TokenCall::get(what, &url).header(header.0, header.1)).await?;
    oauth::token(what, &body, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_endpoint_is_the_authoritys_for_the_tenant() {
        let env = |authority: Option<&str>| {
            CloudEnv::capture(&|name| match name {
                "AZURE_TENANT_ID" => Some("tenant-1".into()),
                "AZURE_AUTHORITY_HOST" => authority.map(str::to_string),
                _ => None,
            })
        };
        let public = "https://login.microsoftonline.com/tenant-1/oauth2/v2.0/token";
        assert_eq!(token_url(&env(None)), public);
        // AKS's webhook sets the host with a trailing slash; a sovereign cloud's without.
        assert_eq!(token_url(&env(Some("https://login.microsoftonline.com/"))), public);
        assert_eq!(
            token_url(&env(Some("https://login.microsoftonline.us"))),
            "https://login.microsoftonline.us/tenant-1/oauth2/v2.0/token"
        );
    }
}
