//! How rebound reaches Redis nodes: the credentials, TLS and trust roots of `[redis]` applied to
//! every connection (the shared one, dedicated ones, pub/sub), the master a set of sentinels
//! names, and the node a Cluster slot lives on.

use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, TlsCertificates, Value};

use crate::config::{RedisConfig, RedisTopology};

/// Everything needed to open a connection to any node of the configured topology.
pub(super) struct Nodes {
    pub topology: RedisTopology,
    username: Option<String>,
    password: Option<String>,
    /// The `ca_file` PEM: the only trust roots of TLS connections when set.
    ca_pem: Option<Vec<u8>>,
    /// Data nodes speak TLS (the configured URLs are `rediss://`).
    tls: bool,
    pub connect_timeout: Duration,
}

/// Why `ca_file` cannot be used.
#[derive(Debug, thiserror::Error)]
pub(super) enum CaError {
    #[error("cannot read redis.ca_file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("redis.ca_file {path} holds no PEM certificate")]
    NoCertificate { path: String },
}

/// The `ca_file` PEM, if one is configured.
pub(super) fn read_ca(config: &RedisConfig) -> Result<Option<Vec<u8>>, CaError> {
    let Some(path) = &config.ca_file else { return Ok(None) };
    let shown = || path.display().to_string();
    let pem = std::fs::read(path).map_err(|source| CaError::Read { path: shown(), source })?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(CaError::NoCertificate { path: shown() });
    }
    Ok(Some(pem))
}

/// Why no sentinel named the master: what the last one asked answered.
#[derive(Debug, thiserror::Error)]
pub enum SentinelError {
    #[error("no sentinel configured")]
    NoneConfigured,
    #[error("sentinel {sentinel} knows no master named {name:?}")]
    UnknownMaster { sentinel: String, name: String },
    #[error("sentinel {sentinel}: {source}")]
    Failed {
        sentinel: String,
        source: redis::RedisError,
    },
    #[error("sentinel {sentinel} did not answer within {timeout:?}")]
    Timeout { sentinel: String, timeout: Duration },
}

impl Nodes {
    pub(super) fn new(config: &RedisConfig, ca_pem: Option<Vec<u8>>) -> Nodes {
        let tls = match &config.topology {
            RedisTopology::Standalone { url } => url.starts_with("rediss://"),
            RedisTopology::Cluster { seeds } => seeds.iter().any(|u| u.starts_with("rediss://")),
            RedisTopology::Sentinel { sentinels, .. } => sentinels.iter().any(|u| u.starts_with("rediss://")),
        };
        Nodes {
            topology: config.topology.clone(),
            username: config.username.clone(),
            password: config.password.clone(),
            ca_pem,
            tls,
            connect_timeout: config.command_timeout.max(Duration::from_millis(500)),
        }
    }

    /// `info` with the configured user and password (they override the URL's).
    fn with_credentials(&self, mut info: ConnectionInfo) -> ConnectionInfo {
        if self.username.is_some() {
            info.redis.username.clone_from(&self.username);
        }
        if self.password.is_some() {
            info.redis.password.clone_from(&self.password);
        }
        info
    }

    fn client(&self, info: ConnectionInfo) -> redis::RedisResult<Client> {
        match (&info.addr, &self.ca_pem) {
            (ConnectionAddr::TcpTls { .. }, Some(pem)) => Client::build_with_tls(
                info,
                TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            ),
            _ => Client::open(info),
        }
    }

    /// A client for a configured URL, with the configured credentials.
    pub(crate) fn url_client(&self, url: &str) -> redis::RedisResult<Client> {
        let info = self.with_credentials(url.into_connection_info()?);
        self.client(info)
    }

    /// A client for a sentinel (its URL's own credentials, the configured trust roots).
    fn sentinel_client(&self, url: &str) -> redis::RedisResult<Client> {
        self.client(url.into_connection_info()?)
    }

