//! Fleet-wide limits at run time (`[limits.NAME]`): the state the pipeline consults, and where a
//! bucket's quota comes from ([`store`]: Redis leases shared by every replica, or this process
//! alone). The arithmetic (buckets, windows, ledgers, the fair queue) is `crate::limits`, pure.
//!
//! Being built (issue 49): the store is here and tested against Redis; the admission step that
//! spends from it is next.
#![cfg_attr(not(test), allow(dead_code))] // until the pipeline admits requests through it

pub mod store;
