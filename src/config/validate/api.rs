//! A route's API and its targets': the family they share, and what adapting a request to each
//! host needs (a Bedrock model id per model, a Vertex AI project and location).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::super::raw::*;
use super::super::*;
use super::Validator;

/// Whether `model` is a Bedrock model id or ARN (`anthropic.claude-...`, `us.anthropic.claude-...`,
/// `arn:aws:bedrock:...`), not a name only another host knows.
fn is_bedrock_id(model: &str) -> bool {
    model.starts_with("arn:") || model.contains("anthropic.")
}

impl Validator<'_> {
    /// Resolves `route`'s API (its first target's) and each target's on it, and checks that
    /// every target can serve the route's requests.
    pub(super) fn route_api(
        &mut self,
        i: usize,
        r: &RawRoute,
        route: &mut RouteConfig,
        upstreams: &BTreeMap<String, Arc<UpstreamConfig>>,
    ) {
        let api_of = |t: &TargetConfig| upstreams.get(&t.upstream).map(|u| u.api);
        let Some(first) = route.targets.first().and_then(api_of) else {
            return; // an unknown upstream: already an error
        };
        let family = first
            .family()
            .or_else(|| route.targets.iter().filter_map(api_of).find_map(ApiOf::family));
        route.api = first.on(family);
        let family = route.api.family();
        for (t, api) in route.targets.iter_mut().filter_map(|t| api_of(t).map(|a| (t, a))) {
            t.api = api.on(Some(family));
        }
        let key = |j: usize, k: &str| match (&r.targets, j) {
            (Some(_), _) => format!("routes[{i}].targets[{j}].{k}"),
            (None, 0) => format!("routes[{i}].upstream"),
            (None, _) => format!("routes[{i}].fallback[{}]", j - 1),
        };
        let first_name = route.targets[0].upstream.clone();
        // The names the app asks for, where a target's `models` says so.
        let asked: BTreeSet<&String> = route.targets.iter().flat_map(|t| t.models.keys()).collect();
        for (j, t) in route.targets.iter().enumerate().skip(1) {
            let (api, name) = (t.api, &t.upstream);
            if api.family() != family {
                self.err(
                    &key(j, "upstream"),
                    format!(
                        "expected an upstream that serves the route's API ({}, its first target {first_name:?}'s): {}; found {name:?} ({}): rebound adapts requests between hosts of one model family, it does not translate between families",
                        route.api.as_str(),
                        family.apis(),
                        api.as_str()
                    ),
                );
            } else if route.api == Api::Bedrock && api != Api::Bedrock {
                self.err(
                    &key(j, "upstream"),
                    format!(
                        "expected a bedrock upstream, found {name:?} ({}): the app of a route whose first target is Bedrock reads Bedrock's event stream, which rebound writes for no other host (put an anthropic or vertex-anthropic upstream first to mix them)",
                        api.as_str()
                    ),
                );
            }
        }
        for (j, t) in route.targets.iter().enumerate() {
            self.path_names(&key(j, "models"), t);
            if t.api == route.api {
                continue;
            }
            let name = &t.upstream;
            match t.api {
                Api::Bedrock if t.models.is_empty() => self.err(
                    &key(j, "models"),
                    format!(
                        "expected a `models` table naming the Bedrock model id of each model the app asks for (e.g. models = {{ \"claude-haiku-4-5\" = \"us.anthropic.claude-haiku-4-5-20251001-v1:0\" }}) on {name:?}: the route's model names are {}'s, found none",
                        route.api.as_str()
                    ),
                ),
                Api::Bedrock => {
                    let missing: Vec<&&String> = asked
                        .iter()
                        .filter(|m| !t.models.contains_key(**m) && !is_bedrock_id(m))
                        .collect();
                    if !missing.is_empty() {
                        self.err(
                            &key(j, "models"),
                            format!("expected a Bedrock model id for every model the route's targets map, found none for {missing:?} on {name:?}"),
                        );
                    }
                    if let Some((from, to)) = t.models.iter().find(|(_, to)| !is_bedrock_id(to)) {
                        self.err(
                            &key(j, "models"),
                            format!("expected Bedrock model ids or inference profiles (e.g. \"us.anthropic.claude-haiku-4-5-20251001-v1:0\"), found {from:?} = {to:?}"),
                        );
                    }
                }
                Api::VertexAnthropic | Api::VertexGemini => {
                    let Some(u) = upstreams.get(name) else { continue };
                    if u.gcp_project.is_none() {
                        self.err(
                            &format!("upstreams.{name}.gcp_project"),
                            format!("expected a Google Cloud project (or GOOGLE_CLOUD_PROJECT in the environment): the paths of Vertex AI name it, and route {:?} sends its {} requests there, found none", route.name, route.api.as_str()),
                        );
                    }
                    if u.gcp_location.is_none() {
                        self.err(
                            &format!("upstreams.{name}.gcp_location"),
                            "expected a location (e.g. \"us-east5\", \"global\"): the paths of Vertex AI name it, and the host names none, found none",
                        );
                    }
                }
                _ => {}
            }
        }
    }
}

impl Validator<'_> {
    /// A name a target's `models` places in its host's path is one segment that host allows (as
    /// a request's is: `wire::api`).
    fn path_names(&mut self, key: &str, t: &TargetConfig) {
        if !t.api.names_model_in_path() {
            return;
        }
        let fault = t
            .models
            .iter()
            .find_map(|(from, to)| t.api.path_name_fault(to).map(|why| (from, to, why)));
        if let Some((from, to, why)) = fault {
            self.err(
                key,
                format!(
                    "expected a name {} allows as one segment of its paths (letters, digits, '-', '_', '.'; see docs/errors.md#invalid_model), found {from:?} = {to:?}, which {why}",
                    t.api.as_str()
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_bedrock_id;

    #[test]
    fn bedrock_ids_are_told_from_other_names() {
        for id in [
            "anthropic.claude-3-5-sonnet-20240620-v1:0",
            "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "global.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        ] {
            assert!(is_bedrock_id(id), "{id}");
        }
        for name in ["claude-sonnet-4-5", "claude-sonnet-4-5@20250929", "anthropic"] {
            assert!(!is_bedrock_id(name), "{name}");
        }
    }
}
