//! The commands that only read a key: FENCE, INFO and OBSERVE.

use super::*;

pub(super) fn fence(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let token = args::parse_fence(argv.bytes())?;
    // One open: a gate answers its mark, a lock its holder's fence.
    let key = OpenKey::<Read>::open(ctx, argv.key());
    if let Some(mark) = key.as_ref().and_then(|k| guarded::gate_fence(k, token)) {
        return mark;
    }
    let store = ReadKey::of(key)?;
    let now_ms = server::mono_ms();
    Ok(
        match engine::with_engine(|n| n.fence_of(&store, token, now_ms)) {
            Some(fence) => Reply::Integer(fence),
            None => Reply::Null,
        },
    )
}

/// The holder's token is a credential (it can release and extend the lock):
/// it is shown only to users who may write the key. Others see nil. Its
/// public value is shown to every reader.
pub(super) fn info(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    args::parse_info(argv.bytes())?;
    let store = ReadKey::open(ctx, argv.key())?;
    let now = server::mono_ms();
    let key = engine::key_of(ctx, argv.key_bytes());
    let Some(held) = engine::with_engine(|n| n.info(&key, &store, now)) else {
        return Ok(Reply::Null);
    };
    Ok(Reply::Map(lock_fields(
        held,
        now,
        may_write_key(ctx, argv.key()),
    )))
}

/// `LOCK.INFO`'s fields of a held lock (`LOCK.SCAN`'s entries too).
fn lock_fields(held: Held<'_>, now: i64, show_tokens: bool) -> Vec<(&'static str, Value)> {
    let holder_fields = |held: &Lock<'_>| {
        let token = match show_tokens {
            true => Value::Bytes(held.token.to_vec()),
            false => Value::Null,
        };
        let granted = match datatype::wall_times(held) {
            (_, 0) => Value::Null,
            (_, at) => Value::Integer(at),
        };
        [
            (info_field::TOKEN, token),
            (info_field::FENCE, Value::Integer(held.fence)),
            (info_field::TTL, Value::Integer(held.remaining_ms(now))),
            (info_field::GRANTED, granted),
            (info_field::VALUE, blocked::value_of(held.value)),
        ]
    };
    // The newest holder's fields first (the only holder's when exclusive):
    // replies read by name or by position stay as they were.
    let [token, fence, ttl, granted, value] = holder_fields(&held.live[held.newest]);
    let (mode, limit) = match held.mode {
        Mode::Shared { limit } => ("shared", limit.map(i64::from)),
        Mode::Exclusive => ("exclusive", None),
    };
    let waiters = held.waiters;
    let longest_wait = held.longest_wait_ms.map_or(Value::Null, Value::Integer);
    let grants = Value::Integer(held.grants.min(i64::MAX as u64) as i64);
    let live = held.live;
    vec![
        token,
        fence,
        ttl,
        (info_field::WAITERS, Value::Integer(waiters as i64)),
        granted,
        (info_field::MODE, Value::Bytes(mode.into())),
        (info_field::LIMIT, limit.map_or(Value::Null, Value::Integer)),
        (
            info_field::HOLDERS,
            Value::Maps(live.iter().map(|l| holder_fields(l).into()).collect()),
        ),
        value,
        (info_field::LONGEST_WAIT, longest_wait),
        (info_field::GRANTS, grants),
    ]
}

/// `LOCK.SCAN cursor [MATCH pattern] [COUNT n] [WAITING]`: a page of the
/// node's lease index (`Node::scan_locks`), each candidate in the current
/// db read as `LOCK.INFO` reads it and listed if held now, its key
/// matches, the user may read it (tokens: write it) and, with `WAITING`,
/// it has waiters. O(page), whatever else the keyspace holds.
pub(super) fn scan(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let a = args::parse_scan(argv.bytes())?;
    let db = ffi::selected_db(ctx);
    let now = server::mono_ms();
    let (candidates, next) = engine::with_engine(|n| n.scan_locks(a.cursor, a.count));
    let mut entries = Vec::new();
    for (key_db, name) in candidates {
        if key_db != db || a.pattern.is_some_and(|p| !glob::matches(p, &name)) {
            continue;
        }
        let key_name = ffi::OwnedString::new(ctx, &name);
        if !ffi::may_read_key(ctx, key_name.get()) {
            continue;
        }
        // Another type now (the index's entries are hints): not a lock.
        let Ok(store) = ReadKey::open(ctx, key_name.get()) else {
            continue;
        };
        let key = (key_db, name);
        let Some(held) = engine::with_engine(|n| n.info(&key, &store, now)) else {
            continue;
        };
        if a.waiting && held.waiters == 0 {
            continue;
        }
        let mut fields = vec![(info_field::KEY, Value::Bytes(key.1.to_vec()))];
        fields.extend(lock_fields(held, now, may_write_key(ctx, key_name.get())));
        entries.push(fields);
    }
    Ok(Reply::Page(next.to_string().into_bytes(), entries))
}

/// `LOCK.OBSERVE key [AFTER fence [VALUE v]] [BLOCK timeout-ms]`: the
/// key's leader at once, or, when it is still the one seen (`AFTER`, and
/// `VALUE` with it), nil or (with `BLOCK`) the client waits to be told of
/// the next one. Reads only: on a replica too.
pub(super) fn observe(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let a = args::parse_observe(argv.bytes())?;
    let store = ReadKey::open(ctx, argv.key());
    let now = server::now();
    let key = engine::key_of(ctx, argv.key_bytes());
    let cond = engine::conditions(ctx, a.block_ms.is_some() && may_block(ctx));
    let seen = engine::with_engine(|n| {
        let store = store.as_ref().map_err(|e| e.clone());
        n.observe(&key, store, a.after, a.value, a.block_ms, cond, now)
    })?;
    drop(store);
    match seen {
        Observation::Now(leader) => Ok(blocked::leader_reply(&leader)),
        Observation::Nil => Ok(Reply::Null),
        Observation::Wait(ticket) => {
            blocked::block(ctx, |n, client| n.start_observing(ticket, client))
        }
    }
}
