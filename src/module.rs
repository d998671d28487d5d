//! Module registration: name, options, data type, commands, events, INFO.
//! Compiled out of unit tests, which run without Redis (and without Redis's
//! allocator).

use redis_module::configuration::ConfigurationFlags;
use redis_module::raw::RedisModuleCtx;
use redis_module::{redis_module, Context, RedisString, Status};

use crate::redis::{blocking, commands, datatype, info, node, propagation};

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    match start(ctx.ctx) {
        Ok(()) => Status::Ok,
        Err(e) => {
            ctx.log_warning(&format!("lock: {e}"));
            Status::Err
        }
    }
}

fn start(ctx: *mut RedisModuleCtx) -> Result<(), String> {
    datatype::register(ctx)?;
    commands::register(ctx)?;
    blocking::init(ctx)?;
    propagation::init(ctx)?;
    node::subscribe_to_server_events(ctx)?;
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
            ["restart-delay-ms", &node::RESTART_DELAY_MS, 0, 0, i64::MAX, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [],
        enum: [],
        module_args_as_configuration: true,
    ]
}
