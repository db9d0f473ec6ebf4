//! `auth`: where an upstream's credential comes from. `static` (the default) is `set_headers`;
//! `aws`, `gcp` and `azure` are the clouds' own credentials, which rebound signs with or fetches
//! itself (the `cloud` module), from each cloud's default chain and its standard environment
//! variables, captured when the config loads ([`CloudEnv`]).

use std::collections::BTreeMap;

use crate::words::spelled;

/// The `auth` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthKind {
    Static,
    Aws,
    Gcp,
    Azure,
}

spelled!(AuthKind { "static" => Static, "aws" => Aws, "gcp" => Gcp, "azure" => Azure });

/// An upstream's credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// `set_headers`, as written.
    Static,
    /// SigV4 on every request, with the AWS default credential chain.
    Aws(AwsAuth),
    /// OAuth2 access tokens by Application Default Credentials (scope `cloud-platform`).
    Gcp,
    /// Entra ID tokens (scope `https://cognitiveservices.azure.com/.default`).
    Azure,
}

impl Auth {
    pub(crate) fn kind(&self) -> AuthKind {
        match self {
            Auth::Static => AuthKind::Static,
            Auth::Aws(_) => AuthKind::Aws,
            Auth::Gcp => AuthKind::Gcp,
            Auth::Azure => AuthKind::Azure,
        }
    }
}

/// What SigV4 signs for: the region and the service's signing name, and a role assumed on top of
/// the chain's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsAuth {
    pub region: String,
    /// The signing name (`bedrock` for `bedrock-runtime.*`).
    pub service: String,
    pub role_arn: Option<String>,
}

/// The environment variables the credential chains read, by cloud (the clouds' own names, so
/// that a deployment's usual settings work, and tests point them at local stand-ins).
pub(crate) const CLOUD_ENV: &[&str] = &[
    // AWS: keys, web identity (IRSA), EKS Pod Identity and ECS, IMDSv2, the shared profile.
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ENDPOINT_URL_STS",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    "AWS_EC2_METADATA_DISABLED",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    // Google Application Default Credentials: a credentials file, gcloud's, the metadata server.
    "GOOGLE_APPLICATION_CREDENTIALS",
    "CLOUDSDK_CONFIG",
    "GCE_METADATA_HOST",
    // Azure: a client secret, workload identity, managed identity (App Service's endpoint, or
    // the instance metadata service, which the SDKs let AZURE_POD_IDENTITY_AUTHORITY_HOST move).
    "AZURE_CLIENT_ID",
    "AZURE_TENANT_ID",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_AUTHORITY_HOST",
    "AZURE_CLIENT_SECRET",
    "IDENTITY_ENDPOINT",
    "IDENTITY_HEADER",
    "AZURE_POD_IDENTITY_AUTHORITY_HOST",
    "HOME",
];

/// The values of [`CLOUD_ENV`] when the config loaded (some are secrets: `Debug` shows names
/// only).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CloudEnv(BTreeMap<&'static str, String>);

impl CloudEnv {
    pub(crate) fn capture(env: &dyn Fn(&str) -> Option<String>) -> CloudEnv {
        CloudEnv(
            CLOUD_ENV
                .iter()
                .filter_map(|name| env(name).filter(|v| !v.is_empty()).map(|v| (*name, v)))
                .collect(),
        )
    }

    /// The variable's value, when it is set and not empty.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

impl std::fmt::Debug for CloudEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// Where the AWS default chain finds its credential, in the chain's order: keys in the
/// environment, the shared credentials file (when it has the profile), web identity (IRSA),
/// the container endpoint (EKS Pod Identity, ECS), else the instance metadata service (IMDSv2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AwsSource {
    Environment,
    Profile,
    WebIdentity,
    Container,
    InstanceMetadata,
}

spelled!(AwsSource {
    "environment" => Environment,
    "profile" => Profile,
    "web_identity" => WebIdentity,
    "container" => Container,
    "instance_metadata" => InstanceMetadata,
});

impl CloudEnv {
    /// The AWS chain's source for this environment (`profile`: a credentials file that exists;
    /// its content is read when the credential is fetched).
    pub(crate) fn aws_source(&self) -> AwsSource {
        if self.get("AWS_ACCESS_KEY_ID").is_some() && self.get("AWS_SECRET_ACCESS_KEY").is_some() {
            AwsSource::Environment
        } else if self.aws_credentials_file().is_some_and(|f| f.is_file()) {
            AwsSource::Profile
        } else if self.get("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() && self.get("AWS_ROLE_ARN").is_some() {
            AwsSource::WebIdentity
        } else if self.get("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some()
            || self.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
        {
            AwsSource::Container
        } else {
            AwsSource::InstanceMetadata
        }
    }

    /// The shared credentials file: `AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`.
    pub(crate) fn aws_credentials_file(&self) -> Option<std::path::PathBuf> {
        match (self.get("AWS_SHARED_CREDENTIALS_FILE"), self.get("HOME")) {
            (Some(file), _) => Some(file.into()),
            (None, Some(home)) => Some(std::path::Path::new(home).join(".aws/credentials")),
            (None, None) => None,
        }
    }
}

/// Where Google's Application Default Credentials come from: the credentials file
/// (`GOOGLE_APPLICATION_CREDENTIALS`, else gcloud's `application_default_credentials.json` when
/// it exists), by the `type` it declares, else the metadata server (GKE Workload Identity, a
/// VM's service account).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GcpSource {
    /// A service account key: a JWT signed with its key, exchanged for a token.
    ServiceAccount,
    /// Workload identity federation: a subject token file exchanged at STS.
    ExternalAccount,
    /// A user's refresh token (`gcloud auth application-default login`).
    AuthorizedUser,
    /// A credentials file that could not be read or declares no type rebound knows: each fetch
    /// reads it again and says why it fails.
    CredentialsFile,
    MetadataServer,
}