    /// A client for a data node found at `host:port` (a Sentinel master, a Cluster node).
    pub(crate) fn node_client(&self, host: &str, port: u16) -> redis::RedisResult<Client> {
        let addr = if self.tls {
            ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.to_string(), port)
        };
        let redis = RedisConnectionInfo {
            username: self.username.clone(),
            password: self.password.clone(),
            ..RedisConnectionInfo::default()
        };
        self.client(ConnectionInfo { addr, redis })
    }

    /// A connection to the whole cluster (its seeds with the configured credentials).
    pub(super) async fn cluster(
        &self,
        seeds: &[String],
        response_timeout: Duration,
    ) -> redis::RedisResult<ClusterConnection> {
        let infos = seeds
            .iter()
            .map(|s| s.as_str().into_connection_info().map(|i| self.with_credentials(i)))
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let mut builder = ClusterClientBuilder::new(infos)
            .connection_timeout(self.connect_timeout)
            .response_timeout(response_timeout)
            .retries(2)
            .min_retry_wait(10)
            .max_retry_wait(200);
        if let Some(pem) = &self.ca_pem {
            builder = builder.certs(TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            });
        }
        builder.build()?.get_async_connection().await
    }

    /// The master `name` as the first sentinel that knows it says (`host`, `port`), and the index
    /// of that sentinel (asked first next time). Each sentinel gets `connect_timeout`.
    pub(crate) async fn sentinel_master(
        &self,
        sentinels: &[String],
        name: &str,
        first: usize,
    ) -> Result<(String, u16, usize), SentinelError> {
        let mut last = SentinelError::NoneConfigured;
        for i in 0..sentinels.len() {
            let at = (first + i) % sentinels.len();
            let url = &sentinels[at];
            let ask = async {
                let client = self.sentinel_client(url)?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(name)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            };
            let sentinel = crate::config::redact_url(url);
            last = match tokio::time::timeout(self.connect_timeout, ask).await {
                Ok(Ok(Some((host, port)))) => return Ok((host, port, at)),
                Ok(Ok(None)) => SentinelError::UnknownMaster {
                    sentinel,
                    name: name.to_string(),
                },
                Ok(Err(source)) => SentinelError::Failed { sentinel, source },
                Err(_) => SentinelError::Timeout {
                    sentinel,
                    timeout: self.connect_timeout,
                },
            };
        }
        Err(last)
    }
}

/// One slot range of a Cluster and its master (from `CLUSTER SLOTS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SlotRange {
    pub start: u16,
    pub end: u16,
    pub host: String,
    pub port: u16,
}

/// Reads a `CLUSTER SLOTS` reply.
pub(super) fn parse_slots(reply: &Value) -> Vec<SlotRange> {
    let Value::Array(ranges) = reply else { return Vec::new() };
    ranges
        .iter()
        .filter_map(|r| {
            let Value::Array(parts) = r else { return None };
            let int = |v: Option<&Value>| match v {
                Some(Value::Int(n)) => u16::try_from(*n).ok(),
                _ => None,
            };
            let (start, end) = (int(parts.first())?, int(parts.get(1))?);
            let Some(Value::Array(master)) = parts.get(2) else {
                return None;
            };
            let host = match master.first()? {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let port = int(master.get(1))?;
            Some(SlotRange { start, end, host, port })
        })
        .collect()
}

/// The Cluster slot of `key` (CRC16/XMODEM of its hash tag, or of the whole key, mod 16384).
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&n| n > 0)
                .map(|n| &rest[..n])
        })
        .unwrap_or(key);
    crc16(tagged) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_hash_tags() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"rebound:idem:{r:s:k}"), key_slot(b"r:s:k"));
        assert_eq!(key_slot(b"rebound:idem:{r:s:k}:live:o"), key_slot(b"other{r:s:k}"));
        // An empty tag is no tag.
        assert_eq!(key_slot(b"a{}b"), crc16(b"a{}b") % 16384);
    }

    #[test]
    fn cluster_slots_parse() {
        let node = |h: &str, p: i64| {
            Value::Array(vec![
                Value::BulkString(h.as_bytes().to_vec()),
                Value::Int(p),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("10.0.0.2", 7001)]),
        ]);
        let slots = parse_slots(&reply);
        assert_eq!(slots.len(), 2);
        assert_eq!(
            slots[1],
            SlotRange {
                start: 5461,
                end: 16383,
                host: "10.0.0.2".into(),
                port: 7001
            }
        );
    }
}
