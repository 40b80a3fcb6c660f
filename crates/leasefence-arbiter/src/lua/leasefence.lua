#!lua name=leasefence

-- leasefence fenced commands for Redis 7+ (Functions). Library version 1.
--
-- Every fenced function takes
--   KEYS[1] = the fence key 'leasefence:fence:{RESOURCE}' (the braces make the
--             resource a cluster hash tag: put '{RESOURCE}' in your data keys too)
--   ARGV[1] = the token, decimal, 1..18446744073709551615 (compared as decimal
--             strings, exact for every u64: Lua numbers are doubles)
--   ARGV[2] = 'strict' (last < token) or 'monotonic' (last <= token)
-- A stale call changes nothing and fails with
--   -STALE <presented> <current> <resource>
-- Invalid arguments fail with -LFINVALID <reason>.
--
-- Order inside a call: read and check the fence, apply the command, then record
-- the token. If the command itself fails (WRONGTYPE, a bad stream ID) the call
-- aborts before the fence is written, so the command and the fence happen
-- together or not at all. Functions run atomically.

local VERSION = '1'
local U64_MAX = '18446744073709551615'
local PREFIX = 'leasefence:fence:{'

local function valid_token(s)
    if type(s) ~= 'string' or not string.match(s, '^[1-9][0-9]*$') then
        return false
    end
    return #s < #U64_MAX or (#s == #U64_MAX and s <= U64_MAX)
end

-- a < b for canonical decimal strings (no sign, no leading zeros).
local function less(a, b)
    if #a ~= #b then
        return #a < #b
    end
    return a < b
end

local function invalid(reason)
    return redis.error_reply('LFINVALID ' .. reason)
end

-- Returns an error reply when the call must not proceed, nil when admitted.
local function check(keys, args, nkeys_min, nargs_ok, usage)
    if #keys < nkeys_min or not nargs_ok(#args) then
        return invalid('usage: ' .. usage)
    end
    local fence_key, token, mode = keys[1], args[1], args[2]
    if string.sub(fence_key, 1, #PREFIX) ~= PREFIX or string.sub(fence_key, -1) ~= '}' or #fence_key <= #PREFIX + 1 then
        return invalid('KEYS[1] must be the fence key leasefence:fence:{RESOURCE}')
    end
    if not valid_token(token) then
        return invalid('token must be a decimal integer in 1..' .. U64_MAX)
    end
    if mode ~= 'strict' and mode ~= 'monotonic' then
        return invalid("mode must be 'strict' or 'monotonic'")
    end
    local current = redis.call('GET', fence_key)
    if current then
        if not valid_token(current) then
            return redis.error_reply('LFCORRUPT fence key ' .. fence_key .. ' holds a non-token value')
        end
        local ok
        if mode == 'strict' then
            ok = less(current, token)
        else
            ok = not less(token, current)
        end
        if not ok then
            local resource = string.sub(fence_key, #PREFIX + 1, -2)
            return redis.error_reply('STALE ' .. token .. ' ' .. current .. ' ' .. resource)
        end
    end
    return nil
end

local function record(keys, args)
    redis.call('SET', keys[1], args[1])
end

-- FCALL leasefence_set 2 FENCE KEY TOKEN MODE VALUE  -> OK
local function fenced_set(keys, args)
    local err = check(keys, args, 2, function(n) return n == 3 end, 'FCALL leasefence_set 2 FENCE KEY TOKEN MODE VALUE')
    if err then return err end
    local reply = redis.call('SET', keys[2], args[3])
    record(keys, args)
    return reply
end

-- FCALL leasefence_del N+1 FENCE KEY... TOKEN MODE  -> number of keys removed
local function fenced_del(keys, args)
    local err = check(keys, args, 2, function(n) return n == 2 end, 'FCALL leasefence_del N+1 FENCE KEY [KEY...] TOKEN MODE')
    if err then return err end
    local reply = redis.call('DEL', unpack(keys, 2))
    record(keys, args)
    return reply
end

-- FCALL leasefence_hset 2 FENCE KEY TOKEN MODE FIELD VALUE [FIELD VALUE...]  -> fields added
local function fenced_hset(keys, args)
    local usage = 'FCALL leasefence_hset 2 FENCE KEY TOKEN MODE FIELD VALUE [FIELD VALUE...]'
    local err = check(keys, args, 2, function(n) return n >= 4 and n % 2 == 0 end, usage)
    if err then return err end
    local reply = redis.call('HSET', keys[2], unpack(args, 3))
    record(keys, args)
    return reply
end

-- FCALL leasefence_xadd 2 FENCE STREAM TOKEN MODE ID FIELD VALUE [FIELD VALUE...]  -> entry id
local function fenced_xadd(keys, args)
    local usage = 'FCALL leasefence_xadd 2 FENCE STREAM TOKEN MODE ID FIELD VALUE [FIELD VALUE...]'
    local err = check(keys, args, 2, function(n) return n >= 5 and n % 2 == 1 end, usage)
    if err then return err end
    local reply = redis.call('XADD', keys[2], unpack(args, 3))
    record(keys, args)
    return reply
end

redis.register_function('leasefence_set', fenced_set)
redis.register_function('leasefence_del', fenced_del)
redis.register_function('leasefence_hset', fenced_hset)
redis.register_function('leasefence_xadd', fenced_xadd)
redis.register_function{
    function_name = 'leasefence_version',
    callback = function() return VERSION end,
    flags = { 'no-writes' },
}