spelled!(GcpSource {
    "service_account" => ServiceAccount,
    "external_account" => ExternalAccount,
    "authorized_user" => AuthorizedUser,
    "credentials_file" => CredentialsFile,
    "metadata_server" => MetadataServer,
});

/// Where Entra ID tokens come from, in the order of the Azure SDKs' default chain: a client
/// secret, workload identity (a federated token file), App Service's managed identity endpoint
/// (App Service, Container Apps, Functions), else the instance metadata service (a VM's or a
/// node's managed identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AzureSource {
    ClientSecret,
    WorkloadIdentity,
    AppService,
    InstanceMetadata,
}

spelled!(AzureSource {
    "client_secret" => ClientSecret,
    "workload_identity" => WorkloadIdentity,
    "app_service" => AppService,
    "instance_metadata" => InstanceMetadata,
});

impl CloudEnv {
    /// The credentials file of Google's chain: `GOOGLE_APPLICATION_CREDENTIALS`, else gcloud's
    /// (`CLOUDSDK_CONFIG`, else `~/.config/gcloud`) when it exists; `None`: the metadata server.
    pub(crate) fn gcp_credentials_file(&self) -> Option<std::path::PathBuf> {
        if let Some(file) = self.get("GOOGLE_APPLICATION_CREDENTIALS") {
            return Some(file.into());
        }
        let dir = match (self.get("CLOUDSDK_CONFIG"), self.get("HOME")) {
            (Some(dir), _) => std::path::PathBuf::from(dir),
            (None, Some(home)) => std::path::Path::new(home).join(".config/gcloud"),
            (None, None) => return None,
        };
        Some(dir.join("application_default_credentials.json")).filter(|f| f.is_file())
    }

    /// Google's source for this environment (the credentials file's type is read from it; its
    /// secrets are read when the credential is fetched).
    pub(crate) fn gcp_source(&self) -> GcpSource {
        #[derive(serde::Deserialize)]
        struct Declared {
            #[serde(rename = "type")]
            kind: String,
        }
        let Some(file) = self.gcp_credentials_file() else {
            return GcpSource::MetadataServer;
        };
        let declared = std::fs::read_to_string(file)
            .ok()
            .and_then(|text| serde_json::from_str::<Declared>(&text).ok());
        match declared.as_ref().map(|d| d.kind.as_str()) {
            Some("service_account") => GcpSource::ServiceAccount,
            Some("external_account") => GcpSource::ExternalAccount,
            Some("authorized_user") => GcpSource::AuthorizedUser,
            _ => GcpSource::CredentialsFile,
        }
    }

    /// Azure's source for this environment (each needs all of its variables, as in the SDKs).
    pub(crate) fn azure_source(&self) -> AzureSource {
        let app = self.get("AZURE_CLIENT_ID").is_some() && self.get("AZURE_TENANT_ID").is_some();
        if app && self.get("AZURE_CLIENT_SECRET").is_some() {
            AzureSource::ClientSecret
        } else if app && self.get("AZURE_FEDERATED_TOKEN_FILE").is_some() {
            AzureSource::WorkloadIdentity
        } else if self.get("IDENTITY_ENDPOINT").is_some() && self.get("IDENTITY_HEADER").is_some() {
            AzureSource::AppService
        } else {
            AzureSource::InstanceMetadata
        }
    }
}

/// The region of an AWS host (`bedrock-runtime.us-east-1.amazonaws.com`: `us-east-1`).
pub(crate) fn aws_region_of(host: &str) -> Option<&str> {
    let rest = host.strip_suffix(".amazonaws.com")?;
    let region = rest.rsplit('.').next()?;
    (region.contains('-') && region != rest).then_some(region)
}

