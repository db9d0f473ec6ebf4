//! The scope an attempt's holds (a cooldown, pacing, a used-up quota) are kept under: the
//! provider's rate-limit scope. Providers limit per model (OpenAI and Gemini
//! per model and project, Anthropic per model, Azure per deployment), so a 429's cooldown and a
//! nearly spent request quota hold the credential *for the model the attempt asked for*
//! (`rate_limit_scope = "model"`, the default); `"credential"` keeps one scope per credential. A
//! used-up quota (`insufficient_quota`, billing) is the whole credential's whatever the scope.
//!
//! The model is the one the target is asked for: the one the request names
//! ([`crate::wire::api`], after the target's model rewrite); a request that names none
//! is kept under the credential's own key, which is also what a replica keeping limits per
//! credential uses. Nothing is hashed or searched until a hold needs it.

use std::cell::OnceCell;

use super::routes::Target;
use crate::config::RateLimitScope;
use crate::credentials::{Credentials, LimitKey, Presented};

/// What one attempt asked for, as far as holds go: its credential and the model it names.
pub(super) struct HoldScope<'a> {
    credential: Presented,
    model: &'a str,
    per_model: OnceCell<LimitKey>,
}

impl<'a> HoldScope<'a> {
    pub(super) fn new(credential: Presented, model: &'a str) -> HoldScope<'a> {
        HoldScope {
            credential,
            model,
            per_model: OnceCell::new(),
        }
    }

    /// The key of what holds the whole credential (a used-up quota).
    pub(super) fn credential(&self, forms: &Credentials) -> LimitKey {
        LimitKey::from(self.credential.hash(forms))
    }

    /// The key of `target`'s cooldowns and pacing for this attempt (see the module's text).
    pub(super) fn per_model(&self, forms: &Credentials, target: &Target) -> LimitKey {
        *self.per_model.get_or_init(|| {
            let credential = self.credential.hash(forms);
            match target.upstream.config.rate_limit_scope {
                RateLimitScope::Credential => LimitKey::from(credential),
                RateLimitScope::Model => forms.limit_key(credential, model_for(target, self.model)),
            }
        })
    }
}

/// The model `target` is asked for: the request's, renamed by the target's `models` map.
fn model_for<'a>(target: &'a Target, asked: &'a str) -> &'a str {
    target.config.models.get(asked).map_or(asked, String::as_str)
}
