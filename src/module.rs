//! Module registration: the one place that wires options, the data type,
//! commands, callbacks, events and INFO. Compiled out of unit tests, which
//! run without Redis (and without Redis's allocator).

use std::os::raw::c_int;

use redis_module::configuration::{
    register_bool_configuration, register_i64_configuration, ConfigurationFlags,
};
use redis_module::raw;
use redis_module::{redis_module, Context, RedisString, Status};

use crate::core::args::{OptionSpec, OptionValue};
use crate::core::limits;
use crate::core::protocol::OPTIONS;
use crate::redis::{
    blocked, commands, datatype, engine, events, evicted, ffi, gate, info, propagation, sweep,
    timer, timer_run,
};

/// `VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION` (Valkey 9.0's
/// valkeymodule.h; the bits below it are Redis's and Valkey's alike, this
/// one is unknown to Redis and to Valkey 8).
const VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION: c_int = 1 << 5;

/// Where each option's value lives (the node's limits), in the order of
/// `protocol::OPTIONS`, which owns their names, bounds and defaults.
const TARGETS: [Target; 8] = [
    Target::Numeric(&engine::RESTART_DELAY_MS),
    Target::Numeric(&engine::LOCK_DELAY_MS),
    Target::Numeric(&engine::MAX_TTL_MS),
    Target::Numeric(&engine::MAX_WAITERS_PER_KEY),
    Target::Numeric(&engine::MAX_TOKEN_LEN),
    Target::Bool(&engine::ALLOW_EVICTION),
    Target::Numeric(&engine::MAX_HOLDERS_PER_KEY),
    Target::Numeric(&engine::MAX_VALUE_LEN),
];

/// Where an option's value lives.
enum Target {
    Numeric(&'static engine::NumericOption),
    Bool(&'static engine::BoolOption),
}

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    match start(ctx, args) {
        Ok(()) => Status::Ok,
        Err(e) => {
            ctx.log_warning(&format!("lock: {e}"));
            Status::Err
        }
    }
}

fn check_server_version() -> Result<(), String> {
    let version = ffi::server_version().unwrap_or(0);
    crate::core::limits::check_server_version(version)
}

/// Registers the options, their start values checked first (Redis does not
/// check a value given after the module path), then applies the `lock.*`
/// lines of the config file (Redis checks those).
fn register_options(ctx: &Context, args: &[RedisString]) -> Result<(), String> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let values = crate::core::args::module_option_values(&args, &OPTIONS)?;
    for ((spec, target), value) in OPTIONS.iter().zip(&TARGETS).zip(values) {
        match (spec, target, value) {
            (
                OptionSpec::Numeric { name, min, max, .. },
                Target::Numeric(var),
                OptionValue::Numeric(v),
            ) => register_i64_configuration(
                ctx,
                name,
                *var,
                v,
                *min,
                *max,
                ConfigurationFlags::DEFAULT,
                None,
            ),
            (OptionSpec::Bool { name, .. }, Target::Bool(var), OptionValue::Bool(v)) => {
                register_bool_configuration(ctx, name, *var, v, ConfigurationFlags::DEFAULT, None)
            }
            _ => {
                return Err(format!(
                    "option {} is wired to the wrong kind of value",
                    spec.name()
                ))
            }
        }
    }
    match ffi::load_configs(ffi::Ctx::of(ctx)) {
        None => Err("RedisModule_LoadConfigs is not available".into()),
        Some(false) => {
            Err("a lock.* line of the config file is invalid (see the line above)".into())
        }
        Some(true) => Ok(()),
    }
}

fn start(context: &Context, args: &[RedisString]) -> Result<(), String> {
    // First: on an older server the option and command APIs below are NULL.
    check_server_version()?;
    register_options(context, args)?;
    let ctx = ffi::Ctx::of(context);
    // One call: the options are assigned, not added.
    // * HANDLE_IO_ERRORS: a damaged payload is refused instead of a panic,
    //   and replicas may load diskless;
    // * HANDLE_REPL_ASYNC_LOAD: loading touches nothing but the new values
    //   and the fence mark (never lowered), so async loading is safe;
    // * NO_IMPLICIT_SIGNAL_MODIFIED: only real changes touch WATCH and
    //   client-side caching (see `keyspace`).
    // * on Valkey 9, HANDLE_ATOMIC_SLOT_MIGRATION: the module's keys move
    //   with their slot (what the move does: docs/operations.md).
    let mut options = (raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
        | raw::REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD
        | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED) as c_int;
    let valkey = ffi::valkey_version();
    let atomic_slot_migration = limits::declares_atomic_slot_migration(valkey);
    if atomic_slot_migration {
        options |= VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION;
    }
    ffi::set_module_options(ctx, options).ok_or("RedisModule_SetModuleOptions is not available")?;
    context.log_notice(&match valkey {
        Some(v) if atomic_slot_migration => format!(
            "lock: on Valkey {}: declared that the module handles atomic slot migration",
            limits::version_text(v)
        ),
        Some(v) => format!(
            "lock: on Valkey {}: atomic slot migration not declared (Valkey 9.0 and later)",
            limits::version_text(v)
        ),
        None => format!(
            "lock: on Redis {}",
            limits::version_text(ffi::server_version().unwrap_or(0))
        ),
    });
    datatype::register(ctx, events::on_unlink)?;
    gate::register(ctx, evicted::on_gate_unlinked)?;
    commands::register(ctx)?;
    timer::init(ctx, timer_run::run)?;
    blocked::init();
    propagation::init(ctx);
    events::subscribe(ctx)?;
    evicted::subscribe(ctx)?;
    events::read_server_state(ctx);
    sweep::start(ctx);
    redis_module::raw::register_info_function(ctx.as_ptr(), Some(info::info_section));
    // Without persistence no loading event comes: start the fence mark and
    // the restart delay from the module's own start.
    engine::start_serving();
    Ok(())
}

redis_module! {
    name: "lock",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: init,
    commands: [],
}