/// The SigV4 signing name of an AWS host's service: `bedrock` for every Bedrock endpoint
/// (`bedrock-runtime`, `bedrock-agent-runtime`), else the host's first label; `bedrock` for a
/// host that is not AWS's (a local stand-in).
pub(crate) fn aws_service_of(host: &str) -> &str {
    match host.strip_suffix(".amazonaws.com").and_then(|h| h.split('.').next()) {
        Some(label) if label.starts_with("bedrock") => "bedrock",
        Some(label) => label,
        None => "bedrock",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_and_service_come_from_the_host() {
        let host = "bedrock-runtime.us-east-1.amazonaws.com";
        assert_eq!(aws_region_of(host), Some("us-east-1"));
        assert_eq!(aws_service_of(host), "bedrock");
        assert_eq!(aws_region_of("sts.amazonaws.com"), None);
        assert_eq!(aws_region_of("127.0.0.1"), None);
        assert_eq!(aws_service_of("sts.eu-west-1.amazonaws.com"), "sts");
        assert_eq!(aws_service_of("127.0.0.1"), "bedrock");
    }

    #[test]
    fn the_aws_chain_takes_the_first_source_the_environment_names() {
        let irsa = [
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "/t"),
        ];
        assert_eq!(env(&irsa).aws_source(), AwsSource::WebIdentity);
        let keys = [
            ("AWS_ACCESS_KEY_ID", "a"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("AWS_ROLE_ARN", "r"),
        ];
        assert_eq!(env(&keys).aws_source(), AwsSource::Environment);
        let pod = [(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "http://169.254.170.23/v1/credentials",
        )];
        assert_eq!(env(&pod).aws_source(), AwsSource::Container);
        let none = [("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")];
        assert_eq!(env(&none).aws_source(), AwsSource::InstanceMetadata);
    }

    fn env(pairs: &[(&str, &str)]) -> CloudEnv {
        CloudEnv::capture(&|name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn googles_chain_reads_the_credentials_files_type_else_asks_the_metadata_server() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let sa = file("sa.json", r#"{"type":"service_account","private_key":"-"}"#);
        let ext = file("ext.json", r#"{"type":"external_account"}"#);
        let other = file("other.json", r#"{"type":"impersonated_service_account"}"#);
        let gac = |path: &str| env(&[("GOOGLE_APPLICATION_CREDENTIALS", path), ("HOME", "/nonexistent")]);
        assert_eq!(gac(&sa).gcp_source(), GcpSource::ServiceAccount);
        assert_eq!(gac(&ext).gcp_source(), GcpSource::ExternalAccount);
        assert_eq!(gac(&other).gcp_source(), GcpSource::CredentialsFile);
        assert_eq!(gac("/nonexistent/key.json").gcp_source(), GcpSource::CredentialsFile);
        assert_eq!(env(&[("HOME", "/nonexistent")]).gcp_source(), GcpSource::MetadataServer);
        // gcloud's file, when it exists.
        let gcloud = dir.path().join("gcloud");
        std::fs::create_dir_all(&gcloud).unwrap();
        let config = gcloud.display().to_string();
        assert_eq!(
            env(&[("CLOUDSDK_CONFIG", &config)]).gcp_source(),
            GcpSource::MetadataServer
        );
        std::fs::write(
            gcloud.join("application_default_credentials.json"),
            r#"{"type":"authorized_user"}"#,
        )
        .unwrap();
        assert_eq!(
            env(&[("CLOUDSDK_CONFIG", &config)]).gcp_source(),
            GcpSource::AuthorizedUser
        );
    }

    #[test]
    fn azures_chain_takes_the_first_source_whose_variables_are_all_set() {
        let app = [("AZURE_CLIENT_ID", "c"), ("AZURE_TENANT_ID", "t")];
        let with = |more: &[(&'static str, &'static str)]| env(&[&app[..], more].concat()).azure_source();
        assert_eq!(with(&[("AZURE_CLIENT_SECRET", "s")]), AzureSource::ClientSecret);
        assert_eq!(
            with(&[("AZURE_FEDERATED_TOKEN_FILE", "/t")]),
            AzureSource::WorkloadIdentity
        );
        let secret_without_tenant = [("AZURE_CLIENT_ID", "c"), ("AZURE_CLIENT_SECRET", "s")];
        assert_eq!(
            env(&secret_without_tenant).azure_source(),
            AzureSource::InstanceMetadata
        );
        let app_service = [("IDENTITY_ENDPOINT", "http://x"), ("IDENTITY_HEADER", "h")];
        assert_eq!(env(&app_service).azure_source(), AzureSource::AppService);
        assert_eq!(
            env(&[("IDENTITY_ENDPOINT", "http://x")]).azure_source(),
            AzureSource::InstanceMetadata
        );
    }

    #[test]
    fn the_environment_is_captured_by_name_and_never_shown() {
        let env = CloudEnv::capture(&|name| match name {
            "AWS_SECRET_ACCESS_KEY" => Some("s3cr3t".into()),
            "AWS_REGION" => Some(String::new()),
            "PATH" => Some("/bin".into()),
            _ => None,
        });
        assert_eq!(env.get("AWS_SECRET_ACCESS_KEY"), Some("s3cr3t"));
        assert_eq!(env.get("AWS_REGION"), None, "empty is unset");
        assert_eq!(env.get("PATH"), None, "only the clouds' own names");
        assert_eq!(format!("{env:?}"), "[\"AWS_SECRET_ACCESS_KEY\"]");
    }
}
