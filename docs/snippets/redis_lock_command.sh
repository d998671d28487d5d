# The redis-lock command (cargo install --path client) runs a program under
# a lock, renewing it meanwhile, with the fencing token in its environment.
redis-lock run --url "$REDIS_URL" --key job:nightly --ttl 30s --wait 10s -- \
  sh -c 'echo "nightly job runs with fence $REDIS_LOCK_FENCE"'

# Or hold a lock across the steps of a script:
eval "$(redis-lock acquire --url "$REDIS_URL" --key job:nightly --ttl 30s)"
echo "step 1 with fence $REDIS_LOCK_FENCE"
redis-lock extend --url "$REDIS_URL" --key job:nightly --token "$REDIS_LOCK_TOKEN" --ttl 30s && echo extended
redis-lock release --url "$REDIS_URL" --key job:nightly --token "$REDIS_LOCK_TOKEN" && echo released
