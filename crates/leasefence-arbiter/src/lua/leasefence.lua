#!lua name=leasefence

-- leasefence fenced commands for Redis 7+ (Functions). Library version 4.
--
-- Every fenced function takes
--   KEYS[1] = the fence key 'leasefence:fence:{RESOURCE}' (the braces make the
--             resource a cluster hash tag: put '{RESOURCE}' in your data keys too)
--   ARGV[1] = the token, decimal, 1..18446744073709551615 (compared as decimal
--             strings, exact for every u64: Lua numbers are doubles)
--   ARGV[2] = 'strict' (last < token) or 'monotonic' (last <= token)
-- A stale call changes nothing and fails with
--   -STALE <presented> <current> <resource>
-- Invalid arguments fail with -LFINVALID <reason>, and so does a call whose
-- command would write any key under the fence-key prefix 'leasefence:fence:'
-- as data: its own fence key (the effect and the token would overwrite each
-- other) or another resource's (a holder of 'a' could reset the fence of 'b'
-- and let b's stale writers through; in a cluster, the fence key of 'b}x'
-- shares the slot of b's). Every fence key starts with the prefix, so keys
-- that only contain it later on are ordinary keys.
--
-- A call whose command writes nothing records no fence: XADD ... NOMKSTREAM
-- on a missing stream replies nil and leaves the token unused. SET's NX, XX
-- and GET are refused instead (see SET_EXPIRY). DEL records the token even
-- when no key existed: its effect is that the keys are absent, which a stale
-- SET must not undo.
--
-- Order inside a call: read and check the fence, apply the command, then record
-- the token. If the command itself fails (WRONGTYPE, a bad stream ID) the call
-- aborts before the fence is written, so the command and the fence happen
-- together or not at all. Functions run atomically. leasefence_set writes the
-- value and the token with one MSET (SET cannot fail on a key's type).
--
-- Cost: every C function called from Lua (string.find, redis.call, ...) costs
-- server time on every fenced call, so the checks use one string.find each and
-- leasefence_set makes two redis.call (version 1 made three, with more string
-- work: 2.3-2.5 µs of server time per fenced SET in INFO commandstats, version
-- 2 about 1.95 µs, against 0.15 µs for a plain SET).

local VERSION = '4'
local FENCE_PREFIX = 'leasefence:fence:'
local U64_MAX = '18446744073709551615'

-- A canonical u64 decimal: no sign, no leading zero, at most U64_MAX.
local function valid_token(s)
    local n = #s
    if n > 20 or not string.find(s, '^[1-9]%d*$') then
        return false
    end
    return n < 20 or s <= U64_MAX
end

local function invalid(reason)
    return redis.error_reply('LFINVALID ' .. reason)
end

-- Returns an error reply when the call must not proceed, nil when admitted.
-- The caller has checked how many keys and arguments it got.
local function check(keys, args)
    local fence_key, token, mode = keys[1], args[1], args[2]
    if not string.find(fence_key, '^leasefence:fence:{.+}$') then
        return invalid('KEYS[1] must be the fence key leasefence:fence:{RESOURCE}')
    end
    if not valid_token(token) then
        return invalid('token must be a decimal integer in 1..' .. U64_MAX)
    end
    local strict = mode == 'strict'
    if not strict and mode ~= 'monotonic' then
        return invalid("mode must be 'strict' or 'monotonic'")
    end
    for i = 2, #keys do
        if string.sub(keys[i], 1, 17) == FENCE_PREFIX then
            return invalid('data keys must not start with ' .. FENCE_PREFIX .. ' (the prefix of fence keys)')
        end
    end
    local current = redis.call('GET', fence_key)
    if current then
        if not valid_token(current) then
            return redis.error_reply('LFCORRUPT fence key ' .. fence_key .. ' holds a non-token value')
        end
        -- Canonical decimals order by length, then as strings.
        local nc, nt = #current, #token
        local ok
        if nc ~= nt then
            ok = nc < nt
        elseif strict then
            ok = current < token
        else
            ok = current <= token
        end
        if not ok then
            -- The resource is the text between 'leasefence:fence:{' and '}'.
            local resource = string.sub(fence_key, 19, -2)
            return redis.error_reply('STALE ' .. token .. ' ' .. current .. ' ' .. resource)
        end
    end
    return nil
end

-- The expiry options a fenced SET accepts, and whether each takes a number.
-- NX, XX and GET are left out: they make SET conditional or change its reply,
-- and the fence would be recorded for a write that did not happen.
local SET_EXPIRY = { EX = true, PX = true, EXAT = true, PXAT = true, KEEPTTL = false }
local SET_USAGE = 'usage: FCALL leasefence_set 2 FENCE KEY TOKEN MODE VALUE [EX s | PX ms | EXAT t | PXAT t | KEEPTTL]'

-- FCALL leasefence_set 2 FENCE KEY TOKEN MODE VALUE [expiry]  -> OK
local function fenced_set(keys, args)
    local n = #args
    if #keys ~= 2 or n < 3 or n > 5 then
        return invalid(SET_USAGE)
    end
    local err = check(keys, args)
    if err then return err end
    if n == 3 then
        return redis.call('MSET', keys[2], args[3], keys[1], args[1])
    end
    local option = string.upper(args[4])
    local takes_number = SET_EXPIRY[option]
    if takes_number == nil or (takes_number and n ~= 5) or (not takes_number and n ~= 4) then
        return invalid(SET_USAGE)
    end
    -- SET refuses a bad expiry itself (the call then aborts before the fence
    -- is written).
    local reply = redis.call('SET', keys[2], args[3], unpack(args, 4))
    redis.call('SET', keys[1], args[1])
    return reply
end

-- FCALL leasefence_del N+1 FENCE KEY... TOKEN MODE  -> number of keys removed
local function fenced_del(keys, args)
    if #keys < 2 or #args ~= 2 then
        return invalid('usage: FCALL leasefence_del N+1 FENCE KEY [KEY...] TOKEN MODE')
    end
    local err = check(keys, args)
    if err then return err end
    local reply = redis.call('DEL', unpack(keys, 2))
    redis.call('SET', keys[1], args[1])
    return reply
end

-- FCALL leasefence_hset 2 FENCE KEY TOKEN MODE FIELD VALUE [FIELD VALUE...]  -> fields added
local function fenced_hset(keys, args)
    if #keys ~= 2 or #args < 4 or #args % 2 ~= 0 then
        return invalid('usage: FCALL leasefence_hset 2 FENCE KEY TOKEN MODE FIELD VALUE [FIELD VALUE...]')
    end
    local err = check(keys, args)
    if err then return err end
    local reply = redis.call('HSET', keys[2], unpack(args, 3))
    redis.call('SET', keys[1], args[1])
    return reply
end

-- FCALL leasefence_xadd 2 FENCE STREAM TOKEN MODE [OPTIONS] ID FIELD VALUE [FIELD VALUE...]
--   -> entry id, or nil (and no fence) when NOMKSTREAM found no stream
-- OPTIONS are XADD's own (NOMKSTREAM, MAXLEN/MINID [=|~] n [LIMIT n]); XADD
-- checks them and the field count.
local function fenced_xadd(keys, args)
    if #keys ~= 2 or #args < 5 then
        return invalid('usage: FCALL leasefence_xadd 2 FENCE STREAM TOKEN MODE [OPTIONS] ID FIELD VALUE [FIELD VALUE...]')
    end
    local err = check(keys, args)
    if err then return err end
    local reply = redis.call('XADD', keys[2], unpack(args, 3))
    if not reply then
        -- NOMKSTREAM and no stream: nothing was written, so no token either.
        return reply
    end
    redis.call('SET', keys[1], args[1])
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
