//! Module registration: name, options, data type, commands, events, INFO.
//! Compiled out of unit tests, which run without Redis (and without Redis's
//! allocator).

use redis_module::configuration::ConfigurationFlags;
use redis_module::{redis_module, Context, RedisString, Status};

use crate::redis::{blocking, commands, datatype, info, node, propagation};

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    let raw_ctx = ctx.ctx;
    if let Err(e) = datatype::register(raw_ctx) {
        ctx.log_warning(&format!("lock: {e}"));
        return Status::Err;
    }
    if let Err(e) = commands::register(raw_ctx) {
        ctx.log_warning(&format!("lock: {e}"));
        return Status::Err;
    }
    if let Err(e) = blocking::init(raw_ctx) {
        ctx.log_warning(&format!("lock: {e}"));
        return Status::Err;
    }
    if let Err(e) = propagation::init(raw_ctx) {
        ctx.log_warning(&format!("lock: {e}"));
        return Status::Err;
    }
    if let Err(e) = node::subscribe_to_server_events(raw_ctx) {
        ctx.log_warning(&format!("lock: {e}"));
        return Status::Err;
    }
    redis_module::raw::register_info_function(raw_ctx, Some(info::info_section));
    // Without persistence no loading event comes: start the fence mark and
    // the restart delay from the module's own start.
    node::start_serving_as_master();
    Status::Ok
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
