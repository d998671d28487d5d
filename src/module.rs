//! Module registration: the one place that wires options, the data type,
//! commands, callbacks, events and INFO. Compiled out of unit tests, which
//! run without Redis (and without Redis's allocator).

use std::os::raw::c_int;

use redis_module::configuration::ConfigurationFlags;
use redis_module::raw::{self, RedisModuleCtx};
use redis_module::{redis_module, Context, RedisString, Status};

use crate::core::limits::{
    DEFAULT_MAX_TTL_MS, DEFAULT_MAX_WAITERS_PER_KEY, MAX_DURATION_MS, MAX_TOKEN_LEN,
};
use crate::redis::{commands, datatype, events, handoff, info, node, propagation};

/// The names accepted after the module path (the configurations below).
const OPTION_NAMES: [&str; 5] = [
    "restart-delay-ms",
    "max-ttl-ms",
    "max-waiters-per-key",
    "max-token-len",
    "allow-eviction",
];

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let checked =
        crate::core::args::check_module_args(&args, &OPTION_NAMES).and_then(|()| start(ctx.ctx));
    match checked {
        Ok(()) => Status::Ok,
        Err(e) => {
            ctx.log_warning(&format!("lock: {e}"));
            Status::Err
        }
    }
}

/// The bounds of every numeric option: (name, value, min, max). Redis checks
/// them on CONFIG SET and config-file lines, but a value given after the
/// module path becomes the option's default, which Redis does not check.
fn numeric_options() -> [(&'static str, i64, i64, i64); 4] {
    use std::sync::atomic::Ordering::Relaxed;
    [
        (
            "restart-delay-ms",
            node::RESTART_DELAY_MS.load(Relaxed),
            0,
            MAX_DURATION_MS,
        ),
        (
            "max-ttl-ms",
            node::MAX_TTL_MS.load(Relaxed),
            1,
            MAX_DURATION_MS,
        ),
        (
            "max-waiters-per-key",
            node::MAX_WAITERS_PER_KEY.load(Relaxed),
            1,
            MAX_WAITERS_BOUND,
        ),
        (
            "max-token-len",
            node::MAX_TOKEN_LEN_OPTION.load(Relaxed),
            1,
            MAX_TOKEN_LEN as i64,
        ),
    ]
}

const MAX_WAITERS_BOUND: i64 = 100_000_000;

fn check_module_args() -> Result<(), String> {
    for (name, value, min, max) in numeric_options() {
        if !(min..=max).contains(&value) {
            return Err(format!(
                "invalid {name} {value}: must be between {min} and {max} inclusive"
            ));
        }
    }
    Ok(())
}

fn check_server_version() -> Result<(), String> {
    let version = unsafe { raw::RedisModule_GetServerVersion }
        .map(|get| unsafe { get() })
        .unwrap_or(0);
    crate::core::limits::check_server_version(version)
}

fn start(ctx: *mut RedisModuleCtx) -> Result<(), String> {
    check_server_version()?;
    check_module_args()?;
    // One call: the options are assigned, not added.
    // * HANDLE_IO_ERRORS: a damaged payload is refused instead of a panic,
    //   and replicas may load diskless;
    // * HANDLE_REPL_ASYNC_LOAD: loading touches nothing but the new values
    //   and the fence mark (never lowered), so async loading is safe;
    // * NO_IMPLICIT_SIGNAL_MODIFIED: only real changes touch WATCH and
    //   client-side caching (see `keyspace`).
    let set_options = unsafe { raw::RedisModule_SetModuleOptions }
        .ok_or("RedisModule_SetModuleOptions is not available")?;
    let options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
        | raw::REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD
        | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED;
    unsafe { set_options(ctx, options as c_int) };
    datatype::register(ctx, handoff::on_unlink)?;
    commands::register(ctx)?;
    handoff::init(ctx)?;
    propagation::init(ctx)?;
    events::subscribe(ctx)?;
    events::read_server_state(ctx);
    redis_module::raw::register_info_function(ctx, Some(info::info_section));
    // Without persistence no loading event comes: start the fence mark and
    // the restart delay from the module's own start.
    node::start_serving_as_master();
    Ok(())
}

redis_module! {
    name: "lock",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: init,
    commands: [],
    configurations: [
        i64: [
            ["restart-delay-ms", &node::RESTART_DELAY_MS, 0, 0, MAX_DURATION_MS, ConfigurationFlags::DEFAULT, None],
            ["max-ttl-ms", &node::MAX_TTL_MS, DEFAULT_MAX_TTL_MS, 1, MAX_DURATION_MS, ConfigurationFlags::DEFAULT, None],
            ["max-waiters-per-key", &node::MAX_WAITERS_PER_KEY, DEFAULT_MAX_WAITERS_PER_KEY, 1, MAX_WAITERS_BOUND, ConfigurationFlags::DEFAULT, None],
            ["max-token-len", &node::MAX_TOKEN_LEN_OPTION, MAX_TOKEN_LEN as i64, 1, MAX_TOKEN_LEN as i64, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [
            ["allow-eviction", &node::ALLOW_EVICTION, false, ConfigurationFlags::DEFAULT, None],
        ],
        enum: [],
        module_args_as_configuration: true,
    ]
}
